"""The memory planner: real parameter counts, exact LoRA/optimizer bytes, activation terms against
measurements on real blocks, monotone swapping, the auto choice, and the CLI table."""

import dataclasses

import pytest
import torch

from conftest import measured_step_peak, planned_step_peak

from trainer_core.core.config import LoraConfig, OptimizerConfig, choices
from trainer_core.devtools.memprobe import probe_block
from trainer_core.devtools.random_weights import random_transformer
from trainer_core.adapters.lora import inject_lora, remove_lora
from trainer_core.models.qwen_arch import LORA_TARGET_PRESETS
from trainer_core.training.optim import build_optimizer
from trainer_core.training.optim import optimizer_state_bytes as measured_state_bytes
from trainer_core.planner import (
    GIB, PlanInputs, arch_from_transformer, auto_blocks_to_swap, plan_memory, real_arch, render_plan,
)
from trainer_core.planner.activations import ActivationSettings, block_saved_bytes, block_working_bytes
from trainer_core.planner.plan import lora_tensor_shapes, lora_tensor_sizes, optimizer_state_bytes

# A narrow but real Qwen-Image transformer: 2 heads x 128 (D = 256, F = 1024), the real joint dim and
# channels. Two blocks, so block 0 is not the last one (whose text-stream modules get no LoRA).
NARROW = dict(num_layers=2, num_attention_heads=2)


@pytest.fixture(scope="module")
def narrow():
    return random_transformer(NARROW, storage="float8")


def with_lora(model, **lora):
    remove_lora(model)
    model.requires_grad_(False)
    params = inject_lora(model, LoraConfig(**{"rank": 4, "alpha": 4.0, **lora}), seed=0)
    with torch.no_grad():  # B = 0 at init would make some gradients exactly zero; any values do here
        for p in params:
            p.normal_(0, 0.01)
    model.train()
    return params


# ---------------------------------------------------------------------------------------------------
# parameters and weights


def test_real_model_parameter_counts():
    arch = real_arch()
    assert arch.num_blocks == 60 and arch.dim == 3072 and arch.mlp_dim == 12288 and arch.heads == 24
    assert arch.total_params == 20_430_401_088  # DESIGN §9: 20.43B
    assert arch.block_params == 339_831_296  # ~340M per block
    assert len(arch.block_linears) == 14
    plan = plan_memory(PlanInputs())
    linears = plan.term("frozen block Linears")
    assert linears == 60 * arch.block_linear_weight_params  # float8: 1 byte per parameter
    assert round(linears / GIB, 2) == 18.98
    # With biases, norms and the layers outside the blocks in bf16 the model takes 19.07 GiB. DESIGN §9's
    # "19.03 GiB" is every parameter at one byte; its "38.05 GiB in bf16" is every parameter at two.
    assert round((linears + plan.term("biases")) / GIB, 2) == 19.07
    assert round(arch.total_params / GIB, 2) == 19.03 and round(2 * arch.total_params / GIB, 2) == 38.05
    # Each swapped block frees one block's Linear weights (~0.34 GB in float8, DESIGN §7).
    swapped = plan_memory(PlanInputs(blocks_to_swap=10))
    assert plan.term("frozen block Linears") - swapped.term("frozen block Linears") == 10 * arch.block_linear_weight_params
    assert round(arch.block_linear_weight_params / 1e9, 2) == 0.34


def test_arch_counts_equal_a_real_model(narrow):
    arch = arch_from_transformer(narrow)
    assert arch.total_params == sum(p.numel() for p in narrow.parameters())
    assert arch.num_blocks * arch.block_linear_weight_params == sum(
        m.weight.numel() for m in narrow.transformer_blocks.modules() if isinstance(m, torch.nn.Linear))


@pytest.mark.parametrize("storage", ["float8", "float8_scaled", "bfloat16"])
def test_weight_terms_equal_the_stored_tensors(storage):
    from trainer_core.models.float8 import block_linear_bytes

    model = random_transformer(NARROW, storage=storage)
    arch = arch_from_transformer(model)
    plan = plan_memory(PlanInputs(storage=storage, device="cpu"), arch)
    stored = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    tables = model.pos_embed.pos_freqs, model.pos_embed.neg_freqs
    stored += sum(t.numel() * t.element_size() for t in tables)
    planned = plan.term("frozen block Linears") + plan.term("row scales") + plan.term("biases")
    assert planned == stored
    bias_bytes = arch.num_blocks * arch.block_linear_bias_params * 2
    assert plan.term("frozen block Linears") + plan.term("row scales") + bias_bytes == block_linear_bytes(model)


