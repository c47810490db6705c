"""Host syncs per training step, counted on the CPU the way a GPU would stall: every dispatched read of a tensor's
value (`aten._local_scalar_dense`: `.item()`, `bool()`, `float()` of a tensor) and every explicit copy to the CPU
(`core.host_read.read_to_host`). A step reads its loss, the losses' finiteness and the gradient norm in one read and
checks the LoRA after the optimizer step in one more (`core.finite.all_finite`): two per step, from four."""

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from conftest import REPO


class HostReads(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._local_scalar_dense.default or (
                func is torch.ops.aten._to_copy.default and kwargs.get("device") == torch.device("cpu")):
            self.count += 1
        return func(*args, **kwargs)


def _trainer(monkeypatch, accumulate: int, **train):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import common

    from trainer_core.core.config import LoraConfig, OptimizerConfig, TrainConfig
    from trainer_core.families.qwen_image import build_tiny_components
    from trainer_core.training import Trainer

    transformer = build_tiny_components(seed=0, storage="float32").transformer
    components, dataset = common.synthetic_setup(transformer, samples=4, latent_hw=(4, 4), text_tokens=5,
                                                 device=torch.device("cpu"), compute_dtype=torch.float32,
                                                 storage="float32")
    return Trainer(components, dataset, LoraConfig(rank=2), OptimizerConfig(optimizer="adamw8bit"),
                   TrainConfig(run_name="syncs", blocks_to_swap=0, gradient_checkpointing=False,
                               grad_accum_steps=accumulate, **train))


def test_a_step_reads_the_device_twice_whatever_its_micro_batches(monkeypatch):
    for accumulate in (1, 3):
        trainer = _trainer(monkeypatch, accumulate)
        try:
            trainer.train(1)  # the first step builds the optimizer's state
            reads = HostReads()
            with reads:
                report = trainer.train(3)
        finally:
            trainer.close()
        assert len(report.losses) == 3 and reads.count == 2 * 3, (accumulate, reads.count)

