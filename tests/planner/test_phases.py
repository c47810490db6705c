"""The memory plan per phase (load, cache, init, train, preview, save), GPU and host RAM: exact relations
between the phases, the text encoder's precision, the refusal before anything is loaded and what it names,
the `plan` command with --ram-gb, and Init Trainer refusing on a real tiny run."""

import dataclasses

import pytest
import torch

from trainer_core.core.errors import UserInputError
from trainer_core.planner import GIB, PlanInputs, check_run, plan_memory, plan_phases, refuse_if_unfit
from trainer_core.planner.arch import real_arch
from trainer_core.planner.inference import device_decode_bytes, real_parts, vae_decode_bytes, vae_encode_bytes
from trainer_core.planner.plan import block_blob
from trainer_core.planner.measured_terms import CUDA_PROCESS_BASELINE_BYTES, PROCESS_BASELINE_BYTES, SAVE_RESIDUE_BYTES
from trainer_core.streaming.arena import blob_chunks
from trainer_core.planner.phases import (
    AFTER_CACHING, HOST_RESERVE_BYTES, PHASES, STATE_TERMS, choose_text_encoder_storage, fewest_swapped_fitting,
)
from trainer_core.core.host_memory import host_ram_bytes


def allocated(phase) -> int:
    """A phase's GPU bytes before allocator slack and the CUDA context."""
    return sum(t.bytes for t in phase.gpu if t.name not in ("allocator slack", "CUDA context"))


def term(terms, name) -> int:
    found = [t.bytes for t in terms if t.name.startswith(name)]
    assert len(found) <= 1, name
    return found[0] if found else 0


def test_caching_holds_no_transformer_and_does_not_depend_on_training_settings():
    base = plan_phases(PlanInputs(blocks_to_swap=0, text_encoder_storage="bfloat16"))
    other = plan_phases(PlanInputs(blocks_to_swap=40, rank=4, storage="bfloat16", text_encoder_storage="bfloat16"))
    cache = base.phases["cache"]
    assert cache.gpu_bytes == other.phases["cache"].gpu_bytes and cache.host_bytes == other.phases["cache"].host_bytes
    names = {t.name for t in cache.gpu}
    assert not names & set(STATE_TERMS) and not any("block" in n or "LoRA" in n for n in names)
    # Text encoder and VAE one after the other: the phase is the larger step, not their sum.
    parts = real_parts()
    assert term(cache.gpu, "text encoder weights") == parts.text_encoder_params * 2 and term(cache.gpu, "VAE") == 0
    assert base.phases["load"].gpu_bytes == 0


def test_float8_text_encoder_halves_its_linears_and_auto_keeps_it_only_when_bf16_does_not_fit():
    parts = real_parts()
    bf16 = plan_phases(PlanInputs(text_encoder_storage="bfloat16")).phases["cache"]
    fp8 = plan_phases(PlanInputs(text_encoder_storage="float8")).phases["cache"]
    assert term(bf16.gpu, "text encoder weights") - term(fp8.gpu, "text encoder weights") == parts.text_encoder_linear_params
    assert term(fp8.gpu, "largest weight upcast") > 0 == term(bf16.gpu, "largest weight upcast")
    auto = PlanInputs(text_encoder_storage="auto")
    for budget_gib, expected in ((24, "bfloat16"), (16, "bfloat16"), (12, "float8"), (8, "float8")):
        assert choose_text_encoder_storage(auto, budget_gib * GIB) == expected
        assert (bf16.gpu_bytes <= budget_gib * GIB) == (expected == "bfloat16")
    assert choose_text_encoder_storage(auto, None) == "bfloat16"  # nothing to fit
    assert choose_text_encoder_storage(dataclasses.replace(auto, text_encoder_file_fp8=False), 8 * GIB) == "bfloat16"
    assert plan_phases(auto, gpu_budget_bytes=12 * GIB).inputs.text_encoder_storage == "float8"


