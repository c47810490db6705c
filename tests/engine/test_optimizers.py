"""Every optimizer: resumed bit-exactly from a checkpoint, its state through the checkpoint's flattening and
back, schedule-free AdamW's averaged weights in previews and saves, Kahan summation keeping a bf16 LoRA's
small updates, and automagic held to its published description (trainer_core/training/automagic.py)."""

import json

import pytest
import torch

from conftest import cached_demo
from trainer_core.training import checkpoint as ckpt
from trainer_core.training.automagic import LR_BUMP, MAX_LR, MIN_LR, Automagic
from trainer_core.core.config import LoraConfig, OptimizerConfig, TrainConfig, choices
from trainer_core.core.errors import UserInputError
from trainer_core.adapters.lora_files import lora_file_tensors
from trainer_core.families.qwen_image import build_tiny_components
from trainer_core.training.optim import RUNNING_GROUP_VALUES, build_optimizer, evaluation_weights, load_state
from trainer_core.training import Trainer

OPTIMIZERS = choices(OptimizerConfig, "optimizer")


def settings(name: str, **kw) -> OptimizerConfig:
    return OptimizerConfig(**{"optimizer": name, "learning_rate": 1.0 if name == "prodigy" else 1e-3, **kw})


def make(tmp_path, demo_folder, cache, name, dtype="float32", run="run", **optimizer):
    """A trainer on the seed-0 tiny model. `cache`: the session's shared cache folder (conftest.tiny_cache; its
    entries are content-addressed): encoding the demo dataset again for every trainer was most of this file's
    time, and no test here is about the cache."""
    components = build_tiny_components(seed=0, storage="float32")
    cached = cached_demo(components, demo_folder, cache)
    return Trainer(components, cached, LoraConfig(rank=4, alpha=4.0, dtype=dtype),
                   settings(name, **{"warmup_steps": 2, **optimizer}), TrainConfig(seed=1), run_dir=tmp_path / run)


