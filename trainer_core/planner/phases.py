"""GPU memory and host RAM of every phase of a run, checked against the machine before any weight is read.

    plan = plan_phases(PlanInputs(rank=32, blocks_to_swap=29), ram_bytes=32 * GIB, gpu_budget_bytes=16 * GIB)
    plan.phases["preview"].gpu_bytes, plan.phases["init"].host_bytes, plan.fits, plan.suggestions
    refuse_if_unfit(plan, AFTER_CACHING, "Init Trainer")      # UserInputError: phase, bytes, what would fit
    choose_text_encoder_storage(inputs, gpu_budget_bytes)       # "bfloat16" or "float8" for caching
    choose_encoder_streaming(inputs, gpu_budget_bytes)          # (decoder layers, vision blocks) streamed while caching

Phases (`PHASES`), as the lazy model set runs them (each part loaded when first needed, released after):
  load     the Load node reads file headers only: the process itself.
  caption  only when asked (`PlanInputs.caption`: `plan --caption`): the text encoder file's whole vision-language model
           alone on the device writing one image's caption (captioning.py), before caching; listed after load.
  cache    prompts, then latents, each part alone on the device (the transformer is not loaded yet): the
           text encoder (bf16, or its fp8 file's float8 Linears kept) and one prompt's forward; then the VAE
           and one image's encode at the largest bucket. The phase's peak is the larger step (caching.py; with
           2.1's reference images, the vision tower's forward and the references' encodes: references.py).
  init     the transformer streamed tensor by tensor from its file into its final home: resident blocks on
           the device, swapped blocks' masters once in host RAM (a pinned arena, or pageable + a pinned
           staging buffer); one tensor in flight; the LoRA injected.
  train    `plan.plan_memory`'s training peak on the device; in host RAM the masters, the cached dataset,
           the VAE kept for previews and a checkpoint's CPU copy of the LoRA and optimizer state.
  preview  the training state kept (no activations, no gradients) + the VAE on the device + the larger of
           one denoising forward at the preview size and the VAE's decode. True CFG (diffusers'
           `QwenImagePipeline`) runs the negative prompt as a second batch-1 forward after the first: it
           keeps one more prediction, it does not double the batch. 2.1's pipeline also keeps every block's K and V
           of the prompt (+ reference) prefix, once per prompt, and runs the references' rows before the target's.
  save     the training state + the LoRA copied to the CPU in the file's dtype.

Every phase has `gpu_bytes` (allocated + allocator slack + CUDA context, as `plan_memory` counts) and
`host_bytes` (the whole process: its baseline included). With device="cpu" every device byte is host
RAM: `gpu_bytes` is 0 and `host_bytes` holds both. Host RAM fits when `host_bytes` <= the machine's RAM
less `HOST_RESERVE_BYTES` (the system, a desktop, other programs); the OS's file cache is not counted (it
gives way). The GPU fits when `gpu_bytes` <= the budget (the whole card for the CLI; free memory for a run).

For the loaders and nodes:
    plan_phases(inputs, arch=None, ram_bytes=None, gpu_budget_bytes=None, parts=None) -> PhasePlan
    refuse_if_unfit(plan, phases=None, where="") -> None            raises UserInputError (None: every phase)
    choose_text_encoder_storage(inputs, gpu_budget_bytes=None, ram_bytes=None, arch=None, parts=None) -> str
    gpu_peak_after_caching(plan: MemoryPlan, arch, parts=None) -> int   what automatic swapping must fit
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ..streaming.arena import blob_arena_layout
from .arch import QwenImageArch, real_arch
from .captioning import caption_phase, choose_caption_storage, qwen25_vl_parts
from .caching import (  # noqa: F401 (re-exported: what caching chooses)
    cache_phase,
    choose_encoder_streaming,
    choose_text_encoder_storage,
    prompts_step_gpu_bytes,
)
from .inference import (
    PartSizes,
    device_decode_bytes,
    preview_block_working_bytes,
    real_parts,
    vae_decode_bytes,
    vae_element_bytes,
    vae_tiled_decode_bytes,
)
from .phase import HOST_RESERVE_BYTES, Phase, baseline, on_device
from .measured_terms import SAVE_RESIDUE_BYTES
from .plan import DTYPE_BYTES, GIB, MemoryPlan, PlanInputs, Term, block_blob, plan_memory
from .references import prefix_kv_bytes, reference_latent_tokens, smaller_references
from .transients import UPCAST_COPIES, fp8_input_bytes, int8_compute_bytes, rotation_input_bytes

PHASES = ("load", "cache", "init", "train", "preview", "save")
AFTER_CACHING = ("init", "train", "preview", "save")  # what Init Trainer checks; these depend on blocks_to_swap
# The training state that stays on the device between steps (plan_memory's term names).
STATE_TERMS = ("frozen block Linears, resident", "swap slots", "row scales", "biases, norms, non-block layers",
               "LoRA weights", "EMA of the LoRA weights", "optimizer state")  # optimizer state last (init)
NOT_ALLOCATED = ("allocator slack", "CUDA context")
SAVE_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


@dataclass(frozen=True)
class Shortfall:
    phase: str
    resource: str  # "GPU" or "host RAM"
    needed: int
    available: int


@dataclass
class PhasePlan:
    inputs: PlanInputs  # text_encoder_storage resolved ("auto" -> bfloat16 or float8)
    training: MemoryPlan  # the training plan the train phase is
    phases: dict[str, Phase]
    gpu_budget_bytes: int | None
    ram_bytes: int | None  # the machine's RAM; usable: less HOST_RESERVE_BYTES
    suggestions: list[str] = field(default_factory=list)  # changes that would fit, when it does not

    @property
    def usable_ram_bytes(self) -> int | None:
        return None if self.ram_bytes is None else self.ram_bytes - HOST_RESERVE_BYTES

    def shortfalls(self, phases: tuple[str, ...] | None = None) -> list[Shortfall]:
        """What does not fit among `phases` (None: every phase of the plan: PHASES, and caption when planned)."""
        out = []
        for name in self.phases if phases is None else phases:
            phase = self.phases[name]
            if self.gpu_budget_bytes is not None and phase.gpu_bytes > self.gpu_budget_bytes:
                out.append(Shortfall(name, "GPU", phase.gpu_bytes, self.gpu_budget_bytes))
            if self.ram_bytes is not None and phase.host_bytes > self.usable_ram_bytes:
                out.append(Shortfall(name, "host RAM", phase.host_bytes, self.usable_ram_bytes))
        return out

    def fits_phases(self, phases: tuple[str, ...] | None = None) -> bool:
        return not self.shortfalls(phases)

    @property
    def fits(self) -> bool:
        return self.fits_phases()

    def peak(self, resource: str, phases: tuple[str, ...] | None = None) -> tuple[str, int]:
        """(phase, bytes) of the largest GPU ('gpu') or host ('host') figure among `phases` (None: every phase)."""
        attr = "gpu_bytes" if resource == "gpu" else "host_bytes"
        name = max(self.phases if phases is None else phases, key=lambda n: getattr(self.phases[n], attr))
        return name, getattr(self.phases[name], attr)


# --------------------------------------------------------------------------------------------------
# the phases


def _host_state(plan: MemoryPlan, parts: PartSizes) -> list[Term]:
    """Host RAM that stays from init to the end: masters (once), their pinning overhead, cached dataset, VAE."""
    p = plan.inputs
    k = p.blocks_to_swap
    masters = Term("CPU master of swapped blocks", plan.term("CPU master of swapped blocks"),
                   f"{k} blocks, {'pinned' if p.pin_masters and p.device == 'cuda' else 'pageable'}, held once")
    if p.pin_masters:
        pinning = Term("pinned arena slack", plan.term("pinned arena slack"), "the masters' power-of-two chunks")
    else:
        pinning = Term("pinned staging buffer", p.staging_bytes if k else 0, "pageable masters are copied through it")
    return [
        baseline(p), masters, pinning,
        Term("cached latents + prompt embeddings", plan.term("cached latents"), f"{p.dataset_images} images"),
        Term("VAE, kept on the CPU for previews", parts.vae_params * DTYPE_BYTES[p.compute_dtype]),
    ]


def _chunk_being_filled(p: PlanInputs, arch: QwenImageArch) -> Term:
    """A pinned chunk of the masters' arena is page-locked whole before the weights it receives leave ordinary memory
    (streaming.arena): at most the largest chunk held twice while the swapper fills it."""
    k = p.blocks_to_swap
    pinned = p.pin_masters and p.device == "cuda" and k > 0
    caps = blob_arena_layout(block_blob(arch, p.storage), [], k)[0] if pinned else []
    return Term("pinned chunk being filled", max(caps, default=0), "page-locked whole, filled blob by blob")


def _state(plan: MemoryPlan, names: tuple[str, ...] = STATE_TERMS) -> list[Term]:
    return [t for t in plan.gpu if t.name in names]


def _largest_block_weight(arch: QwenImageArch) -> int:
    return max(s.in_features * s.out_features for s in arch.block_linears)


def _preview_working(p: PlanInputs, arch: QwenImageArch, parts: PartSizes, tiled: bool = False) -> Term:
    """The larger of one denoising forward (batch 1, no grad) and the VAE's decode, at the preview size; `tiled`: the
    decode in tiles (diffusers' tiled decode, `inference.vae_tiled_decode_bytes`)."""
    act = DTYPE_BYTES[p.compute_dtype]
    n_img, n_txt = arch.image_tokens(p.preview_width, p.preview_height), p.text_tokens
    n_refs = reference_latent_tokens(arch, p.reference_sizes) if arch.single_stream else 0  # 2.1: before the target
    kv = prefix_kv_bytes(arch, p, n_txt, n_refs, act) if arch.single_stream else 0
    n_img += n_refs
    packed = arch.patch_size ** 2 * arch.latent_channels  # channels of a packed latent token (2 x 2 cells; 2.1: 1)
    latents = n_img * packed * act * (3 if p.preview_cfg else 2)  # latents, prediction(s) of this step
    one = dataclasses.replace(p, batch=1)
    upcast = UPCAST_COPIES[p.storage] * _largest_block_weight(arch) * act + rotation_input_bytes(arch, one, n_img, act)
    upcast = max(upcast, fp8_input_bytes(arch, one, n_img), int8_compute_bytes(arch, one, n_img, act))  # a call at a time
    denoise = (
        (n_img + n_txt) * arch.dim * act  # the block's inputs: image and text hidden states
        + preview_block_working_bytes(arch, p.targets, p.lora_dtype, n_img, n_txt)
        + upcast
        + (n_img + n_txt) * arch.rope_complex_per_token * 8  # RoPE factors (complex64)
        + latents + kv
    )
    vae_b = vae_element_bytes(p)
    # On the CPU a half-precision VAE is cast to float32 for the decode: its weights grow by the difference.
    decode_bytes = vae_tiled_decode_bytes if tiled else vae_decode_bytes
    decode = (device_decode_bytes(decode_bytes(parts, p.preview_width, p.preview_height, vae_b), p.device) + latents
              + parts.vae_params * (vae_b - act) + kv)  # the pipeline decodes with its KV caches still alive
    size = f"{p.preview_width}x{p.preview_height}"
    detail = (f"denoising step {denoise / GIB:.2f} GiB (batch 1{', CFG: one more prediction' if p.preview_cfg else ''}"
              f"{f', prefix KV cache {kv / GIB:.2f} GiB' if kv else ''}{f', {n_refs} reference rows' if n_refs else ''}),"
              f" VAE decode{' in tiles' if tiled else ''} {decode / GIB:.2f} GiB")
    if denoise >= decode:
        return Term(f"preview denoising step at {size}", denoise, detail)
    return Term(f"preview VAE decode at {size}", decode, detail)


def training_phases(plan: MemoryPlan, arch: QwenImageArch, parts: PartSizes,
                    gpu_budget_bytes: int | None = None) -> dict[str, Phase]:
    """init, train, preview and save for the training setup `plan` (those that depend on blocks_to_swap). With a GPU
    budget, a preview whose VAE decode would not fit decodes in tiles (as the sampler then does:
    `planner.device.preview_decode_in_tiles`)."""
    p = plan.inputs
    act, lora_b = DTYPE_BYTES[p.compute_dtype], DTYPE_BYTES[p.lora_dtype]
    cuda = p.device == "cuda"
    host = _host_state(plan, parts)
    largest = _largest_block_weight(arch)
    lora_bytes, opt_bytes = plan.term("LoRA weights"), plan.term("optimizer state")

    init = on_device(p, _state(plan, STATE_TERMS[:-1]) + [
        Term("tensor in flight", largest * (4 + act), "largest tensor, converted via fp32 to its storage"),
    ], host + [Term("tensor in flight", largest * 2, "one tensor read from the file (bf16 at most)"),
               _chunk_being_filled(p, arch)], "init", "the optimizer state is allocated at the first step")

    allocated = [t for t in plan.gpu if t.name not in NOT_ALLOCATED]
    ema_bytes = plan.term("EMA of the LoRA weights")
    checkpoint = Term("checkpoint copy", lora_bytes + ema_bytes + opt_bytes if cuda else 0,
                      "LoRA, EMA and optimizer state on the CPU while a checkpoint is written")
    train = on_device(p, allocated, host + [checkpoint], "train", f"training peak: {plan.peak_phase}")

    vae = [Term("VAE on the device", parts.vae_params * act, "moved there to decode")] if cuda else []
    preview = on_device(p, _state(plan) + vae + [_preview_working(p, arch, parts)], host, "preview",
                        "the training state stays; no activations or gradients")
    if cuda and gpu_budget_bytes is not None and preview.gpu_bytes > gpu_budget_bytes:
        preview = on_device(p, _state(plan) + vae + [_preview_working(p, arch, parts, tiled=True)], host, "preview",
                            "the training state stays; no activations or gradients; the VAE decodes in tiles")

    lora_params = lora_bytes // lora_b
    same = not cuda and SAVE_DTYPE_BYTES[p.save_dtype] == lora_b  # .to(cpu, same dtype) copies nothing
    copy = Term("LoRA file tensors", 0 if same else lora_params * SAVE_DTYPE_BYTES[p.save_dtype],
                f"{lora_params / 1e6:.1f}M params in {p.save_dtype}")
    # Writing the EMA's file: the raw weights are kept aside on the device meanwhile (ema.averaged_weights).
    kept = [Term("raw LoRA kept while the EMA is written", lora_bytes)] if ema_bytes else []
    if cuda:
        kept.append(Term("save residue", SAVE_RESIDUE_BYTES, "measured: the file's tensors on their way off the device"))
    save = on_device(p, _state(plan) + kept, host + [copy], "save")
    return {"init": init, "train": train, "preview": preview, "save": save}


def gpu_peak_after_caching(plan: MemoryPlan, arch: QwenImageArch | None = None, parts: PartSizes | None = None,
                           gpu_budget_bytes: int | None = None) -> int:
    """The largest GPU figure of init, train, preview and save: what a swap count must fit (within
    `gpu_budget_bytes`, previews decode in tiles where they must)."""
    phases = training_phases(plan, arch or real_arch(), parts or real_parts(), gpu_budget_bytes)
    return max(phase.gpu_bytes for phase in phases.values())


def plan_phases(inputs: PlanInputs, arch: QwenImageArch | None = None, ram_bytes: int | None = None,
                gpu_budget_bytes: int | None = None, parts: PartSizes | None = None, suggest: bool = True,
                caption_parts: PartSizes | None = None) -> PhasePlan:
    """Every phase's GPU and host bytes for `inputs` (at its blocks_to_swap), checked against the machine's RAM
    and the GPU budget when given (None: not checked). When something does not fit and `suggest`, the plan
    lists changes that would (see `suggest_changes`). With `inputs.caption`, the caption phase too, for the whole
    vision-language model `caption_parts` (a family's `planned_caption_parts`; default Qwen2.5-VL-7B's)."""
    arch, parts = arch or real_arch(), parts or real_parts()
    if inputs.caption:  # decided before caching's choice replaces the text_encoder_storage it follows
        caption_parts = caption_parts or qwen25_vl_parts()
        inputs = dataclasses.replace(inputs, caption_storage=choose_caption_storage(
            inputs, caption_parts, gpu_budget_bytes, ram_bytes))
    inputs = dataclasses.replace(inputs, text_encoder_storage=choose_text_encoder_storage(
        inputs, gpu_budget_bytes, ram_bytes, arch, parts))
    decoder, vision = choose_encoder_streaming(inputs, gpu_budget_bytes, parts)
    inputs = dataclasses.replace(inputs, text_encoder_streamed=decoder, vision_streamed=vision)
    training = plan_memory(inputs, arch)
    phases = {"load": Phase("load", [], [baseline(inputs)], "file headers only")}
    if inputs.caption:
        phases["caption"] = caption_phase(inputs, caption_parts)
    phases["cache"] = cache_phase(inputs, parts)
    phases.update(training_phases(training, arch, parts, gpu_budget_bytes))
    plan = PhasePlan(inputs, training, phases, gpu_budget_bytes, ram_bytes)
    if suggest and not plan.fits:
        plan.suggestions = suggest_changes(plan, arch, parts, caption_parts)
    return plan


# --------------------------------------------------------------------------------------------------
# what would fit


def fewest_swapped_fitting(inputs: PlanInputs, arch: QwenImageArch, parts: PartSizes, ram_bytes: int | None,
                           gpu_budget_bytes: int | None, caption_parts: PartSizes | None = None
                           ) -> tuple[int | None, PhasePlan]:
    """(the fewest swapped blocks with which every phase fits, or None; the plan there or at the most swapping).

    More swapping never needs more GPU (1 and 2 swapped blocks cost what none does, see plan.py) and always
    needs more host RAM, so the fewest swapped blocks whose GPU phases fit is the only count to try: found by
    bisection. Without a GPU budget (or on the CPU) the count stays what `inputs` says."""
    def at(k: int) -> PhasePlan:
        return plan_phases(dataclasses.replace(inputs, blocks_to_swap=k), arch, ram_bytes, gpu_budget_bytes, parts,
                           suggest=False, caption_parts=caption_parts)

    if gpu_budget_bytes is None or inputs.device != "cuda":
        plan = at(inputs.blocks_to_swap)
        return (inputs.blocks_to_swap if plan.fits else None), plan

    def gpu_fits(plan: PhasePlan) -> bool:
        return all(plan.phases[n].gpu_bytes <= gpu_budget_bytes for n in AFTER_CACHING)

    lo, hi = 0, arch.num_blocks - 1
    most = at(hi)
    if not gpu_fits(most):
        return None, most
    found = most
    while lo < hi:
        mid = (lo + hi) // 2
        plan = at(mid)
        if gpu_fits(plan):
            hi, found = mid, plan
        else:
            lo = mid + 1
    return (hi if found.fits else None), found


def _candidates(p: PlanInputs, failing: set[str], parts: PartSizes) -> list[tuple[str, dict]]:
    """Single changes worth trying, each as (label, PlanInputs fields)."""
    out: list[tuple[str, dict]] = []
    cache = "cache" in failing and p.text_encoder_storage == "bfloat16"
    caption = "caption" in failing and p.caption_storage == "bfloat16"
    if cache or caption:
        one_byte = parts.one_byte_text_encoder_file
        while_ = " and ".join(w for asked, w in ((caption, "captioning"), (cache, "caching")) if asked)
        how = "Load node: text_encoder_fp8 = keep" if cache else "its one-byte Linears kept"
        out.append((f"text encoder in one byte while {while_} ({how}" +
                    (")" if p.text_encoder_file_fp8 else f", with the {one_byte} file)"),
                    dict(text_encoder_storage="float8", caption_storage="float8", text_encoder_file_fp8=True)))
    if p.storage == "bfloat16":
        out.append(("block storage float8 (Load node: storage)", dict(storage="float8")))
    largest_reference = max((max(size) for size in p.reference_sizes), default=0)
    for side in (768, 512):
        if side < largest_reference:
            out.append((f"references at {side}x{side} px (Edit Dataset: control_resolution {side})",
                        smaller_references(p, side)))
    if "caption" in failing:  # a smaller image has fewer vision tokens: a shorter prefill (captioning.py)
        area = p.caption_image[0] * p.caption_image[1]
        for side in (768, 512):
            if side * side < area:
                scale = side / area ** 0.5
                size = (round(p.caption_image[0] * scale), round(p.caption_image[1] * scale))
                out.append((f"caption images shown at most {side}x{side} px", dict(caption_image=size)))
    if "preview" in failing:
        for side in (768, 512):
            if side < max(p.preview_width, p.preview_height):
                out.append((f"previews at {side}x{side}", dict(preview_width=side, preview_height=side)))
    return out + training_candidates(p)


def training_candidates(p: PlanInputs) -> list[tuple[str, dict]]:
    """Single changes of the training settings that lower the GPU peak, each as (label, PlanInputs fields):
    what `_candidates` and automatic swapping's advice (search.py) try."""
    out: list[tuple[str, dict]] = []
    if not p.checkpointing:
        out.append(("enable gradient checkpointing", dict(checkpointing=True)))
    if p.batch > 1:
        out.append(("micro-batch 1 (use gradient accumulation instead)", dict(batch=1)))
    if p.lora_dtype == "float32":
        out.append(("LoRA dtype bfloat16", dict(lora_dtype="bfloat16")))
    if p.optimizer != "adamw8bit":  # every other optimizer keeps more state than 8-bit AdamW
        out.append(("optimizer adamw8bit", dict(optimizer="adamw8bit")))
    for rank in (16, 8, 4):
        if rank < p.rank:
            out.append((f"rank {rank}", dict(rank=rank)))
    if p.targets != "attention":
        out.append(("targets 'attention'", dict(targets="attention")))
    # One image's sides: `height` may hold several images' rows (Edit's controls, Layered's layers), which scale alike.
    image_w, image_h = p.vae_image or (p.width, p.height)
    side = max(image_w, image_h)
    for smaller in (1024, 896, 768, 640, 512):
        if smaller < side:
            w, h = image_w * smaller // side // 32 * 32, image_h * smaller // side // 32 * 32
            rows = p.height * smaller // side // 32 * 32
            out.append((f"resolution {w}x{h}", dict(width=w, height=rows, vae_image=(w, h) if p.vae_image else None)))
    return out


def suggest_changes(plan: PhasePlan, arch: QwenImageArch | None = None, parts: PartSizes | None = None,
                    caption_parts: PartSizes | None = None) -> list[str]:
    """Single changes with which every phase fits, each with the swap count it needs and its peaks: the swap
    count alone first (when another count fits), then the changes that fit with fewer swapped blocks than
    that (or at all, when no swap count does). Empty when the plan fits."""
    arch, parts = arch or real_arch(), parts or real_parts()
    if plan.fits:
        return []
    p = plan.inputs
    failing = {s.phase for s in plan.shortfalls()}
    lines = []
    swap_only, fitting = fewest_swapped_fitting(p, arch, parts, plan.ram_bytes, plan.gpu_budget_bytes, caption_parts)
    if swap_only is not None and swap_only != p.blocks_to_swap:
        lines.append(f"blocks_to_swap={swap_only}{_peaks(fitting)}")
    for label, change in _candidates(p, failing, parts):
        k, fitting = fewest_swapped_fitting(dataclasses.replace(p, **change), arch, parts, plan.ram_bytes,
                                            plan.gpu_budget_bytes, caption_parts)
        # Worth listing when it fits where nothing else does, or with fewer swapped blocks (faster, less RAM).
        if k is not None and (swap_only is None or k < swap_only):
            swap = f" with blocks_to_swap={k}" if p.device == "cuda" else ""
            lines.append(f"{label}{swap}{_peaks(fitting)}")
    return lines


def _peaks(plan: PhasePlan) -> str:
    gpu_phase, gpu = plan.peak("gpu")
    host_phase, host = plan.peak("host")
    gpu_text = f"GPU {gpu / GIB:.1f} GiB ({gpu_phase}), " if plan.inputs.device == "cuda" else ""
    return f": {gpu_text}host RAM {host / GIB:.1f} GiB ({host_phase})"


# --------------------------------------------------------------------------------------------------
# refusing up front


def refuse_if_unfit(plan: PhasePlan, phases: tuple[str, ...] | None = None, where: str = "") -> None:
    """Raise a UserInputError when a phase of `phases` (None: every phase of the plan) does not fit: it names each
    such phase, the bytes it needs and what is available, and the changes that would fit (`plan.suggestions`)."""
    from ..core.errors import UserInputError

    short = plan.shortfalls(phases)
    if not short:
        return
    parts = []
    for resource in ("GPU", "host RAM"):
        over = [s for s in short if s.resource == resource]
        if not over:
            continue
        worst = max(over, key=lambda s: s.needed)
        also = [s.phase for s in over if s is not worst]
        text = (f"{resource}: the {worst.phase} phase needs {worst.needed / GIB:.2f} GiB"
                + (f" (also over: {', '.join(also)})" if also else "") + f", {worst.available / GIB:.2f} GiB ")
        if resource == "GPU":
            text += "are available"
        else:
            text += f"are usable ({plan.ram_bytes / GIB:.1f} GiB less {HOST_RESERVE_BYTES / GIB:.0f} GiB for the system)"
        parts.append(text)
    head = f"{where}: " if where else ""
    p = plan.inputs
    message = (f"{head}the memory plan does not fit this machine ({p.width}x{p.height}, rank {p.rank}, "
               f"blocks_to_swap {p.blocks_to_swap}): {'; '.join(parts)}. Stopped here, before running out of memory.")
    if plan.suggestions:
        message += " Changes that would fit:\n" + "\n".join(f"  - {line}" for line in plan.suggestions)
    else:
        message += (" No single change of the settings fits: combine a lower resolution with a lower rank, close "
                    "other programs, or use a machine with more RAM or a larger GPU.")
    raise UserInputError(message)