def test_init_train_preview_and_save_share_the_training_state():
    plan = plan_phases(PlanInputs(rank=32, blocks_to_swap=20))
    state = sum(t.bytes for t in plan.training.gpu if t.name in STATE_TERMS)
    init, train, preview, save = (plan.phases[n] for n in AFTER_CACHING)
    assert allocated(train) == sum(t.bytes for t in plan.training.gpu) - term(train.gpu, "allocator slack") \
        - term(train.gpu, "CUDA context")
    assert train.gpu_bytes == plan.training.gpu_total
    # The optimizer state exists from the first step on; init streams one tensor on top of the weights.
    assert allocated(init) == state - plan.training.term("optimizer state") + term(init.gpu, "tensor in flight")
    # a save on CUDA also holds its measured residue (planner/measured_terms.py)
    assert allocated(save) == state + SAVE_RESIDUE_BYTES == state + term(save.gpu, "save residue")
    vae = term(preview.gpu, "VAE on the device")
    working = term(preview.gpu, "preview ")
    assert vae == real_parts().vae_params * 2 and working > 0
    assert allocated(preview) == state + vae + working
    # At the nodes' defaults (1024 x 1024 previews with CFG) a preview needs more GPU than a training step:
    # the VAE's decode (3.4 GiB; its bytes against a measurement below) outweighs the denoising step and the
    # activations that checkpointing keeps.
    assert [t.name for t in preview.gpu if t.name.startswith("preview ")] == ["preview VAE decode at 1024x1024"]
    assert preview.gpu_bytes > train.gpu_bytes


