"""LoRA files in every layout (the ones ComfyUI, diffusers and kohya-style trainers use): the key conventions and the
writer; the reader is lora_reading.py, on the same conventions.

The layouts' keys are written once, here, and read back by the reader from these same constants: a writer and a
reader that disagree could otherwise both pass their own tests. The adapter itself (peft
inject, its live weights) is `lora.py`; this module only turns it into file tensors and back.

Written (`lora_file_tensors`), A = lora_A (rank, in_features), B = lora_B (out_features, rank):
  comfyui (default)  diffusion_model.<module>.lora_A.weight / .lora_B.weight / .alpha (2.1: <module>.…, below)
  kohya              lora_unet_<module, '.' -> '_'>.lora_down.weight (A) / .lora_up.weight (B) / .alpha
  diffusers          transformer.<module>.lora_A.weight / .lora_B.weight, no alpha, B stored as B * alpha / rank
The ComfyUI layout is what ComfyUI's and diffusers' loaders both take (DESIGN §6); ComfyUI scales by
alpha / rank. Every file carries safetensors metadata (`lora_metadata`: rank, alpha, targets, steps,
base model; `layout_metadata`: the layout's own entries).
Why the diffusers layout folds alpha into B: diffusers 0.42.1 fails on `transformer.` keys with `.alpha`
(it prefixes them a second time, DESIGN §9), and an alpha kept only in metadata is ignored by ComfyUI,
which then applies scale 1. With alpha / rank already inside B, every loader applies the trained
strength at its default scale of 1. The trained alpha stays in the metadata (`qwen_lora.alpha`, with
`qwen_lora.lora_B_scale` = alpha / rank) so that continuing from the file restores B and alpha.

LoKr and LoHa (`lycoris.py`) are written in ComfyUI's LyCORIS keys, `diffusion_model.` (comfyui; none for 2.1,
as below) or `lora_unet_` (kohya) before the module; diffusers' loaders read no LyCORIS file, so that layout is refused.

Qwen-Image 2.1 in the comfyui layout: the bare module names (`transformer_blocks.3.img_mlp.gate_layer.lora_A.weight`,
no prefix), the MLP's gate and up LoRAs kept on their own names. ComfyUI's 2.1 model holds those two Linears fused
as `img_mlp.gate_up` when its file does (and split when its file is split), and its LoRA key map (comfy/lora.py,
the QwenImage branch) maps the bare `gate_layer` / `proj` names onto the fused weight's row halves, and onto the
split weights themselves; a `diffusion_model.` name only reaches the weights the model actually holds. So the bare
split names are the one set every ComfyUI 2.1 model matches (tests/families/test_qwen_image21_comfy_keys.py), and diffusers'
Qwen loader reads them too (bare keys with `.alpha`).

Read (`lora_reading.read_lora_file`, beside this module: the key conventions are these): those three, bare
`<module>.lora_A/B` (peft), `transformer.` with `.alpha`, and diffusers' own `lora_adapter_metadata`. Alpha comes from
`.alpha` keys, else our metadata, else diffusers' metadata, else it equals the rank (scale 1: what ComfyUI and
diffusers apply to such a file).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from ..core.config import LORA_LAYOUTS, LoraConfig
from ..core.errors import UserInputError
from ..core.files import inside
from ..core.names import check_component, fill_template
from ..models.architecture import architecture_of
from ..models.qwen_arch import BLOCKS
from . import lycoris
from .lora import adapter_weights

COMFY_PREFIX = "diffusion_model."
DIFFUSERS_PREFIX = "transformer."
KOHYA_PREFIX = "lora_unet_"
B_SCALE_KEY = "qwen_lora.lora_B_scale"  # metadata: B in the file = trained B * this

# file suffix -> (which matrix, kind); A is (rank, in), B is (out, rank).
_SUFFIXES = {
    ".lora_A.weight": "A", ".lora_B.weight": "B", ".lora_A.default.weight": "A", ".lora_B.default.weight": "B",
    ".lora_down.weight": "A", ".lora_up.weight": "B", ".alpha": "alpha",
}
# Parts of other adapter kinds (DoRA, LoCon, LoHa, LoKr, full diffs), which a plain LoRA cannot hold.
_UNSUPPORTED_SUFFIXES = (".dora_scale", ".diff", ".diff_b", ".w_norm", ".b_norm")
_UNSUPPORTED_PARTS = (".lora_mid.", ".hada_", ".lokr_")

# Qwen-Image's block Linears, to undo kohya's '.' -> '_' (module names contain '_') where no model is given.
_KOHYA_BLOCK = re.compile(BLOCKS + r"_(\d+)_(.+)")


@dataclass
class LoraFile:
    """A LoRA read from a file: what is needed to rebuild and continue the adapter."""

    path: Path
    layout: str  # "comfyui", "diffusers", "kohya" or "peft" (bare module names)
    rank: int
    alpha: float  # scale = alpha / rank
    weights: dict[str, tuple[torch.Tensor, torch.Tensor]]  # module -> (A (rank, in), B (out, rank)), B as trained
    metadata: dict[str, str] = field(default_factory=dict)
    # Keys that set how ComfyUI runs a module (`<module>.config`, uint8 JSON, e.g. a turbo LoRA's attention; ComfyUI
    # #16880): read, named in the run's status, not trained and not written into our saves.
    runtime_entries: tuple[str, ...] = ()

    @property
    def runtime_note(self) -> str | None:
        if not self.runtime_entries:
            return None
        n = len(self.runtime_entries)
        return (f"LoRA file {self.path.name} carries {n} ComfyUI runtime {'entry' if n == 1 else 'entries'} (first: "
                f"{self.runtime_entries[0]}): training uses standard attention, and the LoRAs saved here leave "
                f"{'it' if n == 1 else 'them'} out (ComfyUI loads them with no key left over)")

    @property
    def targets(self) -> list[str]:
        return list(self.weights)

    @property
    def steps(self) -> int | None:
        value = self.metadata.get("qwen_lora.steps")
        return int(value) if value and value.isdigit() else None


# --------------------------------------------------------------------------------------------------
# out


def comfyui_state_dict(transformer: nn.Module, alpha: float, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The adapter in the ComfyUI layout, tensors detached, on the CPU, in `dtype` (alpha stays fp32)."""
    prefix = comfyui_prefix(transformer)
    out = {}
    for name, (a, b) in adapter_weights(transformer).items():
        out[f"{prefix}{name}.lora_A.weight"] = a.detach().cpu().to(dtype).contiguous()
        out[f"{prefix}{name}.lora_B.weight"] = b.detach().cpu().to(dtype).contiguous()
        out[f"{prefix}{name}.alpha"] = torch.tensor(float(alpha), dtype=torch.float32)
    return out


