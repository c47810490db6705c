"""automagic: Adafactor's update with a learning rate per weight value that adjusts itself.

No kept library has it (pytorch-optimizer 4.1.0 does not; its home is ostris/ai-toolkit, in
toolkit/optimizers/automagic.py, which diffusion-pipe also ships). Written here from that description, not
from its code:
- the second moment is Adafactor's (Shazeer & Stern 2018, "Adafactor", §3 and §5): for a matrix, running
  means of the squared gradient (+ eps) over its rows and over its columns, decayed by beta2, whose outer
  product divided by the mean of the row means stands in for the full matrix; the update gradient /
  sqrt(second moment) is scaled down to an RMS of at most `clip_threshold`;
- every weight value has its own learning rate, starting at `lr`: after each step it rises by `lr_bump` where
  the update has the sign of the previous step's update and falls by `lr_bump` where the sign flipped, kept
  within [min_lr, max_lr] (a direction that keeps agreeing is taken faster; an oscillating one slower);
- defaults as published: min_lr 1e-7, max_lr 1e-3, lr_bump 1e-6, beta2 0.999, clip_threshold 1.0.
Our learning-rate schedule (warm-up, cosine) multiplies the per-value rates by group["lr"] / the starting lr.
Weight decay is decoupled: each value shrinks by its own rate x weight_decay.
"""

from __future__ import annotations

import torch

from ..core.config import AUTOMAGIC_MAX_LR, AUTOMAGIC_MIN_LR

MIN_LR, MAX_LR, LR_BUMP = AUTOMAGIC_MIN_LR, AUTOMAGIC_MAX_LR, 1e-6
BETA2, CLIP_THRESHOLD, EPS = 0.999, 1.0, 1e-30


class Automagic(torch.optim.Optimizer):
    """State per parameter (all float32 whatever the weights' dtype, so the per-value rates keep their small
    bumps): `lr_mask` (one rate per value), `last_sign` (bool per value), `row`/`col` (matrices) or `v`
    (vectors), `step` (an int). Load it with `optim.load_state`, which keeps them float32."""

    def __init__(self, params, lr: float = 1e-6, min_lr: float = MIN_LR, max_lr: float = MAX_LR,
                 lr_bump: float = LR_BUMP, beta2: float = BETA2, clip_threshold: float = CLIP_THRESHOLD,
                 weight_decay: float = 0.0):
        defaults = dict(lr=lr, initial_lr=lr, min_lr=min_lr, max_lr=max_lr, lr_bump=lr_bump, beta2=beta2,
                        clip_threshold=clip_threshold, weight_decay=weight_decay)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            scale = group["lr"] / group["initial_lr"]  # the schedule's factor for this step
            for p in group["params"]:
                if p.grad is not None:
                    self._update(p, group, scale)
        return loss

    def _update(self, p: torch.Tensor, group: dict, scale: float) -> None:
        grad = p.grad.float()
        state = self.state[p]
        factored = grad.dim() >= 2
        if not state:
            state["step"] = 0
            state["lr_mask"] = torch.full_like(grad, group["initial_lr"])
            state["last_sign"] = torch.zeros_like(grad, dtype=torch.bool)
            if factored:
                state["row"] = grad.new_zeros(grad.shape[:-1])
                state["col"] = grad.new_zeros(grad.shape[:-2] + grad.shape[-1:])
            else:
                state["v"] = torch.zeros_like(grad)
        state["step"] += 1
        beta2 = group["beta2"]
        squared = grad.square().add_(EPS)
        if factored:
            row, col = state["row"], state["col"]
            row.mul_(beta2).add_(squared.mean(dim=-1), alpha=1 - beta2)
            col.mul_(beta2).add_(squared.mean(dim=-2), alpha=1 - beta2)
            # rsqrt(row_i col_j / mean(row)) = rsqrt(row_i / mean(row)) * rsqrt(col_j)
            row_factor = (row / row.mean(dim=-1, keepdim=True)).rsqrt_().unsqueeze(-1)
            update = grad * row_factor * col.rsqrt().unsqueeze(-2)
        else:
            v = state["v"]
            v.mul_(beta2).add_(squared, alpha=1 - beta2)
            update = grad * v.rsqrt()
        rms = update.square().mean().sqrt()
        update.div_((rms / group["clip_threshold"]).clamp_(min=1.0))

        sign = update > 0
        lr_mask = state["lr_mask"]
        if state["step"] > 1:  # the first step has no earlier sign to agree with
            bump = torch.where(sign == state["last_sign"], group["lr_bump"], -group["lr_bump"])
            lr_mask.add_(bump).clamp_(group["min_lr"], group["max_lr"])
        state["last_sign"] = sign

        rate = lr_mask * scale
        new = p.float()
        if group["weight_decay"]:
            new.sub_(new * rate * group["weight_decay"])
        new.sub_(update * rate)
        p.copy_(new)