def test_vae_encode_and_decode_terms_equal_the_real_vaes_measured_peaks():
    """The VAE encode of the caching phase and the VAE decode of the preview phase against the real Qwen-Image VAE (diffusers'
    `AutoencoderKLQwenImage` with its defaults, random weights) on one 96 px frame: the peak of live bytes
    above the inputs (`LiveBytes`), measured here, within 1% (measured: the plan 0.4-0.5% under it at 96 px,
    0.2% at 128 px, 1.1% at 64 px, where the borders weigh more; the planner's bytes per pixel come from larger
    frames, tools/calibrate_preview.py).

    Measured in float32 and halved for the plan's bf16: every tensor the VAE's forward keeps alive has the
    weights' dtype, so the peak scales with the element size, and the CPU's bf16 3-D convolutions have no fast
    kernel (this measurement took minutes in bf16, seconds in float32)."""
    from diffusers import AutoencoderKLQwenImage

    from trainer_core.devtools.memprobe import LiveBytes

    side = 96
    torch.manual_seed(0)
    vae = AutoencoderKLQwenImage().float().eval()
    assert vae.config.base_dim == real_parts().vae_base_dim
    image = torch.rand(1, 3, 1, side, side) * 2 - 1  # (B, 3, frames, H, W)
    latents = torch.randn(1, vae.config.z_dim, 1, side // 8, side // 8)  # (B, C, frames, h, w)
    with torch.no_grad():
        with LiveBytes() as encode:
            vae.encode(image).latent_dist.mode()
        with LiveBytes() as decode:
            vae.decode(latents).sample
    bf16_per_fp32 = 2 / 4
    assert vae_encode_bytes(real_parts(), side, side) == pytest.approx(encode.peak * bf16_per_fp32, rel=0.01)
    assert vae_decode_bytes(real_parts(), side, side) == pytest.approx(decode.peak * bf16_per_fp32, rel=0.01)


def test_cfg_keeps_one_more_prediction_and_a_smaller_preview_needs_less():
    p = PlanInputs(blocks_to_swap=10)
    with_cfg = plan_phases(p).phases["preview"]
    without = plan_phases(dataclasses.replace(p, preview_cfg=False)).phases["preview"]
    tokens = real_arch().image_tokens(1024, 1024)
    assert allocated(with_cfg) - allocated(without) == tokens * 64 * 2  # one packed prediction in bf16
    small = plan_phases(dataclasses.replace(p, preview_width=512, preview_height=512)).phases["preview"]
    assert small.gpu_bytes < with_cfg.gpu_bytes


def test_swapped_masters_are_held_once_in_host_ram():
    k = 30
    plan = plan_phases(PlanInputs(blocks_to_swap=k))
    masters = plan.training.term("CPU master of swapped blocks")
    assert masters == k * real_arch().block_linear_weight_params  # float8: one byte per weight
    for name in AFTER_CACHING:
        host = plan.phases[name].host
        assert [t.bytes for t in host if "master" in t.name] == [masters], name
    for name in ("load", "cache"):  # the transformer is not loaded yet
        assert not any("master" in t.name for t in plan.phases[name].host)
    # Train holds a checkpoint's CPU copy of the LoRA and optimizer state; save the LoRA in the file's dtype.
    lora, opt = plan.training.term("LoRA weights"), plan.training.term("optimizer state")
    assert term(plan.phases["train"].host, "checkpoint copy") == lora + opt
    assert term(plan.phases["save"].host, "LoRA file tensors") == lora // 4 * 2
    assert plan.phases["train"].host_bytes - plan.phases["preview"].host_bytes == lora + opt
    # Pageable masters: no power-of-two rounding, a pinned staging buffer instead.
    pageable = plan_phases(PlanInputs(blocks_to_swap=k, pin_masters=False, staging_bytes=256 * 2**20))
    assert pageable.phases["train"].host_bytes == (plan.phases["train"].host_bytes
                                                   - plan.training.term("pinned arena slack") + 256 * 2**20)
    # Init fills the pinned arena chunk by chunk, each page-locked whole before the weights it receives are freed
    # (streaming.arena): the largest chunk is held twice, 1 GiB for three 324 MiB float8 blobs; pageable masters: none.
    filling = term(plan.phases["init"].host, "pinned chunk being filled")
    assert filling == 1 << 30 == max(blob_chunks(block_blob(real_arch(), "float8").whole_bytes, k))
    assert term(pageable.phases["init"].host, "pinned chunk being filled") == 0
    assert term(plan.phases["train"].host, "pinned chunk being filled") == 0


def test_on_the_cpu_every_device_byte_is_host_ram():
    cuda = plan_phases(PlanInputs(blocks_to_swap=8))
    cpu = plan_phases(PlanInputs(blocks_to_swap=8, device="cpu"))
    for name in PHASES:
        assert cpu.phases[name].gpu_bytes == 0
    # (the process baseline is the device's: CUDA's libraries add to it, planner/measured_terms.py)
    on_cpu = {name: cuda.phases[name].host_bytes + allocated(cuda.phases[name])
              - term(cuda.phases[name].gpu, "VAE on the device") - term(cuda.phases[name].gpu, "save residue")
              - (CUDA_PROCESS_BASELINE_BYTES - PROCESS_BASELINE_BYTES) for name in PHASES}
    on_cpu["init"] -= term(cuda.phases["init"].host, "pinned chunk being filled")  # nothing is pinned on the CPU
    for name in ("load", "cache", "init"):  # no slack and no context on the CPU
        assert cpu.phases[name].host_bytes == on_cpu[name], name
    # The preview's VAE decode (the larger working term at 1024 x 1024) runs in float32 on the CPU: twice the
    # bf16 decode's bytes, and the weights cast up (2 more bytes each); on a GPU, cuDNN's workspaces come on top.
    vae_params = real_parts().vae_params
    fp32_decode, bf16_decode = (vae_decode_bytes(real_parts(), 1024, 1024, b) for b in (4, 2))
    assert cpu.phases["preview"].host_bytes - on_cpu["preview"] == (fp32_decode - device_decode_bytes(bf16_decode, "cuda")
                                                                     + 2 * vae_params)
    # On the CPU a checkpoint or a bf16 LoRA file still copies (to another dtype only for the file).
    assert term(cpu.phases["train"].host, "checkpoint copy") == 0


def test_more_swapping_needs_less_gpu_and_more_host_ram_in_every_phase_after_caching():
    plans = [plan_phases(PlanInputs(blocks_to_swap=k)) for k in (3, 10, 30, 59)]
    for name in AFTER_CACHING:
        gpu = [p.phases[name].gpu_bytes for p in plans]
        host = [p.phases[name].host_bytes for p in plans]
        assert gpu == sorted(gpu, reverse=True) and len(set(gpu)) == 4, name
        assert host == sorted(host) and len(set(host)) == 4, name


def test_too_little_ram_is_refused_naming_the_phase_and_the_bytes():
    plan = plan_phases(PlanInputs(blocks_to_swap=43), ram_bytes=16 * GIB, gpu_budget_bytes=12 * GIB)
    assert not plan.fits and {s.resource for s in plan.shortfalls()} == {"host RAM"}
    with pytest.raises(UserInputError) as e:
        refuse_if_unfit(plan, AFTER_CACHING, "Init Trainer")
    message = str(e.value)
    train = plan.phases["train"].host_bytes
    assert message.startswith("Init Trainer: the memory plan does not fit")
    assert f"host RAM: the train phase needs {train / GIB:.2f} GiB" in message
    assert f"{(16 * GIB - HOST_RESERVE_BYTES) / GIB:.2f} GiB are usable" in message
    # With 24 GiB of RAM the same card fits: every phase, with the swap count the GPU needs.
    assert plan_phases(PlanInputs(blocks_to_swap=43), ram_bytes=24 * GIB, gpu_budget_bytes=12 * GIB).fits


def test_too_little_vram_is_refused_with_changes_that_do_fit():
    ram, budget = 32 * GIB, 16 * GIB
    plan = plan_phases(PlanInputs(rank=32, blocks_to_swap=20), ram_bytes=ram, gpu_budget_bytes=budget)
    # (the save phase too, with the allocator's measured 7% slack and the save residue: planner/measured_terms.py)
    assert {s.phase for s in plan.shortfalls()} == {"train", "preview", "save"}
    with pytest.raises(UserInputError) as e:
        refuse_if_unfit(plan)
    message = str(e.value)
    # the preview decodes in tiles within the budget, and still needs more: the training peak is the larger
    assert "GPU: the train phase needs" in message and "(also over: preview" in message
    assert "Changes that would fit:" in message
    k, _ = fewest_swapped_fitting(plan.inputs, real_arch(), real_parts(), ram, budget)
    assert f"  - blocks_to_swap={k}: GPU" in message
    assert plan_phases(dataclasses.replace(plan.inputs, blocks_to_swap=k), ram_bytes=ram, gpu_budget_bytes=budget).fits
    assert not plan_phases(dataclasses.replace(plan.inputs, blocks_to_swap=k - 1), ram_bytes=ram,
                           gpu_budget_bytes=budget).fits
    # Every listed change fits when applied, with the swap count it names (one checked here: the rank).
    line = next(s for s in plan.suggestions if s.startswith("rank 16 with blocks_to_swap="))
    k16 = int(line.split("blocks_to_swap=")[1].split(":")[0])
    assert k16 < k and plan_phases(dataclasses.replace(plan.inputs, rank=16, blocks_to_swap=k16), ram_bytes=ram,
                                   gpu_budget_bytes=budget).fits


def test_a_bf16_text_encoder_that_does_not_fit_names_float8():
    plan = plan_phases(PlanInputs(blocks_to_swap=43, text_encoder_storage="bfloat16"), ram_bytes=32 * GIB,
                       gpu_budget_bytes=12 * GIB)
    assert [s.phase for s in plan.shortfalls()] == ["cache"]
    assert plan.suggestions[0].startswith("text encoder in one byte while caching (Load node: text_encoder_fp8 = keep)")
    fixed = plan_phases(dataclasses.replace(plan.inputs, text_encoder_storage="float8"), ram_bytes=32 * GIB,
                        gpu_budget_bytes=12 * GIB)
    assert fixed.fits


def test_check_run_chooses_the_swap_count_and_refuses_what_does_not_fit():
    inputs = PlanInputs(rank=32)
    decision = check_run(inputs, auto=True, gpu_budget_bytes=16 * GIB, ram_bytes=32 * GIB)
    k, text = decision.blocks_to_swap, decision.text
    assert decision.ring_depth == 2  # no GPU named: the model does not choose a ring
    assert f"blocks_to_swap = {k} (the fewest that fit 16.00 GiB)" in text and "Every phase fits." in text
    assert plan_phases(dataclasses.replace(inputs, blocks_to_swap=k), gpu_budget_bytes=16 * GIB).fits_phases(AFTER_CACHING)
    with pytest.raises(UserInputError, match="blocks_to_swap=auto: the memory plan does not fit.*host RAM"):
        check_run(inputs, auto=True, gpu_budget_bytes=16 * GIB, ram_bytes=12 * GIB)
    with pytest.raises(UserInputError, match=r"blocks_to_swap=5: .*GPU: the train phase"):
        check_run(dataclasses.replace(inputs, blocks_to_swap=5), auto=False, gpu_budget_bytes=16 * GIB,
                  ram_bytes=32 * GIB)
    # The cache phase is not Init Trainer's to check (caching is over by then).
    assert check_run(inputs, auto=True, gpu_budget_bytes=8 * GIB, ram_bytes=32 * GIB).blocks_to_swap > k


def test_plan_command_prints_every_phase_against_ram_and_budget(capsys):
    from trainer_core.runs.cli import main

    assert main(["plan", "--resolution", "1024", "--rank", "32", "--ram-gb", "32", "--budget-gb", "16"]) == 0
    out = capsys.readouterr().out
    assert "host RAM 32.00 GiB, 28.00 usable" in out and "Every phase fits." in out
    for name in PHASES:
        assert any(line.startswith(f"{name} ") and line.rstrip().split("  ")[-1] for line in out.splitlines()), name
    assert main(["plan", "--resolution", "1024", "--rank", "32", "--ram-gb", "16", "--budget-gb", "12"]) == 1
    out = capsys.readouterr().out
    assert "does NOT fit (host RAM)" in out and "Does NOT fit." in out


def test_host_ram_override(monkeypatch):
    monkeypatch.setenv("QWEN_LORA_HOST_RAM_GB", "12.5")
    assert host_ram_bytes() == int(12.5 * GIB)
    monkeypatch.setenv("QWEN_LORA_HOST_RAM_GB", "lots")
    with pytest.raises(UserInputError, match="QWEN_LORA_HOST_RAM_GB='lots' must be a positive number"):
        host_ram_bytes()
    monkeypatch.delenv("QWEN_LORA_HOST_RAM_GB")
    assert host_ram_bytes() > 0


def test_init_trainer_refuses_a_run_that_does_not_fit_the_ram_before_touching_the_model(
        demo_folder, tmp_path, monkeypatch):
    """A tiny bf16 run on the CPU: with the machine's RAM it trains; with 4.5 GiB said (0.5 usable, less than
    the process itself) it is refused at once, the model left without an adapter."""
    from conftest import cached_demo
    from trainer_core.core.config import LoraConfig, OptimizerConfig, TrainConfig
    from trainer_core.families.qwen_image import build_tiny_components
    from trainer_core.training import Trainer

    components = build_tiny_components(seed=0, storage="float8", compute_dtype=torch.bfloat16)
    cached = cached_demo(components, demo_folder, tmp_path / "cache")
    configs = (LoraConfig(rank=4, alpha=4.0), OptimizerConfig(), TrainConfig(blocks_to_swap="auto"))
    trainer = Trainer(components, cached, *configs)
    assert "Per phase" in trainer.memory_plan and "Every phase fits." in trainer.memory_plan
    trainer.close()
    monkeypatch.setenv("QWEN_LORA_HOST_RAM_GB", "4.5")
    with pytest.raises(UserInputError, match=r"host RAM: the (train|init|save|preview) phase needs .* 0.50 GiB are usable"):
        Trainer(components, cached, *configs)
    assert not any(".lora_" in n for n, _ in components.transformer.named_parameters())


def test_text_encoder_fp8_auto_is_decided_for_the_device():
    """The Load node's text_encoder_fp8 'auto': on a CUDA device the caching phase's plan against its free
    memory (choose_text_encoder_storage, tested above); on the CPU float8 computes slowly: dequantize."""
    from trainer_core.core.config import LoadConfig
    from trainer_core.planner import resolve_text_encoder_fp8

    assert LoadConfig().text_encoder_fp8 == "auto"
    assert resolve_text_encoder_fp8("auto", "cpu") == "dequantize"
    assert resolve_text_encoder_fp8("keep", "cpu") == "keep" and resolve_text_encoder_fp8("dequantize", "cuda") == "dequantize"


def test_the_model_loaders_take_a_decided_text_encoder_fp8_mode_only():
    """'auto' is decided above models/ (the planner knows the device's memory): a loader of models/ that meets it
    refuses at once, before any file is read, and names the function that decides it."""
    from trainer_core.models.single_file import load_single_files
    from trainer_core.models.text_encoder_file import TextEncoderFile

    for load in (lambda: load_single_files("t.safetensors", "te.safetensors", "v.safetensors", text_encoder_fp8="auto",
                                           family=None),
                 lambda: TextEncoderFile("te.safetensors", fp8="auto")):
        with pytest.raises(UserInputError, match=r"text_encoder_fp8='auto'.*planner\.resolve_text_encoder_fp8"):
            load()


def test_a_measured_process_baseline_moves_every_phase_by_the_same_bytes():
    """The rehearsals (CPU and GPU) may put the process's measured size in place of the assumed 1 GiB."""
    assumed = plan_phases(PlanInputs(blocks_to_swap=8, device="cpu"))
    measured = plan_phases(PlanInputs(blocks_to_swap=8, device="cpu", process_baseline_bytes=400 * 2**20))
    for name in PHASES:
        assert assumed.phases[name].host_bytes - measured.phases[name].host_bytes == GIB - 400 * 2**20, name


def test_automatic_swapping_takes_the_ring_depth_the_timeline_model_predicts_fastest():
    from trainer_core.planner.timeline import GPUS, RUNTIME, predict

    inputs = PlanInputs(rank=32)
    # At 10 GiB on a 4090 on PCIe 3 the model finds a deeper ring faster (it rarely matters: benchmarks/README.md).
    plain = check_run(inputs, auto=True, gpu_budget_bytes=10 * GIB, ram_bytes=64 * GIB)
    slow_link = check_run(inputs, auto=True, gpu_budget_bytes=10 * GIB, ram_bytes=64 * GIB, gpu=GPUS["rtx4090-pcie3"])
    # The same GPU memory: one more slot, one more block streamed.
    assert slow_link.ring_depth > 2
    assert slow_link.blocks_to_swap - slow_link.ring_depth == plain.blocks_to_swap - plain.ring_depth
    assert f"ring of {slow_link.ring_depth} GPU slots" in slow_link.text and "Every phase fits." in slow_link.text

    def seconds(decision):
        p = dataclasses.replace(inputs, blocks_to_swap=decision.blocks_to_swap, ring_depth=decision.ring_depth)
        return predict(p, GPUS["rtx4090-pcie3"], path=RUNTIME).seconds

    assert seconds(slow_link) < 0.995 * seconds(plain)
    # Where streaming is hidden already (an RTX 4090 at 16 GiB), the ring stays at 2.
    rtx = check_run(inputs, auto=True, gpu_budget_bytes=16 * GIB, ram_bytes=64 * GIB, gpu=GPUS["rtx4090"])
    assert rtx.ring_depth == 2 and rtx.blocks_to_swap == check_run(
        inputs, auto=True, gpu_budget_bytes=16 * GIB, ram_bytes=64 * GIB).blocks_to_swap


def test_fp8_activations_plan_their_quantised_input_where_it_outweighs_the_weight_copy():
    """At 1024², the image MLP's down projection quantises 4096 x 12288 input values: 5 bytes each (fp32 quotient
    and float8), more than the largest bf16 weight copy the eager path makes (a modulation Linear, 3072 x 18432)."""
    from trainer_core.planner.transients import FP8_QUANTISED_BYTES_PER_VALUE

    inputs = PlanInputs(rank=32, blocks_to_swap=31)
    eager, fp8 = plan_memory(inputs), plan_memory(dataclasses.replace(inputs, fp8_activations=True))
    assert term(eager.gpu, "largest weight upcast") == 3072 * 18432 * 2
    # with the backward's weight copy beside it (the H100's fp8 run allocated more than the larger of the two alone)
    assert term(fp8.gpu, "largest weight upcast") == FP8_QUANTISED_BYTES_PER_VALUE * 4096 * 12288 + 3072 * 18432 * 2
    assert fp8.gpu_total - eager.gpu_total >= 5 * 4096 * 12288 - 3072 * 18432 * 2
    # bf16 blocks run the eager path whatever the flag says: nothing to quantise.
    bf16 = dataclasses.replace(inputs, storage="bfloat16")
    assert plan_memory(bf16).gpu_total == plan_memory(dataclasses.replace(bf16, fp8_activations=True)).gpu_total
