"""The model-family seam: the shared engine asks the family, never what a sample or a model set happens to carry.

Read from the source with `ast` (as test_layout.py), so nothing is imported or built.
"""

from __future__ import annotations

import ast

from conftest import REPO

# Where samples and model sets are used: the cache, the training step, the memory plan, previews, the demo and
# the nodes that hand them over.
SHARED_PATH = ("trainer_core/data/cache.py", "trainer_core/families/sampling.py", "trainer_core/runs/demo.py",
               "trainer_core/planner/for_run.py", "trainer_core/planner/inference.py", "nodes/data_nodes.py",
               "nodes/output_nodes.py", "nodes/train_nodes.py",
               *sorted(str(p.relative_to(REPO)) for p in (REPO / "trainer_core" / "training").glob("*.py")))
PROBED = {"s", "sample", "samples", "components", "models", "dataset", "cached"}


def _probed_name(node: ast.AST) -> str | None:
    """'sample' for `sample` or `self.sample`-like objects the engine must not probe, else None."""
    if isinstance(node, ast.Name) and node.id in PROBED:
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in ("self", "trainer") \
            and node.attr in PROBED:
        return f"{node.value.id}.{node.attr}"
    return None


def test_the_shared_engine_probes_no_sample_model_set_or_dataset():
    found = []
    assert "trainer_core/training/step.py" in SHARED_PATH  # the training step is read
    for path in SHARED_PATH:
        for node in ast.walk(ast.parse((REPO / path).read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
                    and node.args and _probed_name(node.args[0])):
                found.append(f"{path}:{node.lineno} {node.func.id}({_probed_name(node.args[0])}, ...)")
    assert not found, found


def test_no_module_probes_a_sample_or_model_set_for_a_named_attribute():
    """Nor do the families themselves: a family knows its own sample classes (isinstance), so nothing anywhere asks
    `getattr(sample, "controls", ())` whether a sample happens to carry something. (Copying a dataclass's fields by
    a variable name, `getattr(s, f)`, is not a probe.)"""
    found = []
    for path in sorted((REPO / "trainer_core").rglob("*.py")) + sorted((REPO / "nodes").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
                    and len(node.args) >= 2 and _probed_name(node.args[0])
                    and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
                found.append(f"{path.relative_to(REPO)}:{node.lineno} {node.func.id}({_probed_name(node.args[0])}, "
                             f"{node.args[1].value!r})")
    assert not found, found


def test_the_demo_models_are_the_registered_families():
    from trainer_core.families import family_names, get_family
    from trainer_core.runs.cli import DEMO_MODELS

    # qwen-image-shapes: a model (the shipped one) of qwen-image; aliases name a family too (edit-auto: the Edit variant
    # read from the files, Edit-2511 without them; qwen-image-2512: Qwen-Image's files under 2512's names)
    assert set(DEMO_MODELS) - {"qwen-image-shapes"} == set(family_names(aliases=True))
    assert all(name == get_family(name).name for name in family_names())
    assert get_family("edit-auto") is get_family("edit-2511") and get_family("qwen-image-2512") is get_family("qwen-image")


def test_a_cache_of_another_kind_of_family_is_refused_and_variants_share_theirs(tmp_path):
    import pytest

    from trainer_core.data.cache import CachedDataset
    from trainer_core.core.errors import UserInputError
    from trainer_core.families import get_family

    def cached(family):
        return CachedDataset(cache_dir=tmp_path, samples=[], prompt_keys={}, vae_fingerprint="", text_fingerprint="",
                             family=family)

    with pytest.raises(UserInputError, match="cached for the model family qwen-image, but the model trained is edit-2511"):
        get_family("edit-2511").check_cached(cached("qwen-image"))
    with pytest.raises(UserInputError, match="model family edit, but the model trained is qwen-image"):
        get_family("qwen-image").check_cached(cached("edit"))
    get_family("edit-2511").check_cached(cached("edit-2509"))
    get_family("qwen-image").check_cached(cached("qwen-image"))


def test_the_trainer_refuses_a_text_to_image_cache_for_an_edit_model(tiny_cache, demo_folder):
    import pytest

    from conftest import cached_demo
    from trainer_core.core.config import LoraConfig, OptimizerConfig, TrainConfig
    from trainer_core.core.errors import UserInputError
    from trainer_core.families import get_family
    from trainer_core.training import Trainer

    cached = cached_demo(get_family("qwen-image").tiny_components(), demo_folder, tiny_cache)
    with pytest.raises(UserInputError, match="cached for the model family qwen-image, but the model trained is edit"):
        Trainer(get_family("edit").tiny_components(), cached, LoraConfig(rank=4), OptimizerConfig(),
                TrainConfig(run_name="mismatch", blocks_to_swap=0))


def test_a_model_set_is_built_with_its_family():
    """models/ reads Qwen-Image's files and knows no family (it sits below them): its loaders and builders take the
    family their caller says the files are, so no model set without one exists outside a loader's internals."""
    import pytest

    from trainer_core.families.qwen_image import QWEN_IMAGE, build_tiny_components
    from trainer_core.models.tiny import build_tiny_components as build_of_models

    assert build_tiny_components().family is QWEN_IMAGE
    with pytest.raises(TypeError, match="family"):
        build_of_models()
    assert build_of_models(family=QWEN_IMAGE).family is QWEN_IMAGE
