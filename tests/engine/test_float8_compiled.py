"""The compiled float8 path (`models.float8.compiled`) run for real, on the CPU (Inductor's C++ backend): the
same block outputs, loss and LoRA gradients as the eager `FrozenLinearFunction`, also with block streaming
(with and without checkpointing); the same LoRA after a few training steps; every graph compiled in the first
step, none after, though the caption length changes from step to step.

Tolerance: relative 1e-4 (norm of the difference over the norm), fp32 compute. On this machine (x86, torch
2.13, g++ 12) the two paths agree bit for bit: Inductor hands the matmul to the same aten kernel and the
upcast, scale and bias are exact or single fp32 roundings in the same order. Elsewhere Inductor may fuse the
bias into the matmul (addmm), contract the scale and bias into one fma, or reorder fp32 sums: a few ulps per
Linear (~1e-7) that grow through 4 blocks, attention and backward; 1e-4 leaves them room while a wrong scale,
a missing bias or a stale weight (each >= 1e-2 here) still fails.
"""

import pytest
import torch
import torch._dynamo

from trainer_core.core.config import LoraConfig
from trainer_core.devtools.memprobe import SavedTensors
from trainer_core.devtools.random_weights import random_transformer
from trainer_core.adapters.lora import compute_in_input_dtype, inject_lora, lora_parameters
from trainer_core.models.float8 import compiled as float8_compiled
from trainer_core.training.objective import flow_loss
from trainer_core.streaming.runner import BlockRunner
from trainer_core.streaming.placement import spread_placement

# A real Qwen-Image layout (16 latent channels, 2x2 patches) at toy width, 4 blocks.
TINY = dict(num_layers=4, num_attention_heads=2, attention_head_dim=16, axes_dims_rope=(8, 4, 4),
            joint_attention_dim=32)
GRID = 4  # 4 x 4 packed latent tokens
TEXT_LENGTHS = (16, 11, 7)  # prompt tokens of successive batches (captions differ in length)
RTOL = 1e-4
CPU = torch.device("cpu")

pytestmark = pytest.mark.skipif(not float8_compiled.available(CPU, allow_cpu=True),
                                reason="no C++ compiler for Inductor's CPU backend")


@pytest.fixture(autouse=True)
def loud_dynamo():
    """A graph past Dynamo's recompile limit would run eagerly without a word: make it an error."""
    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
        yield


def lora_model(storage: str) -> torch.nn.Module:
    """4 tiny blocks with `storage` block Linears, fp32 compute, a LoRA on all block Linears whose B is not zero
    (so A gets gradients too). The same seed gives the same weights on every call."""
    model = random_transformer(TINY, storage=storage, compute_dtype=torch.float32, seed=0)
    inject_lora(model, LoraConfig(rank=4, alpha=4.0, targets="all"), seed=0)
    compute_in_input_dtype(model)
    g = torch.Generator().manual_seed(1)
    for p in lora_parameters(model):
        if not p.abs().sum():
            p.data.normal_(0, 0.05, generator=g)
    return model


def batches(n: int):
    g = torch.Generator().manual_seed(0)
    for step in range(n):
        yield (torch.randn(1, GRID * GRID, 64, generator=g),  # (B, packed latent tokens, 4 x 16 channels)
               torch.randn(1, TEXT_LENGTHS[step % len(TEXT_LENGTHS)], 32, generator=g),  # (B, text tokens, joint dim)
               torch.randn(1, GRID * GRID, 64, generator=g))  # target


def loss_of(model, batch) -> torch.Tensor:
    x, prompt, target = batch
    prediction = model(hidden_states=x, encoder_hidden_states=prompt, timestep=torch.tensor([0.5]),
                       img_shapes=[[(1, GRID, GRID)]], return_dict=False)[0]
    return flow_loss(prediction, target)


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool((a - b).norm() <= RTOL * b.norm())


