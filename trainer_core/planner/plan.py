"""The plan maths: predict, term by term, the VRAM and host RAM a Qwen-Image LoRA training setup needs.

    plan = plan_memory(PlanInputs(width=1024, height=1024, rank=32, blocks_to_swap=16))

Pure arithmetic on a `PlanInputs` and the architecture's parameter counts: no device is probed here
(`device.py`), no swap count searched (`search.py`), nothing formatted (`render.py`), no live model or
dataset read (`for_run.py`), so every term can be checked against measurements on any machine.

Where the numbers come from:
- Parameter counts: the real transformer built on the meta device (`arch.real_arch`).
- Weights: float8 1 byte per parameter, float8_scaled adds one fp32 scale per output row, bf16 2 bytes; int8 (an
  int8 ConvRot file kept as it is) 1 byte and one fp32 scale per row, and its calls rotate their input first
  (models/int8_convrot.py: a copy of the input, rows x in, counted in a preview's forward; measured not to reach the
  training step's peak);
  everything outside the block Linears (biases, norms, embedders, final layers) in the compute dtype.
- Block swapping (`streaming.swapper.BlockSwapper`): `blocks_to_swap` blocks' frozen Linear weights live in a pinned
  CPU master, one blob per block (`streaming.arena.blob_arena_layout`); the GPU holds a ring of `ring_depth` slots
  (`streaming.placement.ring_for`) of one block's weights each. Which blocks are streamed changes no byte here.
- LoRA: shapes of `lora.target_module_names` (the last block's dead text-stream modules left out);
  gradients in the LoRA dtype; optimizer state exactly as each optimizer's library allocates it
  (optimizer_state.py).
- Activations: `activations.py` (exact saved-tensor formula, measured working memory).
- Peak: during backward, block i's inputs (or saved activations) for blocks <= i are still alive while
  the LoRA gradients of blocks >= i already are; the planner takes the worst i. The optimizer step is
  a second phase (all gradients, optimizer temporaries, no activations). The larger phase counts.
- Not from torch's allocator: the CUDA context and allocator slack, explicit assumed terms.

All sizes are bytes; tables print GiB. A "16 GB" card has 16 GiB.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..adapters.lycoris import tensor_shapes
from ..core.config import LoraConfig, OptimizerConfig, TrainConfig
from ..models.qwen_arch import MODULATION_LINEARS
from ..streaming.arena import blob_arena_layout
from ..streaming.placement import MODULATION_WINDOW, NUM_SLOTS, BlobLayout, blob_layout, ring_for
from .activations import recomputed_blocks
from .activations import (
    ActivationSettings,
    block_input_bytes,
    block_saved_bytes,
    block_working_bytes,
)
from .arch import QwenImageArch, real_arch
from .lycoris_terms import lycoris_saved_bytes, lycoris_working_bytes
from .measured_terms import ALLOCATOR_SLACK, CUDA_CONTEXT_BYTES, CUDA_PROCESS_BASELINE_BYTES, PROCESS_BASELINE_BYTES
from .transients import UPCAST_COPIES, fp8_input_bytes, int8_compute_bytes, rotation_input_bytes
from .optimizer_state import optimizer_state_bytes, optimizer_step_temp_bytes

GIB = 1024 ** 3
MIB = 1024 ** 2
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float8": 1, "float8_scaled": 1, "int8": 1}
ROW_SCALED = ("float8_scaled", "int8")  # one fp32 scale per output row of every block Linear


@dataclass(frozen=True)
class PlanInputs:
    """A training setup to plan. Defaults: 1024 x 1024, rank 32, the pack's default training settings."""

    width: int = 1024
    height: int = 1024
    batch: int = 1  # rows of a training forward: the micro-batch size (twice it with `preservation`)
    text_tokens: int = 256  # prompt tokens per sample (the longest caption in a batch)
    rank: int = 32
    targets: str = "attention+mlp"
    lora_dtype: str = "float32"
    adapter: str = "lora"  # LoraConfig.adapter: lora, lokr or loha (and LoKr's two shape settings)
    lokr_factor: int = -1
    lokr_decompose_both: bool = False
    lora_dropout: float = 0.0
    lora_in_compute_dtype: bool = True  # the trainer's LoRA matmuls (lora.compute_in_input_dtype); False: peft's cast
    storage: str = "float8"  # block Linear weights: float8, float8_scaled, bfloat16, or int8 (an int8 file's, kept)
    compute_dtype: str = "bfloat16"
    checkpointing: bool = True
    # blocks 0..K-1 recompute, the others keep activations; None: all (search.auto_checkpointed_blocks)
    checkpointed_blocks: int | None = None
    blocks_to_swap: int = 0
    ring_depth: int = NUM_SLOTS  # GPU slots for streamed blocks (at most blocks_to_swap of them)
    # Streamed blocks' modulation outputs computed a window ahead (streaming.placement.MODULATION_WINDOW), as the
    # trainer does whenever it streams under checkpointing: fewer bytes copied, a small table on the GPU.
    modulation_ahead: bool = True
    fp8_activations: bool = False  # TrainConfig.fp8_activations: its quantised inputs are a transient of their own
    int8_compute: bool = False  # TrainConfig.int8_compute: blocks held in int8, its calls' transients (transients.py)
    # Differential output preservation (TrainConfig.preservation_weight > 0, training/preservation.py): the class
    # captions' rows ride in the training forward (`batch` counts them: at most one per sample, so twice the
    # micro-batch size), and a forward of the base model without gradient (half of `batch` rows) runs before it.
    # That forward holds no activations for backward and ends before the training forward starts: it adds time
    # (planner/timeline.py) but never raises the peak, which is the backward's.
    preservation: bool = False
    optimizer: str = "adamw8bit"
    ema: bool = False  # OptimizerConfig.ema: a float32 average of the LoRA on the device (training/ema.py)
    grad_accum_steps: int = 1
    device: str = "cuda"  # "cuda" or "cpu": decides pinned memory, context and two kernels' saved tensors
    # How the text encoder sits in memory while caching: bfloat16, float8 (its fp8 file's Linears kept), or
    # auto (float8 only when bfloat16 would not fit: phases.choose_text_encoder_storage).
    text_encoder_storage: str = "auto"
    # Text encoder layers streamed from host memory while caching (streaming/encoder.py): its decoder layers and its
    # vision tower's blocks; None: the fewest that fit the GPU budget (phases.choose_encoder_streaming).
    text_encoder_streamed: int | None = 0
    vision_streamed: int = 0
    dataset_images: int = 0  # cached latents + prompt embeddings the trainer holds in host RAM
    cuda_context_bytes: int = CUDA_CONTEXT_BYTES
    allocator_slack: float = ALLOCATOR_SLACK
    # The phases around training (phases.py); defaults are the nodes' defaults.
    # The encoder file stores one-byte Linears (ComfyUI's fp8_scaled file, or an int8 ConvRot one) that caching may keep.
    text_encoder_file_fp8: bool = True
    preview_width: int = 1024  # the Preview node's size
    preview_height: int = 1024
    preview_cfg: bool = True  # true CFG (the Preview node's cfg 4): the negative prompt runs a second forward
    # Qwen-Image 2.1 editing: the largest sample's reference images, (W, H) px as sized; their rows are already in
    # `height` (planned_image_size, references.with_references); caching and previews add their terms (references.py).
    reference_sizes: tuple[tuple[int, int], ...] = ()
    # Qwen-Image-Edit: (W, H) px of the largest sample's control images as its processor hands them to the vision
    # tower (`planned_vision_sizes`; 2.1's tower sees reference_sizes). Caching adds the tower's terms.
    vision_sizes: tuple[tuple[int, int], ...] = ()
    # The largest single image the VAE encodes while caching, (W, H) px, where `height` holds more rows than one image
    # (Edit's controls, Layered's layers: planned_image_size); None: width x height (2.1's references: caching.py).
    vae_image: tuple[int, int] | None = None
    # Captioning (captioning.py: the `plan --caption` phase, planned only when asked): the text encoder file's whole
    # vision-language model writing one image's caption. `caption_image`: (W, H) px of the image as the captioner hands
    # it to the processor, which fits it to its vision tower's grid (the captioner shows an image at most 1024 x 1024 px,
    # its aspect kept); `caption_tokens`: the longest caption, in new tokens; `caption_storage`: the model's weights
    # (bfloat16, float8: the one-byte file's decoder Linears kept; auto: as text_encoder_storage, decided against the
    # captioning phase itself). Defaults: the captioner's (issue 42's captions/generate.py MAX_IMAGE_PIXELS 1024 x 1024;
    # captions/prompts.py's longest style default, "detailed": 320 tokens, so every style's default is planned).
    caption: bool = False
    caption_image: tuple[int, int] = (1024, 1024)
    caption_tokens: int = 320
    caption_storage: str = "auto"
    caption_batch: int = 1  # images captioned together (one generate call): the per-image terms times this
    save_dtype: str = "bfloat16"  # the Save node's LoRA precision
    pin_masters: bool = True  # swapped blocks' masters pinned; False: pageable, through a pinned staging buffer
    staging_bytes: int = 0  # that staging buffer (its size is the loader's), counted when pin_masters is False
    # the process before any model: None, the device's (PROCESS_BASELINE_BYTES, CUDA_PROCESS_BASELINE_BYTES); a measured
    # one may replace it
    process_baseline_bytes: int | None = None

    @classmethod
    def from_configs(cls, lora: LoraConfig, optimizer: OptimizerConfig, train: TrainConfig, width: int,
                     height: int, storage: str = "float8", blocks_to_swap: int | None = None, **kwargs) -> PlanInputs:
        """The inputs for a run the nodes describe with their config objects, streaming `blocks_to_swap` blocks
        (None: the settings' count; where they say 'auto', the planner decides it: for_run.plan_run)."""
        if blocks_to_swap is None and train.auto_swap:
            raise ValueError("a plan streams a number of blocks: pass blocks_to_swap where the settings say 'auto'")
        preservation = train.preservation_weight > 0
        return cls(width=width, height=height, batch=train.micro_batch_size * (2 if preservation else 1),
                   preservation=preservation, rank=lora.rank,
                   targets=lora.targets, lora_dtype=lora.dtype, lora_dropout=lora.dropout, adapter=lora.adapter,
                   lokr_factor=lora.lokr_factor, lokr_decompose_both=lora.lokr_decompose_both, storage=storage,
                   checkpointing=train.checkpointing,
                   blocks_to_swap=train.blocks_to_swap if blocks_to_swap is None else blocks_to_swap,
                   optimizer=optimizer.optimizer, ema=optimizer.ema, grad_accum_steps=train.grad_accum_steps,
                   fp8_activations=train.fp8_activations, int8_compute=train.int8_compute, **kwargs)

    def __post_init__(self) -> None:
        if self.int8_compute and self.storage != "int8":  # int8 compute holds every block weight in int8
            object.__setattr__(self, "storage", "int8")

    def validate(self, arch: QwenImageArch) -> None:
        # Allowed values come from the settings' config metadata (one list per setting, shared with the
        # nodes and the CLI); only the planner's own `device` is listed here.
        from ..core.config import PlanConfig, choices
        from ..core.errors import UserInputError

        if self.compute_dtype != "bfloat16":
            raise UserInputError("the planner models bf16 compute only (the activation terms were measured in bf16)")
        for name, allowed in (("targets", choices(LoraConfig, "targets")), ("storage", choices(PlanConfig, "storage")),
                              ("lora_dtype", choices(LoraConfig, "dtype")), ("adapter", choices(LoraConfig, "adapter")),
                              ("optimizer", choices(OptimizerConfig, "optimizer")), ("device", ("cuda", "cpu")),
                              ("text_encoder_storage", choices(PlanConfig, "text_encoder_storage"))):
            if getattr(self, name) not in allowed:
                raise UserInputError(f"{name}={getattr(self, name)!r}: expected one of {list(allowed)}")
        if not 0 <= self.blocks_to_swap <= arch.num_blocks - 1:
            raise UserInputError(f"blocks_to_swap={self.blocks_to_swap}: use 0 to {arch.num_blocks - 1} (the "
                                 f"transformer has {arch.num_blocks} blocks; at least one stays on the GPU)")
        if min(self.width, self.height, self.batch, self.rank, self.grad_accum_steps) < 1 or self.text_tokens < 0:
            raise UserInputError("width, height, batch, rank and grad_accum_steps must be positive")
        if min(*self.caption_image, self.caption_tokens, self.caption_batch) < 1:
            raise UserInputError("caption_image's sides, caption_tokens and caption_batch must be positive")
        if self.caption_storage not in choices(PlanConfig, "text_encoder_storage"):
            raise UserInputError(f"caption_storage={self.caption_storage!r}: expected one of "
                                 f"{list(choices(PlanConfig, 'text_encoder_storage'))}")
        for name in ("text_encoder_streamed", "vision_streamed"):  # (None: the planner chooses the decoder's)
            if getattr(self, name) is not None and getattr(self, name) < 0:
                raise UserInputError(f"{name}={getattr(self, name)}: the layers of the text encoder streamed from host "
                                     "memory while caching are 0 (none) or more, not negative")
        if min(self.preview_width, self.preview_height) < 1 or self.staging_bytes < 0:
            raise UserInputError("preview_width and preview_height must be positive, staging_bytes not negative")
        from ..core.config import SAVE_DTYPES

        if self.save_dtype not in SAVE_DTYPES:
            raise UserInputError(f"save_dtype={self.save_dtype!r}: expected one of {list(SAVE_DTYPES)}")


