"""A timeline of one training step on a named GPU: block computes on one stream, weight copies on another.

    prediction = predict(PlanInputs(blocks_to_swap=29), GPUS["rtx4090"])
    prediction.seconds, prediction.overhead  # seconds per step; streaming's cost over all-resident

Three parts, each checkable on its own:
- `schedule`: the order of copies, waits and block computes a step issues, from the ring policy the swapper
  runs (`streaming.placement.Ring`). `tests/planner/test_timeline.py` records a real step of a tiny model through
  `streaming.runner.BlockRunner` and finds the same events, byte for byte.
- `block_work`: what one block costs in each pass, from the architecture: matmul FLOPs (tensor cores in the
  compute dtype, or fp32 for a LoRA computed in fp32, or float8 tensor cores for the frozen Linears with
  fp8 activations) and the memory traffic the eager float8 path (or the activations' quantisation) adds.
- `simulate`: the two CUDA streams. A copy starts when the copy stream is free and the compute stream has
  finished everything issued before it (`BlockSwapper` makes the copy stream wait for the compute stream);
  a streamed block's compute starts when its copy is done.

Assumptions (what makes a prediction, not a measurement; `benchmarks/gpu_check.py` measures on a GPU):
- Sustained throughput is a fixed share of the data-sheet peak: TENSOR_EFFICIENCY of dense tensor FLOPs
  (fp32 accumulate), FP32_EFFICIENCY of fp32 FLOPs, MEMORY_EFFICIENCY of memory bandwidth, LINK_EFFICIENCY
  of the PCIe link's raw rate per direction.
- Elementwise work (norms, RoPE, GELU, modulation, residuals) and the layers outside the blocks are left out:
  they cost the same with and without streaming, so leaving them out makes the compute shorter and the
  predicted overhead larger (on the safe side).
- The CPU issues work ahead of the GPU (Python never is the bottleneck), and copies do not slow the kernels.
- The optimizer step is memory-bound (`optimizer_work`): it reads and writes the LoRA weights, reads the gradients
  three times and writes them once (clipping's norm and scale, then the step), reads and writes the configured
  optimizer's state (the bytes optimizer_state.py counts) and its temporaries, and with EMA on the average.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..streaming.placement import (
    BACKWARD,
    FORWARD,
    MIN_RING,
    Placement,
    Ring,
    default_placement,
    ring_for,
    spread_placement,
)
from .arch import QwenImageArch, real_arch
from .gpus import GPUS, GpuProfile, profile_for_device  # noqa: F401 (re-exported: the profiles the timeline runs on)
from .optimizer_state import optimizer_state_bytes, optimizer_step_temp_bytes
from .plan import (
    DTYPE_BYTES,
    PlanInputs,
    adapter_settings,
    block_blob,
    lora_shapes,
    lora_tensor_shapes,
    modulation_window_steps,
)

TENSOR_EFFICIENCY = 0.6  # large bf16 GEMMs reach 55-70% of the dense peak; the 2.3 ms per block on an H100 is 53%
FP32_EFFICIENCY = 0.6
MEMORY_EFFICIENCY = 0.8
LINK_EFFICIENCY = 0.8  # pinned host-to-device copies reach ~80% of the raw PCIe rate (128b/130b coding, packet headers)
# Bytes of weight and gradient traffic per LoRA value and byte of its dtype in an optimizer step: the weights read
# and written (2), the gradients read by clipping's norm, read and written by its scaling, read by the step (4).
# With the state read and written, 8-bit AdamW's step moves 6 x 4 + 2 x 2 = 28 bytes per float32 value.
WEIGHT_AND_GRADIENT_PASSES = 6
# FlashAttention's backward runs 5 matmuls of the forward's size against its 2 (Dao 2023, FlashAttention-2, §3.1.2).
ATTENTION_BACKWARD_RATIO = 2.5

# --------------------------------------------------------------------------------------------------
# work


@dataclass(frozen=True)
class Work:
    """One block in one pass: matmul FLOPs on bf16 tensor cores, in fp32, on float8 tensor cores, and extra
    memory traffic (bytes)."""

    tensor_flops: float = 0.0
    fp32_flops: float = 0.0
    memory_bytes: float = 0.0
    fp8_flops: float = 0.0
    int8_ops: float = 0.0  # on int8 tensor cores (int8 compute)

    def __add__(self, other: Work) -> Work:
        return Work(self.tensor_flops + other.tensor_flops, self.fp32_flops + other.fp32_flops,
                    self.memory_bytes + other.memory_bytes, self.fp8_flops + other.fp8_flops,
                    self.int8_ops + other.int8_ops)

    def seconds(self, gpu: GpuProfile) -> float:
        if self.fp8_flops and not gpu.fp8_tflops:
            raise ValueError(f"{gpu.label} has no float8 tensor cores: fp8 activations do not run there")
        if self.int8_ops and not gpu.int8_tops:
            raise ValueError(f"{gpu.label} has no known int8 rate: int8 compute is not modelled there")
        return (self.tensor_flops / (gpu.bf16_tflops * 1e12 * TENSOR_EFFICIENCY)
                + (self.fp8_flops / (gpu.fp8_tflops * 1e12 * TENSOR_EFFICIENCY) if self.fp8_flops else 0.0)
                + (self.int8_ops / (gpu.int8_tops * 1e12 * TENSOR_EFFICIENCY) if self.int8_ops else 0.0)
                + self.fp32_flops / (gpu.fp32_tflops * 1e12 * FP32_EFFICIENCY)
                + self.memory_bytes / (gpu.memory_gbs * 1e9 * MEMORY_EFFICIENCY))


# Extra bytes per weight parameter each eager float8 Linear call moves: read the float8 weight (1) and write its
# bf16 copy (2), then the matmul reads 2 bytes where a fused kernel would read 1 (+1); float8_scaled also
# multiplies by its scales (read 2, write 2).
UPCAST_BYTES = {"float8": 4, "float8_scaled": 8, "int8": 8, "bfloat16": 0}
# Extra bytes per input value of a frozen Linear with fp8 activations (`models.float8.activations`, eager ops):
# the row maxima read it (2), the division reads it and writes fp32 (2 + 4), the cast to float8 reads that and
# writes 1 byte (4 + 1). The weight is not copied; float8_scaled's row scales ride in the matmul (rowwise scaling).
QUANTIZE_BYTES = 13
FP8_ACTIVATIONS = "fp8 activations"  # ComputePath.float8 for TrainConfig.fp8_activations
# int8 compute (`models.int8_compute`, TrainConfig.int8_compute): forward and recompute on int8 tensor cores. Extra bytes
# per input value: the fused quantisation (compiled on CUDA) reads the rotated input twice (row maxima, then the
# quotient) and writes int8 (2 + 2 + 1); per output value: the GEMM writes int32 (4) and the rescale reads it and writes
# the compute dtype (4 + 2) where a bf16 GEMM writes 2 (+8). The rotation is the int8 storage's (ROTATION_BYTES).
# Provisional until a device check profiles the path.
INT8_COMPUTE = "int8 compute"
INT8_QUANTIZE_BYTES = 5
INT8_OUTPUT_BYTES = 8
# An int8 ConvRot Linear call rotates its input (forward) or its input gradient (backward) first: a bf16 matmul of each
# group of ROTATION_GROUP features with the Hadamard matrix (models/int8_convrot.py), which reads and writes every value
# (2 + 2 bytes). The group of ComfyUI's files.
ROTATION_GROUP = 256
ROTATION_BYTES = 4


@dataclass(frozen=True)
class ComputePath:
    """How the matmuls run: the LoRA's dtype (peft casts its input to the LoRA weights' dtype: float32; or the
    compute dtype with fp32 master weights) and the frozen float8 Linears (eager upcast, a fused
    dequantise-and-multiply kernel that reads the float8 weight once, or FP8_ACTIVATIONS: forward and recompute
    on float8 tensor cores with the input quantised, backward eager)."""

    lora: str = "float32"
    float8: str = "eager"

    @property
    def label(self) -> str:
        frozen = self.float8 if self.float8 in (FP8_ACTIVATIONS, INT8_COMPUTE) else f"float8 {self.float8}"
        return f"LoRA in {self.lora}, {frozen}"


TODAY = ComputePath()
# The compute paths `plan --gpu` compares; RUNTIME is the one the trainer takes on a CUDA GPU.
PATHS = (TODAY, ComputePath("bfloat16", "eager"), ComputePath("bfloat16", "fused"))
RUNTIME = PATHS[1]  # the trainer by default (lora.compute_in_input_dtype); PATHS[2] with TrainConfig.compile_float8
# TrainConfig.fp8_activations: shown by `plan --gpu` for GPUs with float8 tensor cores (not in PATHS, whose
# every path runs on every GPU).
FP8_PATH = ComputePath("bfloat16", FP8_ACTIVATIONS)
# TrainConfig.int8_compute: shown by `plan --gpu` for GPUs with a known int8 rate; its blocks are planned as int8.
INT8_PATH = ComputePath("bfloat16", INT8_COMPUTE)


# Differential output preservation's forward of the base model (adapter off, no gradient) before each training
# forward (training/preservation.py): an ascending pass over the blocks like FORWARD, with its own work.
BASE_FORWARD = "base forward"


def block_work(arch: QwenImageArch, p: PlanInputs, path: ComputePath = TODAY) -> dict[str, Work]:
    """{FORWARD: Work, BACKWARD: Work} of one block (and BASE_FORWARD with preservation: the forward at the
    micro-batch's rows, half of p.batch, without the LoRA). BACKWARD includes the checkpoint recompute (without
    the modulation Linears, whose outputs the runner keeps)."""
    work = _block_work(arch, p, path)
    if p.preservation:
        base = _block_work(arch, dataclasses.replace(p, batch=max(1, p.batch // 2), preservation=False), path,
                           lora=False)
        work[BASE_FORWARD] = base[FORWARD]
    return work


def _block_work(arch: QwenImageArch, p: PlanInputs, path: ComputePath, lora: bool = True) -> dict[str, Work]:
    from ..models.qwen_arch import IMG_STREAM, MODULATION_LINEARS

    n_img = arch.image_tokens(p.width, p.height)
    rows_img, rows_txt = p.batch * n_img, p.batch * p.text_tokens
    image_side = set(IMG_STREAM.values())

    def rows(name: str) -> int:
        if name in MODULATION_LINEARS:
            return p.batch
        return rows_img if name in image_side else rows_txt

    linear_fwd = sum(2 * rows(s.name) * s.in_features * s.out_features for s in arch.block_linears)
    mod_fwd = sum(2 * rows(s.name) * s.in_features * s.out_features for s in arch.block_linears
                  if s.name in MODULATION_LINEARS)
    tokens = n_img + p.text_tokens
    attention_fwd = 4 * p.batch * tokens * tokens * arch.dim  # q k^T and (softmax) v
    fp8 = path.float8 == FP8_ACTIVATIONS and p.storage in ("float8", "float8_scaled")  # bf16, int8: their own paths
    int8 = path.float8 == INT8_COMPUTE
    if int8 and p.storage != "int8":
        p = dataclasses.replace(p, storage="int8")  # int8 compute holds every block weight in int8
    upcast = UPCAST_BYTES[p.storage] if path.float8 in ("eager", FP8_ACTIVATIONS, INT8_COMPUTE) else 0
    params = arch.block_linear_weight_params
    mod_params = sum(s.in_features * s.out_features for s in arch.block_linears if s.name in MODULATION_LINEARS)
    if fp8:  # frozen Linears on float8 tensor cores, each input quantised; attention stays bf16
        inputs = sum(rows(s.name) * s.in_features for s in arch.block_linears)
        mod_inputs = sum(rows(s.name) * s.in_features for s in arch.block_linears if s.name in MODULATION_LINEARS)
        forward = Work(attention_fwd, 0, QUANTIZE_BYTES * inputs, fp8_flops=linear_fwd)
        recompute = Work(attention_fwd, 0, QUANTIZE_BYTES * (inputs - mod_inputs), fp8_flops=linear_fwd - mod_fwd)
    elif int8:  # forward and recompute on int8 tensor cores, no weight upcast there; backward eager (below)
        inputs = sum(rows(s.name) * s.in_features for s in arch.block_linears)
        outputs = sum(rows(s.name) * s.out_features for s in arch.block_linears)
        mod_in = sum(rows(s.name) * s.in_features for s in arch.block_linears if s.name in MODULATION_LINEARS)
        mod_out = sum(rows(s.name) * s.out_features for s in arch.block_linears if s.name in MODULATION_LINEARS)
        extra = lambda i, o: INT8_QUANTIZE_BYTES * i + INT8_OUTPUT_BYTES * o  # noqa: E731
        forward = Work(attention_fwd, 0, extra(inputs, outputs), int8_ops=linear_fwd)
        recompute = Work(attention_fwd, 0, extra(inputs - mod_in, outputs - mod_out), int8_ops=linear_fwd - mod_fwd)
    else:
        forward = Work(linear_fwd + attention_fwd, 0, upcast * params)
        recompute = Work(linear_fwd - mod_fwd + attention_fwd, 0, upcast * (params - mod_params))
    # Backward: the frozen Linears' input gradients (never the modulation's: its input needs none), attention;
    # in bf16 on every path (fp8 activations keep the eager backward: weight upcast included).
    backward = Work(linear_fwd - mod_fwd + ATTENTION_BACKWARD_RATIO * attention_fwd, 0, upcast * (params - mod_params))
    if p.storage == "int8":  # every frozen Linear call rotates a (rows, in) tensor first (ROTATION_GROUP)
        values = sum(rows(s.name) * s.in_features for s in arch.block_linears)
        mod_values = sum(rows(s.name) * s.in_features for s in arch.block_linears if s.name in MODULATION_LINEARS)
        rotation = Work(2 * ROTATION_GROUP * values, 0, ROTATION_BYTES * values)
        rotation_no_mod = Work(2 * ROTATION_GROUP * (values - mod_values), 0, ROTATION_BYTES * (values - mod_values))
        forward, recompute, backward = forward + rotation, recompute + rotation_no_mod, backward + rotation_no_mod
    if p.checkpointing:
        backward = backward + recompute
    # LoRA: forward 2 r (in + out) per row; backward twice that (input and weight gradients). In fp32 peft also
    # casts each input up (read 2, write 4 bytes per value) and the sum back (12 bytes per output value).
    lora_flops = lora_cast = 0
    for (block, fan_in, fan_out), (_, name) in zip(lora_shapes(arch, p.targets), arch.lora_targets[p.targets]):
        if block == 0:  # every block but the last has the same targets; the last has fewer (on the safe side)
            lora_flops += 2 * rows(name) * p.rank * (fan_in + fan_out)
            lora_cast += rows(name) * (6 * fan_in + 12 * fan_out)
    lora_passes = 1 + 2 + (1 if p.checkpointing else 0)  # forward, backward (x2), recompute
    if path.lora == "float32":
        lora_fwd, lora_bwd = Work(0, lora_flops, lora_cast), Work(0, (lora_passes - 1) * lora_flops, 2 * lora_cast)
    else:
        lora_fwd, lora_bwd = Work(lora_flops), Work((lora_passes - 1) * lora_flops)
    if not lora:
        return {FORWARD: forward, BACKWARD: backward}
    return {FORWARD: forward + lora_fwd, BACKWARD: backward + lora_bwd}


def optimizer_work(arch: QwenImageArch, p: PlanInputs) -> Work:
    """The memory traffic of one optimizer step of `p.optimizer` (see the module's assumptions)."""
    shapes = lora_tensor_shapes(arch, p.targets, p.rank, **adapter_settings(p))
    params, value_bytes = sum(r * c for r, c in shapes), DTYPE_BYTES[p.lora_dtype]
    state = optimizer_state_bytes(shapes, p.optimizer, value_bytes)
    temps = optimizer_step_temp_bytes(params, p.optimizer, value_bytes)  # written, then read
    ema = params * (4 + 4 + value_bytes) if p.ema else 0  # the float32 average read and written, the weights read
    return Work(0, 0, WEIGHT_AND_GRADIENT_PASSES * value_bytes * params + 2 * state + 2 * temps + ema)


# --------------------------------------------------------------------------------------------------
# schedule


def schedule(num_blocks: int, placement: Placement | None, passes: list[str], blob_bytes,
             modulation_window: int = 0) -> list[tuple]:
    """The events a run of `passes` (FORWARD and BASE_FORWARD ascending, BACKWARD descending over the blocks)
    issues, in order: ("copy", block, bytes), ("wait", block), ("compute", block, pass). `blob_bytes`: a
    `BlobLayout`. `modulation_window`: training forwards per modulation window (streaming.placement; 0: none
    planned), the forwards counted from the first of a window; a BASE_FORWARD (no gradient) is not one of them."""
    ring = Ring(placement) if placement is not None and placement.streamed else None
    streamed = set(placement.streamed) if ring else set()
    events: list[tuple] = []
    forwards = 0
    for pass_ in passes:
        if pass_ == FORWARD and ring is not None and modulation_window:
            # As BlockRunner._begin_forward tells the ring: the window's first forward computes the modulation
            # outputs of the window; the last one is followed by another window's first.
            ring.forward_needs_modulation = forwards % modulation_window == 0
            ring.next_forward_needs_modulation = (forwards + 1) % modulation_window == 0
        if pass_ == BASE_FORWARD and ring is not None and modulation_window:
            # A forward without gradient computes its own modulation; the next training forward is as planned.
            ring.forward_needs_modulation = True
            ring.next_forward_needs_modulation = forwards % modulation_window == 0
        forwards += pass_ == FORWARD
        ascending = pass_ in (FORWARD, BASE_FORWARD)
        order = range(num_blocks) if ascending else reversed(range(num_blocks))
        for i in order:
            if ring is not None:
                ensure, ahead = ring.loads_at(FORWARD if ascending else BACKWARD, i)
                copies = [ensure] if ensure is not None else []
                for load in copies:
                    start, end = load.byte_range(blob_bytes)
                    events.append(("copy", load.block, end - start))
                if i in streamed:
                    events.append(("wait", i))
                for load in ahead:
                    start, end = load.byte_range(blob_bytes)
                    events.append(("copy", load.block, end - start))
            events.append(("compute", i, pass_))
    return events


@dataclass
class Timeline:
    seconds: float  # compute stream busy until
    stall: float  # seconds the compute stream waited for copies
    copy_busy: float  # seconds the copy stream worked
    copy_bytes: int


def simulate(events: list[tuple], work: dict[str, Work], gpu: GpuProfile, extra_after: dict[int, float] | None = None
             ) -> Timeline:
    """Run `events` on two streams (see module docstring). `extra_after`: seconds of other compute (the
    optimizer step) queued after the event of that index."""
    link = gpu.link_gbs * 1e9 * LINK_EFFICIENCY
    compute_end = copy_end = stall = busy = 0.0
    copied = 0
    ready: dict[int, float] = {}
    pending = 0.0  # when the next compute may start (its weights)
    for n, event in enumerate(events):
        kind = event[0]
        if kind == "copy":
            start = max(copy_end, compute_end)  # the copy stream waits for the compute stream
            copy_end = start + event[2] / link
            busy += event[2] / link
            copied += event[2]
            ready[event[1]] = copy_end
        elif kind == "wait":
            pending = max(pending, ready.get(event[1], 0.0))
        else:
            start = max(compute_end, pending)
            stall += start - compute_end
            compute_end = start + work[event[2]].seconds(gpu)
            pending = 0.0
        if extra_after and n in extra_after:
            compute_end += extra_after[n]
    return Timeline(compute_end, stall, busy, copied)


# --------------------------------------------------------------------------------------------------
# prediction


@dataclass
class Prediction:
    gpu: GpuProfile
    placement: Placement | None
    seconds: float  # per optimizer step (steady state)
    resident_seconds: float  # the same step with every block resident
    stall: float  # seconds per step the compute waited for copies
    copy_bytes: int  # per step

    @property
    def overhead(self) -> float:
        """Streaming's cost as a share of the all-resident step (never below 0: a few ulps of float sums are)."""
        return max(0.0, self.seconds / self.resident_seconds - 1)


STEADY_STEPS = 3  # simulate this many steps (or two modulation windows) and report the last (the ring starts empty)


def predict(inputs: PlanInputs, gpu: GpuProfile, placement: Placement | None = None, arch: QwenImageArch | None = None,
            path: ComputePath = TODAY) -> Prediction:
    """Seconds per step of `inputs` on `gpu` with `placement` (default: the swapper's default for
    inputs.blocks_to_swap and inputs.ring_depth), and with every block resident. With modulation ahead, the
    mean over a window's steps. INT8_PATH plans the blocks as int8 (what int8 compute holds) whatever `inputs.storage`."""
    arch = arch or real_arch()
    if path.float8 == INT8_COMPUTE or inputs.int8_compute:
        inputs, path = dataclasses.replace(inputs, storage="int8", int8_compute=True), INT8_PATH
    n, k = arch.num_blocks, inputs.blocks_to_swap
    if placement is None and k:
        placement = default_placement(n, k, ring_for(k, inputs.ring_depth))
    work = block_work(arch, inputs, path)
    opt = optimizer_work(arch, inputs).seconds(gpu)
    blob = block_blob(arch, inputs.storage)
    window = modulation_window_steps(inputs)
    measured = max(window, 1)  # steps averaged over
    total = max(STEADY_STEPS, 2 * window)

    def run(pl):
        per_step = ([BASE_FORWARD] if inputs.preservation else []) + [FORWARD, BACKWARD]
        per_step = per_step * inputs.grad_accum_steps
        events = schedule(n, pl, per_step * total, blob, window * inputs.grad_accum_steps)
        ends = [i for i, e in enumerate(events) if e == ("compute", 0, BACKWARD)]
        step_ends = ends[inputs.grad_accum_steps - 1::inputs.grad_accum_steps]
        first = step_ends[-measured - 1]  # the last event before the steps measured
        whole = simulate(events, work, gpu, {i: opt for i in step_ends})
        before = simulate(events[:first + 1], work, gpu, {i: opt for i in step_ends if i <= first})
        copied = sum(e[2] for e in events[first + 1:] if e[0] == "copy")
        return ((whole.seconds - before.seconds) / measured, (whole.stall - before.stall) / measured,
                copied // measured)

    seconds, stall, copied = run(placement)
    resident, _, _ = run(None)
    return Prediction(gpu, placement, seconds, resident, stall, copied)


def deeper_ring(inputs: PlanInputs, gpu: GpuProfile, arch: QwenImageArch | None = None, path: ComputePath = RUNTIME,
                min_gain: float = 0.005, rings: tuple[int, ...] = (3, 4, 6, 8)) -> Prediction | None:
    """The spread placement with a deeper ring that holds as many blocks' weights on the GPU as
    `inputs.blocks_to_swap` streamed with a ring of `inputs.ring_depth` (a slot costs what a resident block
    costs: one more slot, one more block streamed), when the model predicts it faster by more than `min_gain`
    of the step; else None. Only the spread placement: it is the one the loader reads host blocks for
    (`streaming.runner.swapped_blocks`), whatever the ring."""
    arch = arch or real_arch()
    n, k = arch.num_blocks, inputs.blocks_to_swap
    if k <= MIN_RING:
        return None
    held = n - k + ring_for(k, inputs.ring_depth)
    base = predict(inputs, gpu, spread_placement(n, k, ring_for(k, inputs.ring_depth)), arch, path)
    best = base
    for ring in rings:
        deeper_k = n - held + ring
        if ring <= inputs.ring_depth or deeper_k > n - 1 or deeper_k <= ring:
            continue
        p = dataclasses.replace(inputs, blocks_to_swap=deeper_k, ring_depth=ring)
        pred = predict(p, gpu, spread_placement(n, deeper_k, ring), arch, path)
        if pred.seconds < best.seconds:
            best = pred
    return best if best is not base and best.seconds < (1 - min_gain) * base.seconds else None


def render_timeline(inputs: PlanInputs, gpu: GpuProfile, arch: QwenImageArch | None = None) -> str:
    """`plan --gpu`: predicted seconds per step and streaming's overhead, per compute path, and what a deeper
    ring would give for the same GPU memory."""
    arch = arch or real_arch()
    k = inputs.blocks_to_swap
    lines = [f"Step time on {gpu.label} (timeline model, planner/timeline.py; assumptions in benchmarks/README.md)"]
    preds = [predict(inputs, gpu, arch=arch, path=path) for path in PATHS]
    first = preds[0]
    if k:
        pl = first.placement
        lines.append(f"  {k} of {arch.num_blocks} blocks streamed, spread over the depth, ring of {pl.ring} slots: "
                     f"{first.copy_bytes / 1e9:.1f} GB copied per step over {gpu.link} "
                     f"({gpu.link_gbs * LINK_EFFICIENCY:.1f} GB/s assumed)")
    else:
        lines.append("  no block streamed")
    lines.append(f"  {'compute path':<46}{'s/step':>8}{'all resident':>14}{'streaming overhead':>20}")
    paths = list(PATHS)
    if gpu.fp8_tflops and inputs.storage in ("float8", "float8_scaled"):
        paths.append(FP8_PATH)
        preds.append(predict(inputs, gpu, arch=arch, path=FP8_PATH))
    if gpu.int8_tops:  # opt-in; the int8 rates are data-sheet peaks until a device check measures them
        paths.append(INT8_PATH)
        preds.append(predict(inputs, gpu, arch=arch, path=INT8_PATH))
    for path, pred in zip(paths, preds):
        mark = " (this trainer)" if path == RUNTIME else ""
        lines.append(f"  {path.label + mark:<46}{pred.seconds:>8.3f}{pred.resident_seconds:>14.3f}"
                     f"{pred.overhead:>+20.1%}")
    deeper = deeper_ring(inputs, gpu, arch)
    if deeper is not None:
        pl = deeper.placement
        lines.append(f"  same GPU memory, ring of {pl.ring} ({len(pl.streamed)} streamed): {deeper.seconds:.3f} s/step, "
                     f"{deeper.overhead:+.1%} (automatic swapping takes it on this GPU)")
    return "\n".join(lines)
