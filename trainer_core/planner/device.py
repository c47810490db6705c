"""The memory budget of a CUDA device, probed now, and the choices made against it: the swap count, the text encoder
file's fp8 mode 'auto' (decided here, above the model loaders, which take only a concrete mode), and which text encoder
layers stream while caching (`CachingPlacement`, handed to the loaders as a placement).

The one part of the planner that touches a device (torch.cuda, imported when called): kept apart so
the plan maths and the search stay pure and testable on any machine.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .arch import QwenImageArch
from .inference import PartSizes
from .phases import choose_text_encoder_storage
from .plan import GIB, MIB, PlanInputs
from .search import SwapChoice, auto_blocks_to_swap


@dataclass(frozen=True)
class Budget:
    bytes: int
    source: str
    context_included: bool  # the CUDA context already exists and is not part of `bytes`


@dataclass(frozen=True)
class DeviceMemory:
    """One reading of a CUDA device's memory, bytes, as torch reports it (`read_device_memory`); the H100 report's
    figures in tests."""

    free: int  # torch.cuda.mem_get_info: held by no process
    total: int
    reserved: int  # torch's caching allocator's pool: the allocated tensors and the cached blocks between them
    allocated: int  # in live tensors: the training state, a resident model, another node's model
    cap: int | None = None  # set_per_process_memory_fraction's share of `total`, where one is set


# What every decision keeps back from the room it computes: the allocator's rounding and a kernel's workspace.
DECISION_RESERVE_BYTES = 512 * MIB


def room_now(memory: DeviceMemory, counted_bytes: int = 0, reserve_bytes: int = DECISION_RESERVE_BYTES) -> int:
    """The one rule for every memory decision taken while the pack runs (the swap count at Init, the text encoder's
    streamed layers and fp8 mode, the caption batch, the preview's tiled decode): what one more allocation can get now.

    That is what no process holds plus what torch has cached but no tensor uses (free + reserved - allocated), and under
    a per-process cap no more than the cap less what is allocated. Never free + reserved: reserved holds the live
    tensors (at the H100's 16 GiB setting ~12.5 GiB of training state), so counting it as room decided a whole 1024^2
    decode that then ran out of memory. `counted_bytes`: tensors already allocated that the caller's need counts
    itself (a resident model whose weights the plan includes), given back so they are not counted twice. Pure: tests
    give it the H100 run's numbers."""
    room = memory.free + memory.reserved - memory.allocated
    if memory.cap is not None:
        room = min(room, memory.cap - memory.allocated)
    return room + counted_bytes - reserve_bytes


def fits_now(need_bytes: int, memory: DeviceMemory, counted_bytes: int = 0) -> bool:
    """Whether `need_bytes` more fit the device now (`room_now`), the allocator's slack on everything then allocated
    kept back where it is more than the reserve: never less strict than the plan's phases, which add that slack, so a
    decision the plan takes one way at run time is never taken the larger way."""
    from .plan import ALLOCATOR_SLACK

    slack = int(ALLOCATOR_SLACK * (memory.allocated - counted_bytes + need_bytes))
    return need_bytes + max(0, slack - DECISION_RESERVE_BYTES) <= room_now(memory, counted_bytes)


def read_device_memory(device=None) -> DeviceMemory:
    """The device's `DeviceMemory` now (the one place that asks torch.cuda)."""
    import torch

    device = torch.device(device or "cuda")
    free, total = torch.cuda.mem_get_info(device)
    # A process held to a share of the card (torch.cuda.set_per_process_memory_fraction: by whoever shares the card,
    # or the device check playing a smaller card) allocates no more than that share, free memory or not.
    fraction = getattr(torch.cuda, "get_per_process_memory_fraction", lambda _device: 1.0)(device)
    return DeviceMemory(free, total, torch.cuda.memory_reserved(device), torch.cuda.memory_allocated(device),
                        int(total * fraction) if fraction < 1.0 else None)


def device_bytes_of(modules, device) -> int:
    """Bytes of the parameters and buffers of `modules` (None skipped) that sit on `device`: what a decision's plan
    counts itself and `room_now` should not count as taken."""
    import torch

    device, seen, total = torch.device(device), set(), 0
    for module in modules:
        if module is None:
            continue
        for t in list(module.parameters()) + list(module.buffers()):
            if t.device.type == device.type and t.data_ptr() not in seen:
                seen.add(t.data_ptr())
                total += t.numel() * t.element_size()
    return total


def detect_budget(device=None, reserve_bytes: int = DECISION_RESERVE_BYTES, counted_bytes: int = 0,
                  memory: DeviceMemory | None = None) -> Budget:
    """What a CUDA device can still give now (`room_now`: free + cached-but-unused, within a cap, less what live tensors
    hold, plus `counted_bytes` the caller's plan counts itself), less `reserve_bytes`. `memory`: a reading to use
    (tests), else read now.

    The CUDA context exists once this runs, so its memory is already outside the free figure: plan with
    `cuda_context_bytes=0` against this budget (`auto_for_device` does).
    """
    m = memory if memory is not None else read_device_memory(device)
    capped = f", this process held to {m.cap / GIB:.1f} GiB" if m.cap is not None else ""
    return Budget(room_now(m, counted_bytes, reserve_bytes),
                  f"{device or 'cuda'}: {m.free / GIB:.1f} GiB free of {m.total / GIB:.1f} GiB, {m.reserved / GIB:.1f} "
                  f"GiB reserved by torch of which {m.allocated / GIB:.1f} GiB in live tensors"
                  f"{f' ({counted_bytes / GIB:.1f} GiB of them planned here)' if counted_bytes else ''}{capped}, "
                  f"{reserve_bytes / GIB:.1f} GiB kept back", True)


def auto_for_device(inputs: PlanInputs, device=None, reserve_bytes: int = 512 * MIB,
                    arch: QwenImageArch | None = None, parts: PartSizes | None = None) -> SwapChoice:
    """`auto_blocks_to_swap` against the free memory of a CUDA device."""
    budget = detect_budget(device, reserve_bytes)
    return auto_blocks_to_swap(dataclasses.replace(inputs, cuda_context_bytes=0), budget.bytes, arch, parts)


def resolve_text_encoder_fp8(mode: str, device, inputs: PlanInputs | None = None, parts: PartSizes | None = None) -> str:
    """The Load settings' `text_encoder_fp8` as the model loaders take it ("keep" or "dequantize").

    "auto" -> "keep" when the memory plan's caching phase (`phases.choose_text_encoder_storage`) says the
    dequantized encoder would not fit the CUDA device's free memory now, else "dequantize" (always on the CPU,
    where float8 computes slowly). Other modes are returned as they are. `inputs`: a `PlanInputs` with the
    run's largest bucket and longest prompt (default: 1024 x 1024, 256 tokens); `parts`: the model's text encoder and
    VAE (default Qwen-Image's; 2.1's loader passes its own). The families' loaders call this before the model loaders
    (models/single_file.py), as the cache keys name the mode decided."""
    if mode != "auto":
        return mode
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return "dequantize"
    inputs = dataclasses.replace(inputs or PlanInputs(), text_encoder_storage="auto", text_encoder_file_fp8=True,
                                 device="cuda", cuda_context_bytes=0)  # the context exists: not in the free figure
    return "keep" if choose_text_encoder_storage(inputs, detect_budget(device).bytes, parts=parts) == "float8" else "dequantize"


def resolve_caption_fp8(mode: str, device, parts: PartSizes, one_byte_file: bool = True,
                        caption_image: tuple[int, int] = (1024, 1024), caption_tokens: int = 0) -> str:
    """The captioner's `text_encoder_fp8` as its loaders take it ("keep" or "dequantize"), as `resolve_text_encoder_fp8`
    decides caching's: "auto" -> "keep" (the one-byte file's Linears kept) when the captioning phase
    (`captioning.choose_caption_storage`) would not fit the CUDA device's free memory with the model in bf16, else
    "dequantize" (always on the CPU). On a CUDA device the phase with the storage decided is then checked against the
    free memory, before anything loads: a UserInputError names what it needs and what would fit (a smaller
    image_side, the one-byte file, the CPU). `parts`: the whole vision-language model
    (`ModelFamily.planned_caption_parts`); `one_byte_file`: the file holds one-byte Linears (scaled fp8, int8);
    `caption_image`: the largest image shown (W, H) px; `caption_tokens`: the longest caption (0: the plan's
    default)."""
    import torch

    from .captioning import choose_caption_storage

    device = torch.device(device)
    if device.type != "cuda":
        return "dequantize" if mode == "auto" else mode
    inputs = dataclasses.replace(PlanInputs(), caption=True, text_encoder_storage="auto",
                                 text_encoder_file_fp8=one_byte_file, device="cuda", cuda_context_bytes=0,
                                 caption_image=caption_image,
                                 **({"caption_tokens": caption_tokens} if caption_tokens else {}))
    budget = detect_budget(device).bytes
    if mode == "auto":
        mode = "keep" if choose_caption_storage(inputs, parts, budget) == "float8" else "dequantize"
    storage = "float8" if mode == "keep" and one_byte_file else "bfloat16"
    check_caption_fits(dataclasses.replace(inputs, caption_storage=storage), parts, budget, one_byte_file)
    return mode


CAPTION_SIDES = (1024, 896, 768, 640, 512)  # the image sides a refusal tries, largest first


def check_caption_fits(inputs: PlanInputs, parts: PartSizes, budget_bytes: int, one_byte_file: bool) -> None:
    """Refuse captioning whose planned GPU peak (`captioning.caption_phase`, one image) exceeds `budget_bytes`, naming
    the changes that would fit."""
    from ..core.errors import UserInputError
    from .captioning import caption_phase

    need = caption_phase(inputs, parts).gpu_bytes
    if need <= budget_bytes:
        return
    side = next((s for s in CAPTION_SIDES if s < max(inputs.caption_image) and caption_phase(
        dataclasses.replace(inputs, caption_image=(s, s)), parts).gpu_bytes <= budget_bytes), None)
    storage = "its one-byte Linears kept" if inputs.caption_storage == "float8" else "bf16"
    fixes = [f"set image_side to {side}" if side else None,
             None if one_byte_file else "use the file's one-byte version (fp8_scaled or int8), whose Linears are kept",
             "or caption on the CPU (slow): python -m trainer_core caption --device cpu ..."]
    raise UserInputError(
        f"captioning needs {need / GIB:.2f} GiB on the GPU (the text encoder file's whole vision-language model, "
        f"{storage}, one {inputs.caption_image[0]}x{inputs.caption_image[1]} image, {inputs.caption_tokens} new "
        f"tokens: plan --caption), but {budget_bytes / GIB:.2f} GiB are free. Nothing was loaded. To fit: "
        + "; ".join(f for f in fixes if f) + ".")


class CachingPlacement:
    """Where a text encoder's tensors go when a file loader reads it for caching (`models.text_encoder_file.Placement`,
    set on a model set as `text_encoder_placement` by the families' loaders): decided when the encoder is read, for the
    device's free memory then and the caching work the model set was handed (`CachingWork`: the longest prompt, the
    largest sample's images). On a GPU the fewest decoder layers (then vision blocks) stream from host memory whose
    prompts step fits (`phases.choose_encoder_streaming`); on the CPU none do. The streamed layers' weights are read
    into host memory, everything else straight to the device (`streaming.encoder`).

    `one_byte`: the loader keeps the file's one-byte Linears (text_encoder_fp8 = keep), which streams half the bytes.
    `streamed`: the layers to stream whatever the device (tests: a CPU run streamed, against a resident one)."""

    def __init__(self, components, one_byte: bool = False, streamed=None):
        self.components = components
        self.one_byte = one_byte
        self.forced = streamed
        self.decided = None  # the StreamedLayers of the last read
        self.streams = None  # its installed EncoderStreams, while that encoder lives (until `release`)
        self.bytes_streamed = 0  # what the released encoders' streamed layers copied through their rings

    def __call__(self, encoder):
        import torch

        from ..streaming.encoder import EncoderStreams, streamed_weight_names

        device = self.components.device
        streamed = self.forced if self.forced is not None else self.choose(encoder, device)
        self.decided = streamed
        host = streamed_weight_names(encoder, streamed)
        cpu = torch.device("cpu")

        def finish(filled) -> None:
            if streamed.any:
                self.streams = EncoderStreams.install(filled, device, streamed)
            else:
                filled.to(device)

        return (lambda name: cpu if name in host else device), finish

    def release(self) -> None:
        """The model set drops its text encoder (`Components.release_text_encoder`): take its streams down. Their
        wrapped forwards and swappers hold the encoder's layer stacks, so kept here they would keep the whole encoder
        in host memory through training (the real-size rehearsal caught 8 GiB of it); on CUDA their pinned arena goes
        with them."""
        if self.streams is not None:
            self.bytes_streamed += self.streams.bytes_copied
            self.streams.uninstall()
            self.streams = None

    def choose(self, encoder, device):
        """The layers to stream on `device` for the model set's caching work (see the class docstring)."""
        import torch

        from ..core.errors import UserInputError
        from ..streaming.encoder import StreamedLayers
        from .inference import parts_for_encoder
        from .phases import choose_encoder_streaming, prompts_step_gpu_bytes

        if torch.device(device).type != "cuda":
            return StreamedLayers()
        work = self.components.caching_work
        parts = parts_for_encoder(encoder, self.components.family.planned_parts(text_encoder_file=True))
        inputs = PlanInputs(text_tokens=work.text_tokens, reference_sizes=tuple(work.image_sizes), device="cuda",
                            text_encoder_storage="float8" if self.one_byte else "bfloat16", cuda_context_bytes=0,
                            text_encoder_streamed=None)
        budget = detect_budget(device)
        decoder, vision = choose_encoder_streaming(inputs, budget.bytes, parts)
        needed = prompts_step_gpu_bytes(dataclasses.replace(inputs, text_encoder_streamed=decoder,
                                                            vision_streamed=vision), parts)
        if needed > budget.bytes:
            raise UserInputError(
                f"caching: the text encoder needs {needed / GIB:.2f} GiB of the GPU even with all its layers streamed "
                f"from host memory, and {budget.bytes / GIB:.2f} GiB are free ({budget.source}). Close other programs "
                "that use the GPU, shorten the longest caption, or use smaller control or reference images.")
        return StreamedLayers(decoder, vision)


def whole_decode_bytes(parts: PartSizes, width: int, height: int, act_bytes: int) -> int:
    """What a preview's whole (untiled) VAE decode of `width` x `height` px needs on a GPU besides the VAE's weights
    (the plan's preview phase counts the same, `phases.training_phases`)."""
    from .inference import device_decode_bytes, vae_decode_bytes

    return device_decode_bytes(vae_decode_bytes(parts, width, height, act_bytes), "cuda")


def preview_decode_in_tiles(components, width: int, height: int, memory: DeviceMemory | None = None) -> bool:
    """Whether a preview of `width` x `height` px decodes in tiles: on a GPU, when the whole image's decode and the VAE
    would not fit what the device can still give (`room_now`: the VAE's weights already there count as planned here;
    `memory`: a reading, else read now); never on the CPU (host RAM: the plan checks the whole decode)."""
    import torch

    from .inference import parts_for_components

    if components.device.type != "cuda":
        return False
    parts = parts_for_components(components)
    act = {torch.bfloat16: 2, torch.float16: 2}.get(components.compute_dtype, 4)
    needed = whole_decode_bytes(parts, width, height, act) + parts.vae_params * act
    memory = memory if memory is not None else read_device_memory(components.device)
    return not fits_now(needed, memory, counted_bytes=device_bytes_of([components.vae], components.device))
