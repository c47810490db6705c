"""Reading a LoRA on a Linear ComfyUI's files hold fused as the two LoRAs we train on its halves (an architecture's
`fused_linears`, models/architecture.py: Qwen-Image 2.1's MLP input projection `img_mlp.gate_up`).

ComfyUI's 2.1 model may hold the gate and up projections as one Linear `gate_up` (rows [gate_layer; proj]); our
own files name the two halves (lora_files.py: ComfyUI's key map addresses them), but a file that names `gate_up`
(another trainer's, or ours before the halves were written) is read here. Two LoRAs (A_g, B_g) and (A_p, B_p) of
rank r and scale alpha / r are exactly one LoRA of rank 2r on the fused Linear:
    A = [A_g; A_p]              (2r, in)       the down-projections stacked
    B = [[B_g, 0], [0, B_p]]    (2 out, 2r)    block-diagonal up-projection
    alpha' = 2 alpha            so alpha' / 2r = alpha / r (ComfyUI scales by alpha / rank)
since B A = [B_g A_g; B_p A_p]. Reading such a file splits A's halves and B's diagonal blocks; a fused LoRA
whose B is not block-diagonal has no rank-r split and is refused by name.

Shapes: A (rank, in_features), B (out_features, rank), as peft keeps them.
"""

from __future__ import annotations

import torch

from ..core.errors import UserInputError


def split_fused_pair(module: str, fused: str, halves: tuple[str, str], a: torch.Tensor, b: torch.Tensor,
                     source: str) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """One pair on the fused Linear `module` (its name in a block: `fused`; A (2r, in), B (2 out, 2r)) -> the pairs of
    rank r on its `halves` (the gate_layer and proj of 2.1's `gate_up`)."""
    rank, out = a.shape[0] // 2, b.shape[0] // 2
    if a.shape[0] % 2 or b.shape[0] % 2 or b[:out, rank:].any() or b[out:, :rank].any():
        raise UserInputError(f"LoRA file {source}: {module} is a LoRA on the fused MLP whose up-projection is not "
                             "block-diagonal, so it is not two LoRAs of half its rank on gate_layer and proj; it "
                             "cannot be continued here. Choose a LoRA trained on the split MLP.")
    block = module[: -len(fused)]
    return {block + halves[0]: (a[:rank], b[:out, :rank]), block + halves[1]: (a[rank:], b[out:, rank:])}