def graphs_compiled() -> int:
    """Graphs Dynamo has compiled in this process (recompilations included)."""
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def block_outputs(model) -> list:
    """Every block's (text, image) outputs of the next forward, in order."""
    outputs = []
    for block in model.transformer_blocks:
        block.register_forward_hook(lambda m, args, out: outputs.append([o.detach().clone() for o in out]))
    return outputs


@pytest.mark.parametrize("storage, placement", [
    ("float8_scaled", None),
    # 3 of 4 blocks streamed through 2 slots, no checkpointing: the first streamed block's slot is refilled
    # before its backward, which must read its weights again from the module, as the eager path does.
    ("float8", spread_placement(4, 3, ring=2)),
])
def test_compiled_equals_eager_in_block_outputs_loss_and_lora_gradients(storage, placement):
    torch._dynamo.reset()  # so the graphs this test runs are compiled here (and counted), not by an earlier test
    results = {}
    for compiled in (False, True):
        model = lora_model(storage)
        runner = BlockRunner(model, CPU, placement=placement, compile_float8=compiled, compile_on_cpu=True)
        assert runner.compiled_float8 == compiled
        outputs = block_outputs(model)
        batch = next(batches(1))
        graphs_before = graphs_compiled()
        with SavedTensors(exclude=list(model.parameters())) as saved:
            loss = loss_of(model, batch)
        loss.backward()
        assert (graphs_compiled() > graphs_before) == compiled  # the compiled graphs ran
        results[compiled] = (list(outputs), loss.detach(), [p.grad for p in lora_parameters(model)], saved.bytes)
        runner.uninstall()
        if compiled:  # uninstalled: the eager path again, bit for bit
            with torch.no_grad():
                assert torch.equal(loss_of(model, batch), results[False][1])
    (eager_out, eager_loss, eager_grads, eager_saved), (out, loss, grads, saved) = results[False], results[True]
    # Backward keeps what the eager path keeps: no upcast copy of a weight (AOTAutograd's partitioner, left to
    # choose, saved one per Linear).
    assert saved == eager_saved
    assert len(out) == len(eager_out) == TINY["num_layers"]
    assert all(close(a, b) for block, eager_block in zip(out, eager_out) for a, b in zip(block, eager_block))
    assert close(loss, eager_loss)
    assert all(close(g, e) for g, e in zip(grads, eager_grads))


def train(compiled: bool, steps: int) -> tuple[list[torch.Tensor], list[int]]:
    """`steps` SGD steps of the LoRA, 3 of 4 blocks streamed through a ring of 2 slots, checkpointing on.
    Returns the LoRA's change (what training did; the LoRA itself is dominated by its start) and the graphs
    Dynamo compiled in each step."""
    model = lora_model("float8_scaled")
    runner = BlockRunner(model, CPU, checkpointing=True, placement=spread_placement(4, 3, ring=2),
                         compile_float8=compiled, compile_on_cpu=True)
    params = lora_parameters(model)
    start = [p.detach().clone() for p in params]
    optimizer = torch.optim.SGD(params, lr=0.1)
    compiles = []
    for batch in batches(steps):
        before = graphs_compiled()
        loss_of(model, batch).backward()
        optimizer.step()
        optimizer.zero_grad()
        compiles.append(graphs_compiled() - before)
    runner.uninstall()
    return [p.detach() - p0 for p, p0 in zip(params, start)], compiles


def test_streamed_checkpointed_training_matches_eager_and_compiles_in_the_first_step_only():
    torch._dynamo.reset()  # count this model's graphs from none (an earlier test may have compiled some)
    compiled_change, compiles = train(compiled=True, steps=3)
    eager_change, _ = train(compiled=False, steps=3)
    assert all(close(c, e) for c, e in zip(compiled_change, eager_change))
    # The first step compiles one forward graph per weight shape (the modulation's single row apart) and one
    # backward graph per weight shape the backward meets; the other steps' new caption lengths, the streamed
    # weights in ring slots (views at other offsets) and the checkpoint recompute reuse them.
    assert 0 < compiles[0] <= float8_compiled.RECOMPILE_LIMIT and compiles[1:] == [0, 0]
