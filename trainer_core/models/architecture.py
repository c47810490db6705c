"""What the layers below the families need to know of a transformer architecture, declared by the package that brings
it, and recognised by the transformer's class (a loaded model or a meta skeleton): `architecture_of`.

The adapters ask it which Linears a LoRA preset adapts and which sit dead in the last block, how ComfyUI's LoRA files
name its modules, whether ComfyUI reads a kohya-named LoRA of it whole, which of its Linears ComfyUI's own files hold
fused; the block streaming asks whether its modulation runs inside every block; the planner asks whether its blocks are
single-stream (one joint sequence through every Linear) or dual-stream, and which Linear's width is the MLP's. Qwen-Image's
MMDiT is declared beside its facts (models/qwen_arch.py); a family whose transformer is another declares it in its own
package (families/qwen_image21/arch.py), which the family's loaders import before any model of it exists.

Pure data: no torch at module level.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class TransformerArchitecture:
    transformer_class: str  # the diffusers class name: how a transformer says which architecture it is
    # Which block Linears get a LoRA, per preset (`LoraConfig.targets`), by their names inside a block, in block order.
    lora_presets: Mapping[str, tuple[str, ...]]
    # Block Linears whose output never reaches the loss in the last block (no gradient: left out of the LoRA).
    dead_in_last_block: tuple[str, ...] = ()
    # What ComfyUI's LoRA layout puts before the module names (its key map reads this architecture's so).
    comfyui_lora_prefix: str = "diffusion_model."
    # Why a kohya-named LoRA of it is not one ComfyUI reads whole ("": it is), said when such a save is asked for.
    kohya_refusal: str = ""
    # Linears ComfyUI's own files hold fused: fused name in a block -> our Linears' names, in the order of its rows.
    fused_linears: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # Whether each block has its own modulation Linears (fed by the timestep alone: computed ahead of the blocks).
    per_block_modulation: bool = True
    # Whether its blocks run one joint sequence (prompt + image rows) through every Linear; else dual-stream.
    single_stream: bool = False
    # The Linear inside a block whose output width is the MLP's hidden width (the planner's F).
    mlp_input_linear: str = ""
    vae_scale_factor: int = 8  # pixels per latent cell along a side, of the VAE its family pairs it with


_DECLARED: dict[str, TransformerArchitecture] = {}


def declare_architecture(architecture: TransformerArchitecture) -> TransformerArchitecture:
    """Make `architecture` known by its transformer class (a package that brings one declares it when imported)."""
    known = _DECLARED.setdefault(architecture.transformer_class, architecture)
    if known != architecture:
        raise ValueError(f"two architectures declared for {architecture.transformer_class}")
    return architecture


def architecture_of(transformer) -> TransformerArchitecture:
    """The declared architecture of `transformer` (loaded, or a meta skeleton), by its class."""
    name = type(transformer).__name__
    if name not in _DECLARED:
        raise TypeError(f"no architecture is declared for {name}: the family package that trains it declares one "
                        f"(models.architecture.declare_architecture) when it is imported; known: {sorted(_DECLARED)}.")
    return _DECLARED[name]