def comfyui_prefix(transformer: nn.Module) -> str:
    """What goes before the module names in the comfyui layout: its architecture's (none for 2.1: module docstring)."""
    return architecture_of(transformer).comfyui_lora_prefix


def lora_metadata(cfg: LoraConfig, steps: int, base_model: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """safetensors metadata (strings only). `ss_network_*` are the names kohya-style tools read.

    `extra` is applied last (a file layout's own entries, see `layout_metadata`)."""
    meta = {
        "format": "comfyui-lora",
        "qwen_lora.rank": str(cfg.rank),
        "qwen_lora.alpha": repr(float(cfg.alpha)),
        "qwen_lora.targets": cfg.targets,
        "qwen_lora.steps": str(steps),
        "qwen_lora.base_model": base_model,
        "ss_network_dim": str(cfg.rank),
        "ss_network_alpha": repr(float(cfg.alpha)),
        "ss_base_model_version": "qwen_image",
        "modelspec.architecture": "qwen-image/lora",
        "qwen_lora.adapter": cfg.adapter,
    }
    if cfg.adapter != "lora":  # what kohya-style tools write for a LyCORIS network
        meta["ss_network_module"] = "lycoris.kohya"
        args = {"algo": cfg.adapter} | ({"factor": cfg.lokr_factor, "decompose_both": cfg.lokr_decompose_both}
                                        if cfg.adapter == "lokr" else {})
        meta["ss_network_args"] = json.dumps(args)
    if extra:
        meta.update({k: v if isinstance(v, str) else json.dumps(v) for k, v in extra.items()})
    return meta


def lora_file_tensors(transformer: nn.Module, rank: int, alpha: float, dtype: torch.dtype,
                      layout: str = "comfyui") -> dict[str, torch.Tensor]:
    """The live adapter as the tensors of a LoRA file in `layout` (detached, CPU, `dtype`; alpha fp32)."""
    if layout not in LORA_LAYOUTS:
        raise UserInputError(f"LoRA layout {layout!r} is not one of {list(LORA_LAYOUTS)}.")
    if layout == "kohya" and architecture_of(transformer).kohya_refusal:  # (2.1's: its fused MLP)
        raise UserInputError(architecture_of(transformer).kohya_refusal)
    if lycoris.lycoris_layers(transformer):
        if layout == "diffusers":
            raise UserInputError("LoRA layout diffusers holds plain LoRAs only: diffusers loads no LoKr or LoHa "
                                 "file. Save this adapter in the comfyui layout (ComfyUI's LoRA loaders read it) or "
                                 "kohya.")
        stem = ((lambda m: comfyui_prefix(transformer) + m) if layout == "comfyui"
                else (lambda m: KOHYA_PREFIX + m.replace(".", "_")))
        return lycoris.file_tensors(transformer, alpha, dtype, stem)
    if layout == "comfyui":
        return comfyui_state_dict(transformer, alpha, dtype)
    out = {}
    for name, (a, b) in adapter_weights(transformer).items():
        a = a.detach().to("cpu", torch.float32)
        b = b.detach().to("cpu", torch.float32)
        if layout == "diffusers":
            out[f"{DIFFUSERS_PREFIX}{name}.lora_A.weight"] = a.to(dtype).contiguous()
            out[f"{DIFFUSERS_PREFIX}{name}.lora_B.weight"] = (b * (alpha / rank)).to(dtype).contiguous()
        elif layout == "kohya":
            stem = KOHYA_PREFIX + name.replace(".", "_")
            out[f"{stem}.lora_down.weight"] = a.to(dtype).contiguous()
            out[f"{stem}.lora_up.weight"] = b.to(dtype).contiguous()
            out[f"{stem}.alpha"] = torch.tensor(float(alpha), dtype=torch.float32)
    return out


def layout_metadata(layout: str, rank: int, alpha: float) -> dict[str, str]:
    """Metadata entries that describe how `layout` stores the adapter."""
    meta = {"qwen_lora.layout": layout}
    if layout == "diffusers":
        meta[B_SCALE_KEY] = repr(alpha / rank)
        meta["ss_network_alpha"] = repr(float(rank))  # what the file holds: scale 1
    if layout != "comfyui":
        meta["format"] = f"{layout}-lora"
    return meta


# Bytes a LoRA file name leaves free for the temporary file written beside it ('.<name>.<pid>.tmp').
TEMP_NAME_ROOM = 32


def lora_output_path(loras_dir: Path, filename: str, run_name: str, step: int) -> Path:
    """`filename` (with {run_name}/{step} filled in, nothing else evaluated) as a .safetensors path inside
    `loras_dir`: every folder and the file name portable, no link out of `loras_dir`."""
    # Not stripped: the file is named as typed, or refused (a trailing space or dot by check_component below).
    name = fill_template(filename, "filename", run_name=run_name, step=f"{step:06d}")
    stem = name.replace("\\", "/").rsplit("/", 1)[-1]
    stem = stem[: -len(".safetensors")] if stem.endswith(".safetensors") else stem
    if stem.strip() in ("", ".", ".."):  # ('..' would become the hidden file '...safetensors')
        raise UserInputError(
            f"filename={filename!r} names no file: give the LoRA a name, for example 'qwen/{{run_name}}_{{step}}'."
        )
    check_component(stem, "filename", filename)  # 'name.' or 'name ' before .safetensors: Windows drops those
    if not name.endswith(".safetensors"):
        name += ".safetensors"
    return inside(loras_dir, name, "filename", "qwen/{run_name}_{step}", suffix_room=TEMP_NAME_ROOM)
