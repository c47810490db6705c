"""Prior preservation on Qwen-Image-Edit: the Edit Dataset's loss_weight and is_regularization, and differential
output preservation with the sample's control images as the conditions of both predictions (the family's hooks:
the class caption is encoded with the sample's controls, its rows carry them; nothing Edit-specific in the step)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from PIL import ImageOps

from conftest import api_workflow, pack_module
from graph_runner import GraphRunner
from test_edit_pipelines import control_images, small_pipeline_sizes  # noqa: F401 (fixture)
from test_edit_training import PipelineInputs, cfg, write_sample
from trainer_core.core.config import LoraConfig, OptimizerConfig, TrainConfig
from trainer_core.data.cache import build_cache
from trainer_core.core.config import EditDataConfig
from trainer_core.data.edit_dataset import load_edit_dataset
from trainer_core.families.qwen_image_edit.tiny import build_tiny_edit_components
from trainer_core.families.qwen_image_edit.variants import get_variant
from trainer_core.training import Trainer
from trainer_core.training.preservation import base_prediction, preserved_rows

TRIGGER, CLASS = "sks circle", "circle"
EDIT_WORKFLOW = api_workflow("edit")


# -- differential output preservation, against the pipelines' own pieces ------------------------------------------

def _dop_run(tmp_path, variant_name, weight):
    """A sample with the trigger and one without, same sizes (one micro-batch of both), cached with preservation;
    (the trainer, the dataset's samples, a second model set of the same weights that never gets an adapter)."""
    controls = control_images()[: min(2, get_variant(variant_name).max_controls)]
    write_sample(tmp_path / "d", "a", f"paint the {TRIGGER} red", controls, size=(96, 64))
    # Other control images of the same sizes (one micro-batch): the class row must carry the subject's own.
    write_sample(tmp_path / "d", "b", "paint the square blue", [ImageOps.invert(c) for c in controls], size=(96, 64))
    components = build_tiny_edit_components(variant_name)
    dataset = load_edit_dataset(cfg(tmp_path / "d"), EditDataConfig(control_resolution=0))  # the model's own rule
    cached = build_cache(components, list(dataset.samples), tmp_path / "cache", settings=dataset.edit,
                         preservation=(TRIGGER, CLASS))
    trainer = Trainer(components, cached, LoraConfig(rank=4, alpha=4.0, targets="all"),
                      OptimizerConfig(optimizer="adamw", learning_rate=5e-3),
                      TrainConfig(run_name="edit_dop", seed=3, blocks_to_swap=0, gradient_checkpointing=False,
                                  micro_batch_size=2, preservation_weight=weight))
    return trainer, list(dataset.samples), build_tiny_edit_components(variant_name)


@pytest.mark.parametrize("variant_name", ["edit-2511", "edit"])
def test_the_preservation_term_is_the_mse_of_adapter_on_and_off_built_from_the_pipelines_pieces(
        small_pipeline_sizes, tmp_path, variant_name):
    weight = 0.7
    trainer, samples, bare = _dop_run(tmp_path, variant_name, weight)
    try:
        variant = get_variant(variant_name)
        refs = {s.caption: PipelineInputs(bare, variant, s) for s in samples}  # bare: its text encoder is loaded
        flow, cached = trainer.built.flow, trainer.dataset
        assert [bool(s.preservation_text_key) for s in cached.samples] == [True, False]
        # The class caption is cached as the pipeline encodes it with the sample's own control images.
        subject = cached.samples[0]
        ref = refs[subject.caption]
        class_caption = subject.caption.replace(TRIGGER, CLASS)
        images = ref.conditions if variant.multi_image else ref.conditions[0]
        assert torch.equal(cached.embedding(subject.preservation_text_key),
                           ref.pipe.encode_prompt(class_caption, image=images)[0][0])

        def by_hand(batch):
            """(the flow loss, adapter-on and adapter-off predictions for the class caption) from the pieces."""
            losses, adapted, base = [], None, None
            for i, s in enumerate(batch.samples):
                ref = refs[s.caption]
                x0, noise, level = batch.x0[i:i + 1], batch.noise[i:i + 1], batch.levels[i:i + 1]
                assert torch.equal(x0, ref.x0)  # the cached target latent is the pipeline's
                prediction = ref.prediction(trainer.built.transformer, s.caption, x0, noise, level)
                losses.append(torch.nn.functional.mse_loss(prediction, ref.pack(noise - x0)))
                if s.preservation_text_key:
                    adapted = ref.prediction(trainer.built.transformer, class_caption, x0, noise, level)
                    base = ref.prediction(bare.transformer, class_caption, x0, noise, level)
            return sum(losses) / len(losses), adapted, base

        # Step 0: LoRA B is zero, so the adapter-on prediction is the base model's, and the term is exactly 0: the
        # loss does not depend on the weight, bit for bit.
        batch = flow.draw(0)
        _, adapted, base = by_hand(batch)
        assert torch.equal(adapted, base)
        with torch.no_grad():
            at_weight = flow.loss(batch)
            flow.cfg = dataclasses.replace(flow.cfg, preservation_weight=10 * weight)
            assert torch.equal(flow.loss(batch), at_weight)
            flow.cfg = dataclasses.replace(flow.cfg, preservation_weight=weight)

        trainer.train(3)  # the adapter is no longer a no-op
        batch = flow.draw(trainer.step)
        rows = preserved_rows(batch.samples, weight)
        assert len(rows) == 1 and len(batch.samples) == 2
        flow_part, adapted, base = by_hand(batch)
        with torch.no_grad():
            # The engine's base prediction (adapter switched off) is the bare model's, exactly.
            i = rows[0]
            key = batch.samples[i].preservation_text_key
            engine_base = base_prediction(trainer.built.transformer, flow.predict, batch.x0[rows], batch.noise[rows],
                                          batch.levels[rows], [cached.embedding(key)],
                                          [flow.family.conditions(cached, [batch.samples[i]])[0]], [key])
            total = flow.loss(batch)
        assert torch.equal(engine_base, base)
        term = weight * torch.nn.functional.mse_loss(adapted, base) * len(rows) / len(batch.samples)
        assert float(term) > 0
        # The step batches the class row with the training rows: equal up to the batch's rounding.
        assert float(total) == pytest.approx(float(flow_part + term), rel=1e-5)
        # The memory plan counts those rows at the image sequence with the control tokens.
        from trainer_core.families.base import conditioned_image_size as planned_image_size
        from trainer_core.planner.for_run import inputs_for_run

        plan = inputs_for_run(trainer.components, cached, trainer.lora_cfg, trainer.optim_cfg, trainer.train_cfg)
        assert (plan.batch, plan.preservation) == (4, True)
        assert (plan.width, plan.height) == planned_image_size(cached)
    finally:
        trainer.close()


# -- the Edit Dataset's loss_weight and is_regularization, mixed in the canvas, with preservation ----------------

def test_edit_datasets_weights_regularisation_and_preservation_through_the_nodes(pack, tmp_path, monkeypatch):
    """The Edit workflow with a subject set and a regularisation set (Edit Dataset: loss_weight 0.5,
    is_regularization) mixed for the Cache node, preservation on: the set's samples carry its weight and take no
    part in preservation (its captions have the trigger too), and a micro-batch of it has half its flow loss."""
    from trainer_core.families.qwen_image_edit.demo import CONTROL_RESOLUTION

    monkeypatch.setenv("QWEN_LORA_OUTPUT", str(tmp_path / "output"))
    monkeypatch.setenv("QWEN_LORA_LORAS", str(tmp_path / "loras"))
    control = control_images()[1:2]  # square: the demo's control size keeps it exactly
    write_sample(tmp_path / "subject", "a", f"paint the {TRIGGER} red", control)
    write_sample(tmp_path / "subject", "b", "paint the square red", control)
    write_sample(tmp_path / "reg", "c", f"paint the {TRIGGER} blue", control)
    prompt = json.loads(EDIT_WORKFLOW.read_text())
    prompt["1"]["inputs"].update(source="tiny test model (random weights)", compute_dtype="float32", storage="float32")
    data = dict(resolution=64, min_bucket_side=32, max_bucket_side=128, control_resolution=CONTROL_RESOLUTION)
    prompt["2"]["inputs"].update(folder=str(tmp_path / "subject"), **data)
    prompt["20"] = {"class_type": "QwenLoRAEditDataset", "inputs": {
        **prompt["2"]["inputs"], "folder": str(tmp_path / "reg"), "loss_weight": 0.5, "is_regularization": True}}
    prompt["21"] = {"class_type": "QwenLoRADatasetMix", "inputs": {"dataset_1": ["2", 0], "dataset_2": ["20", 0]}}
    prompt["3"]["inputs"].update(dataset=["21", 0], preview_prompts="paint the circle red", cache_folder="edit_prior",
                                 preservation_trigger=TRIGGER, preservation_class=CLASS)
    prompt["6"]["inputs"].update(run_name="edit_prior", blocks_to_swap=0, gradient_checkpointing=False,
                                 checkpoint_every=0, preservation_weight=1.0)
    prompt["7"]["inputs"].update(steps=2, preview_every=0, snapshot_every=0)
    prompt["8"]["inputs"].update(width=64, height=64, steps=2)
    outputs = GraphRunner(pack.NODE_CLASS_MAPPINGS).run(prompt)
    trainer = outputs["7"][0]
    try:
        cached = trainer.dataset
        fields = [(s.caption, s.dataset, s.loss_weight, s.regularization, bool(s.preservation_text_key))
                  for s in cached.samples]
        assert fields == [(f"paint the {TRIGGER} red", "subject", 1.0, False, True),
                          ("paint the square red", "subject", 1.0, False, False),
                          (f"paint the {TRIGGER} blue", "reg", 0.5, True, False)]
        assert all(s.condition_keys for s in cached.samples)  # edit samples all: their controls were cached
        assert trainer.step == 2 and "per dataset" in outputs["7"][2].splitlines()[0]
        weighting = pack_module(pack, "trainer_core.training.weighting")
        flow = trainer.built.flow
        with torch.no_grad():
            reg_batch = flow.draw(0, indices=[2])
            tally = weighting.DatasetLosses()
            loss = flow.loss(reg_batch, tally)
            (part,) = tally.report().values()
            assert (part.samples, part.weight, part.regularization) == (1, 0.5, True)
            assert float(loss) == pytest.approx(0.5 * part.mean, rel=1e-6)  # (1/B) sum w_i l_i with B = 1
            # Its flow loss unweighted: the same sample in a dataset of weight 1 (the loss as before weights).
            plain = dataclasses.replace(reg_batch, samples=[dataclasses.replace(reg_batch.samples[0], loss_weight=1.0)])
            assert float(flow.loss(plain)) == pytest.approx(part.mean, rel=1e-6)
    finally:
        trainer.close()