@pytest.mark.parametrize("targets", list(LORA_TARGET_PRESETS))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_lora_and_optimizer_bytes_are_exact(narrow, targets, dtype):
    """LoRA sizes from the planner equal the injected adapter; every optimizer's state equals what one real
    step allocates (bitsandbytes' shared quantisation maps counted once; optimi's Kahan buffer for bf16 only)."""
    params = with_lora(narrow, rank=8, targets=targets, dtype=dtype)
    arch = arch_from_transformer(narrow)
    sizes = [numel for _, numel in lora_tensor_sizes(arch, targets, 8)]
    shapes = lora_tensor_shapes(arch, targets, 8)
    assert [r * c for r, c in shapes] == sizes
    assert sorted(shapes) == sorted(tuple(p.shape) for p in params)
    if targets != "attention":  # the MLP's 1024-wide side puts tensors on both sides of bitsandbytes' 4096
        assert any(n >= 4096 for n in sizes) and any(n < 4096 for n in sizes)
    for name in choices(OptimizerConfig, "optimizer"):
        opt = build_optimizer(params, OptimizerConfig(optimizer=name, learning_rate=1.0 if name == "prodigy" else 1e-4))
        for p in params:
            p.grad = torch.ones_like(p)
        opt.step()
        assert measured_state_bytes(opt) == optimizer_state_bytes(shapes, name, p.element_size()), name
        for p in params:
            p.grad = None
    # 8-bit state is ~1/4 of AdamW's for large tensors (DESIGN §9: 522 KiB vs 2048 KiB for 4096 x 64).
    assert optimizer_state_bytes([(4096, 64)], "adamw8bit", 4) == 522 * 1024  # 512 + 8 absmax + 2 maps
    assert optimizer_state_bytes([(4096, 64)], "adamw", 4) == 2048 * 1024 + 4


# ---------------------------------------------------------------------------------------------------
# activations, measured on real blocks


@pytest.mark.parametrize("targets", list(LORA_TARGET_PRESETS))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_saved_activations_equal_the_measurement_exactly(narrow, targets, dtype, dropout):
    with_lora(narrow, targets=targets, dtype=dtype, dropout=dropout)
    arch = arch_from_transformer(narrow)
    s = ActivationSettings(preset=targets, rank=4, lora_bytes=4 if dtype == "float32" else 2, dropout=dropout > 0,
                           cuda=False)
    for batch, grid, text in [(1, (4, 4), 8), (2, (3, 5), 7)]:
        measured = probe_block(narrow, batch, grid, text, checkpointing=False).saved_bytes
        assert block_saved_bytes(arch, s, batch, grid[0] * grid[1], text) == measured


def test_block_peak_matches_the_measurement(narrow):
    """Saved (exact) + working (per-token ratio measured at 4 heads) against one block measured at 2
    heads. Tolerance 2%: the working ratio is a fit of a maximum over backward phases, and the rank's
    share of the per-token bytes differs between widths (rank 4 at D = 256 here)."""
    with_lora(narrow, targets="attention+mlp")
    arch = arch_from_transformer(narrow)
    for checkpointing in (True, False):
        s = ActivationSettings(preset="attention+mlp", rank=4, lora_bytes=4, dropout=False, cuda=False,
                               checkpointing=checkpointing)
        probe = probe_block(narrow, 1, (64, 64), 256, checkpointing=checkpointing)
        planned = block_saved_bytes(arch, s, 1, 4096, 256) + block_working_bytes(arch, s, 1, 4096, 256)
        assert planned == pytest.approx(probe.peak_bytes, rel=0.02)


@pytest.mark.parametrize("checkpointing", [True, False])
def test_whole_model_step_peak_matches_the_plan(checkpointing):
    """A training forward + backward of a 4-block narrow model through BlockRunner (2 blocks swapped),
    measured by `LiveBytes`, against the planner's activation, gradient and upcast terms. Tolerance 3%:
    the working term is fitted (see above), the rest is exact or a direct count."""
    model = random_transformer(dict(NARROW, num_layers=4), storage="float8")
    with_lora(model, targets="attention+mlp")
    measured = measured_step_peak(model, 32, 64, checkpointing)
    assert planned_step_peak(model, 32, 64, checkpointing) == pytest.approx(measured, rel=0.03)


