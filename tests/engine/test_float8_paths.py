"""The float8 compute paths behind one interface (`models.float8.paths`): chosen by name, installed on the frozen
block Linears, each with its status, uninstalled to exactly the forwards they found."""

import pytest
import torch

from test_float8_activations import tiny_forward
from trainer_core.families.qwen_image import build_tiny_components
from trainer_core.models.float8 import COMPILED, EAGER, FP8_ACTIVATIONS, compute_path, frozen_block_linears, path_name

CPU = torch.device("cpu")


def test_the_training_options_name_one_path_and_both_alternatives_are_refused():
    assert path_name() == EAGER
    assert path_name(fp8_activations=True) == FP8_ACTIVATIONS
    assert path_name(compile_float8=True) == COMPILED
    with pytest.raises(ValueError, match="alternatives"):
        path_name(compile_float8=True, fp8_activations=True)
    with pytest.raises(ValueError, match="unknown float8 compute path"):
        compute_path("fast")


@pytest.mark.parametrize("storage, name, runs, status", [
    ("float8_scaled", EAGER, EAGER, None),
    ("float8_scaled", FP8_ACTIVATIONS, FP8_ACTIVATIONS,
     "fp8 activations: on, rowwise activation scales, 28 of 28 block Linears (bfloat16 compute only)"),
    ("bfloat16", FP8_ACTIVATIONS, EAGER, "fp8 activations: off (the block weights are not stored in float8)"),
    ("float8_scaled", COMPILED, EAGER, None),  # the CPU only when asked (allow_cpu)
])
def test_each_path_says_what_runs_and_uninstalls_to_the_forwards_it_found(storage, name, runs, status):
    model = build_tiny_components(seed=0, storage=storage, compute_dtype=torch.bfloat16).transformer
    linears = [lin for _, lin in frozen_block_linears(model)]
    before = [lin.__dict__.get("forward") for lin in linears]
    eager = tiny_forward(model)
    installed = compute_path(name).install(linears, CPU)
    assert (installed.name, installed.status) == (runs, status)
    assert torch.equal(tiny_forward(model), eager) == (runs == EAGER)  # float8 matmuls round otherwise
    installed.uninstall()
    assert [lin.__dict__.get("forward") for lin in linears] == before
    assert torch.equal(tiny_forward(model), eager)


def test_the_compiled_path_installs_on_the_cpu_when_asked():
    model = build_tiny_components(seed=0, storage="float8", compute_dtype=torch.bfloat16).transformer
    linears = [lin for _, lin in frozen_block_linears(model)]
    before = [lin.__dict__.get("forward") for lin in linears]
    installed = compute_path(COMPILED, allow_cpu=True).install(linears, CPU)
    if installed.name != COMPILED:
        pytest.skip("no C++ compiler for Inductor's CPU backend")
    assert all(lin.__dict__["forward"] is not f for lin, f in zip(linears, before))  # not run: nothing compiles
    installed.uninstall()
    assert [lin.__dict__.get("forward") for lin in linears] == before