@dataclass(frozen=True)
class Term:
    name: str
    bytes: int
    note: str = ""


@dataclass
class MemoryPlan:
    inputs: PlanInputs
    gpu: list[Term]  # the training peak, term by term (they sum to gpu_total)
    host_training: list[Term]
    optimizer_step_peak: int  # the other training phase, for reference (already <= gpu_total)
    peak_phase: str
    notes: list[str] = field(default_factory=list)

    @property
    def gpu_total(self) -> int:
        return sum(t.bytes for t in self.gpu)

    @property
    def host_training_total(self) -> int:
        return sum(t.bytes for t in self.host_training)

    def term(self, name: str) -> int:
        """Bytes of the GPU or host term whose name starts with `name` (0 when absent)."""
        for t in self.gpu + self.host_training:
            if t.name.startswith(name):
                return t.bytes
        return 0


# --------------------------------------------------------------------------------------------------
# parts


def process_baseline(p: PlanInputs) -> int:
    """The process's host memory before any model: the inputs' measured figure, else the device's (see above)."""
    if p.process_baseline_bytes is not None:
        return p.process_baseline_bytes
    return CUDA_PROCESS_BASELINE_BYTES if p.device == "cuda" else PROCESS_BASELINE_BYTES


def baseline_note(p: PlanInputs) -> str:
    return "Python + libraries" + ("" if p.process_baseline_bytes is not None else " + CUDA's (measured once, an H100: "
                                   "provisional)" if p.device == "cuda" else " (assumed)")