def same(a, b, where="state") -> None:
    """Equal nested state: tensors bit for bit (and dtype), plain values exactly (a tuple may come back a list)."""
    if torch.is_tensor(a):
        assert torch.is_tensor(b) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for k in a:
            same(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{where}/{i}")
    else:
        assert a == b, (where, a, b)


def state_equal(a: torch.optim.Optimizer, b: torch.optim.Optimizer) -> None:
    same(a.state_dict(), b.state_dict())


@pytest.mark.parametrize("name,dtype", [(n, "float32") for n in OPTIMIZERS] +
                         [("adamw_kahan", "bfloat16"), ("automagic", "bfloat16"), ("came", "bfloat16")])
def test_every_optimizer_resumes_bit_exactly(demo_folder, tiny_cache, tmp_path, name, dtype):
    """4 steps in one go == 2 steps, a checkpoint, a new trainer resumes, 2 more: LoRA and optimizer state bit
    for bit. The split run also saves and previews its LoRA (a LoRA file's tensors, the validation path) in
    between: for schedule-free AdamW that swaps to the averaged weights and back, which must change nothing."""
    whole = make(tmp_path / "whole", demo_folder, tiny_cache, name, dtype)
    untrained = [p.detach().clone() for p in whole.built.params]
    whole.train(4)
    split = make(tmp_path / "split", demo_folder, tiny_cache, name, dtype)
    split.train(1)
    split.lora_state_dict()
    split.train(1)
    split.close()  # one trainer per run folder
    again = make(tmp_path / "split", demo_folder, tiny_cache, name, dtype)
    assert again.resume() and again.step == 2
    again.train(2)
    assert all(torch.equal(a, b) for a, b in zip(whole.built.params, again.built.params))
    assert any(not torch.equal(a, b) for a, b in zip(whole.built.params, untrained)), "training changed nothing"
    state_equal(whole.built.optimizer, again.built.optimizer)


# Every hyper-parameter a group holds, changed (warmup_steps 0: Prodigy's warm-up safeguard goes off).
CHANGED = dict(beta1=0.5, beta2=0.9, eps=1e-6, weight_decay=0.3, warmup_steps=0)


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_a_resumed_optimizer_steps_with_the_new_settings_and_its_own_running_values(demo_folder, tiny_cache, tmp_path,
                                                                                    name):
    """Before: torch's load_state_dict restored the checkpoint's parameter groups whole, so a resume with other betas,
    eps, weight decay or Prodigy safeguard stepped with the old ones (only the learning rate was set again). Now
    every group entry is the new settings' (as a new optimizer of them has it), except the optimizer's own running
    values (Prodigy's d estimate and step count, schedule-free's average weights, automagic's starting rate, optimi's
    step and first-step decisions), which are the checkpoint's; the status says what changed. Schedule-free AdamW
    keeps its beta1 for the run (the next test)."""
    first = make(tmp_path, demo_folder, tiny_cache, name)
    first.train(2)
    before = dict(first.built.optimizer.param_groups[0])
    first.close()
    changed = {k: v for k, v in CHANGED.items() if not (name == "schedulefree_adamw" and k == "beta1")}
    again = make(tmp_path, demo_folder, tiny_cache, name, **changed)
    assert again.resume() and again.step == 2
    new = build_optimizer([torch.nn.Parameter(torch.zeros(2, 2))], settings(name, **changed)).param_groups[0]
    group = again.built.optimizer.param_groups[0]
    running = RUNNING_GROUP_VALUES.get(name, ())
    for key in group.keys() - {"params"}:
        expected = before[key] if key in running else new[key]
        same(group[key], expected, key)
    assert group["weight_decay"] == 0.3 and group["weight_decay"] != before["weight_decay"]
    if "betas" in group:
        assert tuple(group["betas"][:2]) == (changed.get("beta1", 0.9), 0.9)
    if name == "prodigy":
        assert before["safeguard_warmup"] and not group["safeguard_warmup"] and group["d"] == before["d"]
    note = next(n for n in again.resume_notes if n.startswith("the optimizer settings changed"))
    assert "weight_decay 0.01 -> 0.3" in note and "they apply from step 3 on" in note
    again.train(1)  # steps with them
    again.close()


def test_schedule_free_adamw_keeps_its_beta1_for_the_run(demo_folder, tiny_cache, tmp_path):
    """Its training weights are the interpolation of its average and its iterate by beta1: another beta1 would
    average the same weights differently. The checkpoint is refused, naming beta1 and both values; a live run keeps
    training untouched (registry.setting_conflicts holds it to the same rule)."""
    from trainer_core.runs.registry import open_run, release

    components = build_tiny_components(seed=0, storage="float32")
    cached = cached_demo(components, demo_folder, tiny_cache)

    def opened(**optimizer):
        return open_run(components, cached, LoraConfig(rank=4, alpha=4.0), settings("schedulefree_adamw", **optimizer),
                        TrainConfig(seed=1, run_name="sf"), run_dir=tmp_path / "sf").trainer

    live = opened()
    live.train(1)
    with pytest.raises(UserInputError, match=r"is training \(step 1\) with other settings: beta1: running 0\.9, now "
                                             r"0\.5\. Change them back"):
        opened(beta1=0.5)
    assert live.live and opened() is live
    release("sf")
    with pytest.raises(UserInputError, match=r"does not match these settings: beta1: checkpoint 0\.9, now 0\.5\. "
                                             r"Change them back to continue that run"):
        opened(beta1=0.5)


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_state_survives_the_checkpoints_flattening_and_json(name):
    """flatten_state -> JSON -> unflatten_state -> load_state_dict gives the same state (tensors, dtypes and the
    plain values: Prodigy's d estimates, schedule-free's train_mode and weight sum, CAME's eps pair) and the
    next step is the same."""
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(8, 600, dtype=torch.bfloat16)), torch.nn.Parameter(torch.randn(40, 8))]
    opt = build_optimizer(params, settings(name))
    for _ in range(3):
        for p in params:
            p.grad = torch.randn_like(p)
        opt.step()
    tensors, skeleton = ckpt.flatten_state(opt.state_dict())
    skeleton = json.loads(json.dumps(skeleton))
    copies = [torch.nn.Parameter(p.detach().clone()) for p in params]
    loaded = build_optimizer(copies, settings(name))
    load_state(loaded, ckpt.unflatten_state({k: v.clone() for k, v in tensors.items()}, skeleton), name)
    state_equal(opt, loaded)
    for p, q in zip(params, copies):  # each its own gradient tensor: some libraries change it in place
        p.grad = torch.randn_like(p)
        q.grad = p.grad.clone()
    opt.step()
    loaded.step()
    assert all(torch.equal(p, q) for p, q in zip(params, copies))


def test_schedule_free_previews_and_saves_see_its_averaged_weights(demo_folder, tiny_cache, tmp_path):
    """Schedule-free AdamW trains at y, between its average x and its iterate z; a LoRA file and validation see
    x (what the library's eval() sets), and training continues from y exactly."""
    t = make(tmp_path, demo_folder, tiny_cache, "schedulefree_adamw")
    t.train(3)
    y = [p.detach().clone() for p in t.built.params]
    beta1 = t.built.optimizer.param_groups[0]["betas"][0]
    x = [p.lerp(t.built.optimizer.state[p]["z"], 1 - 1 / beta1) for p in t.built.params]
    with evaluation_weights(t.built.optimizer):
        assert all(torch.equal(p, e) for p, e in zip(t.built.params, x))
        at_x = {k: v.clone()
                for k, v in lora_file_tensors(t.built.transformer, 4, 4.0, torch.float32, "comfyui").items()}
    saved = t.lora_state_dict(torch.float32)
    assert saved.keys() == at_x.keys() and all(torch.equal(saved[k], at_x[k]) for k in saved)
    at_y = lora_file_tensors(t.built.transformer, 4, 4.0, torch.float32, "comfyui")
    assert any(not torch.equal(saved[k], at_y[k]) for k in saved)
    assert all(torch.equal(p, q) for p, q in zip(t.built.params, y)) and t.built.optimizer.param_groups[0]["train_mode"]