# ---------------------------------------------------------------------------------------------------
# swapping and the auto choice


def test_more_swapping_means_less_gpu_and_more_host_ram():
    plans = [plan_memory(PlanInputs(blocks_to_swap=k)) for k in range(60)]
    gpu = [p.gpu_total for p in plans]
    host = [p.host_training_total for p in plans]
    # The swapper keeps one GPU slot per swapped block, at most the ring depth (2 by default): 1 or 2 swapped blocks cost the same as
    # none, and from there every further block saves exactly one block's weights.
    for k in (1, 2):
        assert plans[k].term("frozen block Linears") + plans[k].term("swap slots") == plans[0].term("frozen block Linears")
    assert all(a > b for a, b in zip(gpu[2:], gpu[3:]))
    # Host RAM grows by whole power-of-two chunks of the pinned arena, each holding up to three block blobs of 324 MiB
    # (streaming.arena.blob_chunks), so neighbouring counts may need the same; the chunks' unused room stays within
    # 6% of the masters and one 512 MiB chunk (pinning tensor by tensor would round 29 blocks up by 5.3 GiB).
    assert all(a <= b for a, b in zip(host, host[1:])) and host[0] < host[3] < host[6] < host[-1]
    assert all(p.term("pinned arena slack") <= 0.06 * p.term("CPU master of swapped blocks") + GIB // 2 for p in plans)
    assert "saves nothing" in plans[1].notes[0]


@pytest.mark.parametrize("budget_gib", [24, 16, 12])
def test_auto_picks_the_smallest_swap_count_that_fits(budget_gib):
    """The GPU peak that must fit is the largest of the phases after caching (training, previews, ...)."""
    from trainer_core.planner.phases import gpu_peak_after_caching

    inputs = PlanInputs(width=1024, height=1024, rank=32)
    choice = auto_blocks_to_swap(inputs, budget_gib * GIB)
    assert choice.fits
    k = choice.blocks_to_swap
    peak = lambda j: gpu_peak_after_caching(plan_memory(dataclasses.replace(inputs, blocks_to_swap=j)),  # noqa: E731
                                            gpu_budget_bytes=budget_gib * GIB)  # previews decode in tiles where they must
    assert choice.plan.gpu_total <= peak(k) <= budget_gib * GIB
    assert all(peak(j) > budget_gib * GIB for j in range(k))


@pytest.mark.parametrize("arch_name, settings", [
    ("real_arch", dict(ring_depth=2)), ("real_arch", dict(ring_depth=3, checkpointing=False, rank=64)),
    ("real_arch21", dict(ring_depth=1, width=1328, height=1328)),
])
def test_the_swap_search_finds_what_trying_every_count_finds(arch_name, settings):
    """auto_blocks_to_swap tries the counts up to the ring depth one by one and bisects past it: at budgets on and
    either side of the planned peaks of the counts around the ring depth and of every fifth count after (each
    budget costs a search), the same count (or none) as trying every count in turn."""
    from trainer_core.families.qwen_image21.plan import real_arch21
    from trainer_core.planner.arch import real_arch
    from trainer_core.planner.phases import gpu_peak_after_caching

    arch = {"real_arch": real_arch, "real_arch21": real_arch21}[arch_name]()
    inputs = PlanInputs(**settings)
    peaks = [gpu_peak_after_caching(plan_memory(dataclasses.replace(inputs, blocks_to_swap=k), arch), arch)
             for k in range(arch.num_blocks)]
    counts = [*range(inputs.ring_depth + 3), *range(inputs.ring_depth + 3, arch.num_blocks, 5), arch.num_blocks - 1]
    plans = [plan_memory(dataclasses.replace(inputs, blocks_to_swap=k), arch) for k in range(arch.num_blocks)]
    for budget in sorted({peaks[k] + d for k in counts for d in (-1, 0, 1)}):
        # within a budget previews decode in tiles where they must: the peak a count needs depends on the budget
        fewest = next((k for k, plan in enumerate(plans) if gpu_peak_after_caching(plan, arch, None, budget) <= budget),
                      None)
        choice = auto_blocks_to_swap(inputs, budget, arch)
        assert choice.blocks_to_swap == fewest, (budget, choice.blocks_to_swap, fewest)
        assert choice.plan.inputs.blocks_to_swap == (arch.num_blocks - 1 if fewest is None else fewest)


def test_auto_says_what_to_change_when_nothing_fits():
    inputs = PlanInputs(width=1024, height=1024, rank=32, checkpointing=False)
    choice = auto_blocks_to_swap(inputs, 8 * GIB)
    assert not choice.fits and choice.blocks_to_swap is None
    assert choice.plan.inputs.blocks_to_swap == 59
    text = "\n".join(choice.advice)
    assert "Nothing fits in 8.0 GiB" in text and "enable gradient checkpointing" in text
    assert auto_blocks_to_swap(dataclasses.replace(inputs, checkpointing=True), 8 * GIB).fits
    hopeless = auto_blocks_to_swap(PlanInputs(), 2 * GIB)
    assert not hopeless.fits and "no single change fits" in hopeless.advice[-1]


def test_render_plan_lists_every_term():
    plan = plan_memory(PlanInputs(blocks_to_swap=16))
    text = render_plan(plan, budget_bytes=16 * GIB)
    for term in plan.gpu + plan.host_training:
        assert term.name in text
    assert f"{plan.gpu_total / GIB:.2f} GiB" in text and "fit" in text


def test_cli_plan_prints_the_table(capsys):
    from trainer_core.runs.cli import main

    assert main(["plan", "--resolution", "1024", "--rank", "32", "--budget-gb", "16"]) == 0
    out = capsys.readouterr().out
    k = auto_blocks_to_swap(PlanInputs(rank=32), 16 * GIB).blocks_to_swap
    assert f"blocks_to_swap = {k}" in out and "GPU at the training peak" in out and "Host RAM" in out
    assert main(["plan", "--resolution", "768", "--rank", "16", "--blocks-to-swap", "20", "--no-checkpointing",
                 "--optimizer", "adamw", "--targets", "attention", "--batch", "2"]) == 0
    out = capsys.readouterr().out
    assert "768x768, batch 2" in out and "checkpointing off" in out and "blocks_to_swap 20" in out


def test_plan_for_loaded_components_while_training(demo_folder, tmp_path):
    """The node side plans from the model set it holds: the numbers read off the live tiny model (LoRA
    injected, one block swapped) equal those of a fresh one, and its VAE's scale factor is used."""
    from conftest import cached_demo
    from trainer_core.core.config import TrainConfig
    from trainer_core.planner import arch_for_components
    from trainer_core.families.qwen_image import build_tiny_components
    from trainer_core.training import Trainer

    fresh = arch_for_components(build_tiny_components(storage="float8"))
    components = build_tiny_components(storage="float8")
    cached = cached_demo(components, demo_folder, tmp_path)
    trainer = Trainer(components, cached, LoraConfig(rank=4, alpha=4.0), OptimizerConfig(),
                      TrainConfig(blocks_to_swap=1, gradient_checkpointing=True))
    live = arch_for_components(components)
    assert live == fresh and live.vae_scale_factor == 4 and live.image_tokens(64, 64) == 64
    inputs = PlanInputs.from_configs(trainer.lora_cfg, trainer.optim_cfg, trainer.train_cfg, width=64, height=64,
                                     storage=components.storage, device="cpu", compute_dtype="bfloat16")
    assert plan_memory(inputs, live).term("swap slots") > 0
    trainer.close()


def test_a_run_is_planned_at_its_largest_bucket_and_longest_caption(tiny, demo_folder, tmp_path):
    from conftest import cached_demo
    from trainer_core.core.config import LoraConfig, OptimizerConfig, TrainConfig
    from trainer_core.planner import inputs_for_run

    cached = cached_demo(tiny, demo_folder, tmp_path)
    inputs = inputs_for_run(tiny, cached, LoraConfig(rank=8), OptimizerConfig(), TrainConfig(micro_batch_size=2))
    assert (inputs.width, inputs.height) == (64, 64)  # buckets 64x64 and 96x32: the larger area
    assert inputs.text_tokens == max(cached.embedding(s.text_key).shape[0] for s in cached.samples)
    assert (inputs.rank, inputs.batch, inputs.dataset_images, inputs.device) == (8, 2, 8, "cpu")