def _weight_bytes(params: int, storage: str) -> int:
    return params * DTYPE_BYTES[storage]


def _memo(arch: QwenImageArch, key: tuple, compute) -> list:
    """`compute()` once per arch and key (a copy each call, so a caller may change its list): the auto search
    plans hundreds of setups of one arch, and at 60 blocks each list walks ~1400 modules' adapter tensors."""
    memo = arch.planner_memo
    if key not in memo:
        memo[key] = tuple(compute())
    return list(memo[key])


def lora_shapes(arch: QwenImageArch, targets: str) -> list[tuple[int, int, int]]:
    """(block, in_features, out_features) of every LoRA'd Linear, in model order."""
    return _memo(arch, ("shapes", targets), lambda: [
        (b, arch.linear(m).in_features, arch.linear(m).out_features) for b, m in arch.lora_targets[targets]])


def _tensor_shapes(arch: QwenImageArch, targets: str, rank: int, adapter: dict) -> list[tuple[int, int, int]]:
    """(block, rows, columns) of every adapter tensor, module by module (see lora_tensor_shapes)."""
    kind, factor, both = adapter.get("adapter", "lora"), adapter.get("factor", -1), adapter.get("decompose_both", False)
    return _memo(arch, ("tensors", targets, rank, kind, factor, both), lambda: [
        (block, r, c) for block, fan_in, fan_out in lora_shapes(arch, targets)
        for r, c in tensor_shapes(kind, rank, fan_in, fan_out, factor, both)])