def test_kahan_summation_keeps_a_bfloat16_loras_small_updates():
    """Steps of ~1e-4 on a weight of 1.0 are below half a bfloat16 step there (2**-8): torch AdamW on bf16
    weights loses every one; optimi's AdamW with Kahan summation ends within one bf16 step of float32 AdamW."""
    def run(name, dtype):
        p = torch.nn.Parameter(torch.ones(64, dtype=dtype))
        opt = build_optimizer([p], settings(name, learning_rate=1e-4, weight_decay=0.0))
        for _ in range(200):
            p.grad = torch.ones_like(p)
            opt.step()
        return p.detach().float()

    reference = run("adamw", torch.float32)
    assert torch.allclose(reference, torch.full((64,), 1 - 200e-4), atol=1e-5)
    assert torch.equal(run("adamw", torch.bfloat16), torch.ones(64))
    assert (run("adamw_kahan", torch.bfloat16) - reference).abs().max() <= 2 ** -7


def test_automagic_follows_its_description():
    """Per-value rates start at lr, rise by lr_bump while an update keeps its sign, fall by lr_bump when it
    flips, stay within [min_lr, max_lr]; the Adafactor update (factored second moment) is clipped to RMS 1, so
    a rank-1 gradient moves every value by exactly its rate against the gradient's sign."""
    lr = 1e-5
    a, b = torch.tensor([1.0, -2.0, 3.0]), torch.tensor([0.5, -1.0, 2.0, 4.0])
    grad = torch.outer(a, b)
    p = torch.nn.Parameter(torch.zeros(3, 4))
    opt = Automagic([p], lr=lr)
    p.grad = grad.clone()
    opt.step()
    # g^2 is rank 1, so the factored estimate is exact: update = sign(g) / sqrt(1 - beta2), clipped to RMS 1
    assert torch.allclose(p.detach(), -lr * grad.sign(), rtol=1e-6, atol=0)
    rates = [lr]
    for _ in range(5):  # the same sign each step: +lr_bump per step after the first
        before = p.detach().clone()
        opt.step()
        rates.append(rates[-1] + LR_BUMP)
        assert torch.allclose(opt.state[p]["lr_mask"], torch.full((3, 4), rates[-1]), rtol=1e-6, atol=0)
        assert torch.allclose(before - p.detach(), rates[-1] * grad.sign(), rtol=1e-4, atol=0)
    mask = opt.state[p]["lr_mask"].clone()
    p.grad = -grad
    opt.step()  # the sign flips everywhere: -lr_bump
    assert torch.allclose(opt.state[p]["lr_mask"], mask - LR_BUMP, rtol=1e-6, atol=0)
    for _ in range(30):  # flipping every step: down to min_lr and no lower
        p.grad = -p.grad
        opt.step()
    assert torch.equal(opt.state[p]["lr_mask"], torch.full((3, 4), MIN_LR))
    big = Automagic([q := torch.nn.Parameter(torch.zeros(5))], lr=MAX_LR - LR_BUMP / 2)
    for _ in range(3):
        q.grad = torch.ones(5)
        big.step()
    assert torch.equal(big.state[q]["lr_mask"], torch.full((5,), MAX_LR))


def test_float32_state_of_a_bfloat16_lora_stays_float32_through_loading():
    """automagic's rates (and CAME's moments) are float32 for bf16 weights; torch's load_state_dict casts them."""
    p = torch.nn.Parameter(torch.ones(4, 8, dtype=torch.bfloat16))
    opt = Automagic([p], lr=1e-5)
    for _ in range(3):
        p.grad = torch.ones_like(p)
        opt.step()
    again = Automagic([p], lr=1e-5)
    load_state(again, opt.state_dict(), "automagic")  # torch alone would cast the rates to bfloat16
    assert again.state[p]["lr_mask"].dtype == torch.float32
    assert torch.equal(again.state[p]["lr_mask"], opt.state[p]["lr_mask"])


def test_prodigy_with_an_adamw_learning_rate_is_refused():
    with pytest.raises(UserInputError, match="learning_rate to 1.0"):
        OptimizerConfig(optimizer="prodigy", learning_rate=1e-4)


@pytest.mark.parametrize("lr", [1e-8, 0.01, 1.0])
def test_automagic_at_a_learning_rate_outside_its_bounds_is_refused(lr):
    """Before: accepted; the first step ran at it, every later one at a bound (the per-value rates are clamped to
    min_lr..max_lr from their first bump on), while the progress line showed the asked rate throughout."""
    with pytest.raises(UserInputError, match=rf"automagic with learning_rate={lr}: .* within 1e-07\.\.0\.001"):
        OptimizerConfig(optimizer="automagic", learning_rate=lr)
    for inside in (MIN_LR, 1e-5, MAX_LR):
        OptimizerConfig(optimizer="automagic", learning_rate=inside)