def lora_tensor_sizes(arch: QwenImageArch, targets: str, rank: int, **adapter) -> list[tuple[int, int]]:
    """(block, numel) of every adapter tensor, in lora_tensor_shapes' order."""
    return [(block, r * c) for block, r, c in _tensor_shapes(arch, targets, rank, adapter)]


def lora_tensor_shapes(arch: QwenImageArch, targets: str, rank: int, **adapter) -> list[tuple[int, int]]:
    """(rows, columns) of every adapter tensor, module by module: a LoRA's A (rank, in) then B (out, rank); a
    LoKr's or LoHa's as peft creates them (`adapters.lycoris.tensor_shapes`). `adapter`: adapter (lora, lokr,
    loha), factor and decompose_both (LoKr), as `adapter_settings` gives them."""
    return [(r, c) for _, r, c in _tensor_shapes(arch, targets, rank, adapter)]


def adapter_settings(p: PlanInputs) -> dict:
    """The adapter's kind and shape settings, as lora_tensor_sizes and lora_tensor_shapes take them."""
    return dict(adapter=p.adapter, factor=p.lokr_factor, decompose_both=p.lokr_decompose_both)


def block_blob(arch: QwenImageArch, storage: str) -> BlobLayout:
    """One block's frozen Linear weights as the swapper lays them out in one blob (modulation Linears last)."""
    return blob_layout([_weight_bytes(s.in_features * s.out_features, storage) for s in arch.block_linears],
                       [s.name in MODULATION_LINEARS for s in arch.block_linears])


def _pow2ceil(n: int) -> int:
    return 1 << (n - 1).bit_length() if n > 1 else n


def activation_settings(p: PlanInputs) -> ActivationSettings:
    return ActivationSettings(preset=p.targets, rank=p.rank,
                              lora_bytes=DTYPE_BYTES[p.lora_dtype], dropout=p.lora_dropout > 0,
                              act_bytes=DTYPE_BYTES[p.compute_dtype], cuda=p.device == "cuda",
                              checkpointing=p.checkpointing, lora_in_compute_dtype=p.lora_in_compute_dtype)


def _outside_activation_bytes(arch: QwenImageArch, p: PlanInputs, n_img: int, act: int) -> int:
    """Tensors outside the blocks that are alive while a block runs its backward: the gradients arriving
    at the block (image + text, B x N x D) and the image tokens' RoPE factors (complex64).

    The final layer's and the loss's own activations are freed before the first block's backward starts,
    so they never add to the block peak (measured: the whole-model check in tests/planner/test_memory.py).
    """
    grads_in = p.batch * (n_img + p.text_tokens) * arch.dim * act
    # 2.1's RoPE factors cover the joint sequence once (its samples share a layout)
    rope = (n_img + p.text_tokens if arch.single_stream else p.batch * n_img) * arch.rope_complex_per_token * 8
    return grads_in + rope


# --------------------------------------------------------------------------------------------------
# the plan


def modulation_window_steps(inputs: PlanInputs) -> int:
    """Optimizer steps per modulation window of the trainer (`Trainer._plan_modulation_ahead`), 0 where it
    does not apply (no block streamed, no checkpointing, or switched off)."""
    if not (inputs.modulation_ahead and inputs.checkpointing and inputs.blocks_to_swap):
        return 0
    return max(1, MODULATION_WINDOW // inputs.grad_accum_steps)


def modulation_ahead_bytes(arch: QwenImageArch, p: PlanInputs) -> int:
    """The streamed blocks' modulation outputs a window's first forward computes for the window's other
    forwards (streaming.runner.BlockRunner): per forward and streamed block, one row per sample of each modulation
    Linear."""
    forwards = modulation_window_steps(p) * p.grad_accum_steps
    if forwards <= 1:
        return 0
    width = sum(s.out_features for s in arch.block_linears if s.name in MODULATION_LINEARS)
    return (forwards - 1) * p.blocks_to_swap * p.batch * width * DTYPE_BYTES[p.compute_dtype]


def plan_memory(inputs: PlanInputs, arch: QwenImageArch | None = None) -> MemoryPlan:
    """Predict GPU and host memory of one training setup, term by term (see module docstring)."""
    arch = arch or real_arch()
    p = inputs
    p.validate(arch)
    n, K = arch.num_blocks, p.blocks_to_swap
    act, lora_b = DTYPE_BYTES[p.compute_dtype], DTYPE_BYTES[p.lora_dtype]
    n_img = arch.image_tokens(p.width, p.height)
    cuda = p.device == "cuda"

    # Weights.
    block_w = _weight_bytes(arch.block_linear_weight_params, p.storage)  # one block's frozen Linear weights
    scales = arch.block_linear_rows * 4 if p.storage in ROW_SCALED else 0
    rest = (n * (arch.block_linear_bias_params + arch.block_other_params) + arch.outside_params) * act
    rest += 2 * arch.rope_table_positions * arch.rope_complex_per_token * 8  # the RoPE tables (complex64)
    num_slots = ring_for(K, p.ring_depth) if K else 0
    slots = num_slots * block_blob(arch, p.storage).whole_bytes

    # LoRA, gradients, optimizer.
    tensors = lora_tensor_sizes(arch, p.targets, p.rank, **adapter_settings(p))
    lora_params = sum(numel for _, numel in tensors)
    grads_per_block = [0] * n
    for block, numel in tensors:
        grads_per_block[block] += numel * lora_b
    opt_state = optimizer_state_bytes(lora_tensor_shapes(arch, p.targets, p.rank, **adapter_settings(p)),
                                      p.optimizer, lora_b)
    ema = lora_params * 4 if p.ema else 0  # float32 whatever the LoRA dtype

    # Activations: per-block amounts, then the worst moment of the backward pass. A LoKr or LoHa also saves
    # each layer's whole delta weight and has its transients (lycoris_terms).
    s = activation_settings(p)
    saved = block_saved_bytes(arch, s, p.batch, n_img, p.text_tokens) + lycoris_saved_bytes(arch, p)
    recomputing = recomputed_blocks(p, n)
    inputs_kept = block_input_bytes(arch, p.batch, n_img, p.text_tokens, act)
    kept_per_block = [inputs_kept if i < recomputing else saved for i in range(n)]
    # the larger working memory of the kinds of block present (recomputing, keeping its activations)
    kinds = [replace(s, checkpointing=c) for c in (True, False) if (recomputing if c else n - recomputing)]
    working = max(block_working_bytes(arch, k, p.batch, n_img, p.text_tokens) for k in kinds) \
        + lycoris_working_bytes(arch, p)
    recompute = saved if recomputing else 0
    all_grads = p.grad_accum_steps > 1  # accumulated gradients stay from the first micro-batch on
    worst_i, worst = 0, -1
    for i in range(n):
        alive = sum(kept_per_block[:i + 1]) + (sum(grads_per_block) if all_grads else sum(grads_per_block[i:]))
        if alive > worst:
            worst_i, worst = i, alive
    kept_at_peak = sum(kept_per_block[:worst_i + 1])
    grads_at_peak = worst - kept_at_peak
    upcast = UPCAST_COPIES[p.storage] * max(s_.in_features * s_.out_features for s_ in arch.block_linears) * act
    quantised = fp8_input_bytes(arch, p, n_img)
    upcast_detail = f"{p.storage} -> {p.compute_dtype}, transient"
    if quantised:  # fp8 activations: the forward's quantised input, and the backward's weight copy with it (the H100's
        # all-resident fp8 run allocated 0.058 GiB above the larger of the two alone: both counted errs up by 0.05 GiB)
        upcast, upcast_detail = upcast + quantised, ("fp8 activations: the largest quantised input (fp32 quotient + "
                                                     "float8) + the backward's weight copy")
    # int8 ConvRot: its rotated input beside the upcast weight on CUDA (H100: 0.043 GiB unplanned); not on the CPU's peak
    rotated = rotation_input_bytes(arch, p, n_img, act) if p.device == "cuda" and not p.int8_compute else 0
    if rotated:
        upcast, upcast_detail = upcast + rotated, upcast_detail + " + int8 ConvRot's rotated input"
    # int8 compute's calls run in the forward and the recompute, while the backward's working memory is not alive yet
    int8_call = int8_compute_bytes(arch, p, n_img, act) - working
    if int8_call > upcast:
        upcast, upcast_detail = int8_call, "int8 compute: the largest call's copies and products beyond backward working"
    outside = _outside_activation_bytes(arch, p, n_img, act)

    ahead = modulation_ahead_bytes(arch, p)
    persistent = (n - K) * block_w + n * scales + rest + slots + ahead + lora_params * lora_b + ema + opt_state
    backward_peak = persistent + worst + recompute + working + upcast + outside
    step_temp = optimizer_step_temp_bytes(lora_params, p.optimizer, lora_b)
    step_peak = persistent + sum(grads_per_block) + step_temp
    allocated = max(backward_peak, step_peak)
    phase = "backward" if backward_peak >= step_peak else "optimizer step"

    gib = lambda b: f"{b / GIB:.2f} GiB"  # noqa: E731
    kept_name = "block inputs or saved activations kept for backward"
    gpu = [
        Term("frozen block Linears, resident", (n - K) * block_w,
             f"{n - K} of {n} blocks x {gib(block_w)} ({p.storage}, {arch.block_linear_weight_params / 1e6:.0f}M params each)"),
        Term("swap slots", slots, f"{num_slots} slot(s) x one block's Linear weights" if K else "no swapping"),
        Term("modulation outputs ahead", ahead, f"{modulation_window_steps(p) * p.grad_accum_steps - 1} forwards x {K} "
             "streamed blocks" if ahead else "none computed ahead"),
        Term("row scales", n * scales, f"fp32, one per output row, all blocks ({p.storage})" if scales else "not scaled"),
        Term("biases, norms, non-block layers", rest, f"{p.compute_dtype}, and the RoPE tables"),
        Term("LoRA weights", lora_params * lora_b, f"{lora_params / 1e6:.1f}M params, {p.lora_dtype}"
             + (f", {p.adapter}" if p.adapter != "lora" else "")),
        Term("EMA of the LoRA weights", ema, "float32" if p.ema else "off"),
        Term("optimizer state", opt_state, p.optimizer),
    ]
    if phase == "backward":
        gpu += [
            Term("LoRA gradients at the peak", grads_at_peak,
                 f"blocks {worst_i}..{n - 1}" if not all_grads else "all (gradient accumulation)"),
            Term(kept_name, kept_at_peak, f"{worst_i + 1} blocks, {min(recomputing, worst_i + 1)} recomputing "
                 f"x {inputs_kept / MIB:.1f} MiB, the others x {saved / MIB:.1f} MiB"),
            Term("one block's recomputed activations", recompute,
                 f"{n_img} image + {p.text_tokens} text tokens x batch {p.batch}"
                 + (" (with preservation's class rows)" if p.preservation else "") if recompute else "no checkpointing"),
            Term("backward working memory", working, "measured per token (planner.activations)"),
            Term("largest weight upcast", upcast, upcast_detail),
            Term("activations outside the blocks", outside, "gradients in flight, image RoPE factors"),
        ]
    else:
        gpu += [Term("LoRA gradients", sum(grads_per_block), "all blocks"),
                Term("optimizer step temporaries", step_temp, p.optimizer if step_temp else "none")]
    gpu += [
        Term("allocator slack", int(allocated * p.allocator_slack) if cuda else 0,
             f"assumed {p.allocator_slack:.0%} of allocated" if cuda else "CPU: none"),
        Term("CUDA context", p.cuda_context_bytes if cuda else 0, "assumed, outside torch's allocator" if cuda else "CPU"),
    ]

    # Host RAM while training: what stays on the CPU once the blocks are placed.
    masters = K * block_w
    # The swapper packs the masters, a blob per block, into power-of-two chunks (streaming.arena.blob_arena_layout):
    # what is left unused.
    blob = block_blob(arch, p.storage)
    rounding = sum(blob_arena_layout(blob, list(blob.offsets), K)[0]) - K * block_w if K else 0
    latent_bytes = arch.latent_channels * (p.height // arch.vae_scale_factor) * (p.width // arch.vae_scale_factor) * 4
    cached = p.dataset_images * (latent_bytes + p.text_tokens * arch.text_dim * act)
    host_training = [
        Term("CPU master of swapped blocks", masters, f"{K} blocks, pinned" if cuda else f"{K} blocks"),
        Term("pinned arena slack", rounding, "unused room in the masters' power-of-two chunks"),
        Term("cached latents + prompt embeddings", cached, f"{p.dataset_images} images in RAM"),
        Term("process baseline", process_baseline(p), baseline_note(p)),
    ]
    notes = []
    if 0 < K <= p.ring_depth:
        notes.append(f"blocks_to_swap={K} saves nothing: the swapper keeps {num_slots} GPU slot(s) of a "
                     f"block's weights, so swapping pays off from {p.ring_depth + 1} blocks on")
    return MemoryPlan(inputs=p, gpu=gpu, host_training=host_training, optimizer_step_peak=step_peak + (
                          int(step_peak * p.allocator_slack) + p.cuda_context_bytes if cuda else 0),
                      peak_phase=phase, notes=notes)
