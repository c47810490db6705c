"""The model-family seam: the shared engine asks the family, never what a sample or a model set happens to carry.

Read from the source with `ast` (as test_layout.py), so nothing is imported or built.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

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
    from trainer_core.runs.cli import demo_models

    # qwen-image-shapes: a model (the shipped one) of qwen-image; aliases name a family too (edit-auto: the Edit variant
    # read from the files, Edit-2511 without them; qwen-image-2512: Qwen-Image's files under 2512's names)
    assert set(demo_models()) - {"qwen-image-shapes"} == set(family_names(aliases=True))
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


# ---------------------------------------------------------------------------------------------------
# the seam closed (issue 40): a family is one package, nothing outside the families names one

FAMILY_PACKAGES = ("qwen_image", "qwen_image21", "qwen_image_edit", "qwen_image_layered")  # families/<package>/


def _family_of(path) -> str | None:
    parts = path.relative_to(REPO).parts
    return parts[2] if parts[:2] == ("trainer_core", "families") and parts[2] in FAMILY_PACKAGES else None


def test_the_built_in_families_are_the_registered_packages():
    from trainer_core.families import registry

    assert {r.module.lstrip(".") for r in registry._REGISTERED} == set(FAMILY_PACKAGES)
    assert all((REPO / "trainer_core" / "families" / p / "__init__.py").is_file() for p in FAMILY_PACKAGES)


def test_no_family_imports_another():
    """What two families share (the edit dataset convention, the demo's shapes, the preview transformer wrapper, the
    Qwen-VL processor) lives below them or in the seam's own modules, never in a sibling (every import, also those in
    functions)."""
    from test_layout import _imports

    found = []
    for path in sorted((REPO / "trainer_core" / "families").rglob("*.py")):
        own = _family_of(path)
        if own is None:
            continue
        files, _ = _imports(path, module_level_only=False)
        found += [f"{path.relative_to(REPO)} -> {f.relative_to(REPO)}" for f in files if _family_of(f) not in (None, own)]
    assert not found, found


def _code_strings(tree) -> list:
    """The string constants of a module that are code, not docstrings."""
    docs = {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body
            and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [n for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs]


def test_no_module_outside_the_families_names_one():
    """The engine below and beside the families (models, adapters, data, streaming, planner, training, devtools, runs)
    and the nodes import no family's package and spell no family's name or alias in code: they ask the registry, the
    model set's family or a transformer's architecture. Two exceptions, by what they are: the word "edit", which is
    the plain Qwen-Image-Edit's name and also the run file's [edit] table and the edit dataset convention's kind; and
    the Load Edit node's edit_variant choices (core/choices.py), the Edit variants' names as its widget lists them
    (checked against the Edit family's variants below)."""
    from trainer_core.families import family_names

    names = set(family_names(aliases=True)) - {"edit"}
    found = []
    for path in sorted([*(REPO / "trainer_core").rglob("*.py"), *(REPO / "nodes").rglob("*.py")]):
        relative = path.relative_to(REPO)
        if relative.parts[:2] == ("trainer_core", "families"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                modules += [f"{node.module}.{a.name}" for a in node.names] if isinstance(node, ast.ImportFrom) else []
                if any(set(m.split(".")) & set(FAMILY_PACKAGES) for m in modules):
                    found.append(f"{relative}:{node.lineno} imports {modules[0]}")
        allowed = {"EDIT_VARIANT_CHOICES"} if relative == Path("trainer_core/core/choices.py") else set()
        spelled = [n for n in _code_strings(tree) if n.value in names]
        if allowed:
            spelled = [n for n in spelled if not any(isinstance(a, ast.Assign) and a.targets[0].id in allowed
                                                     and a.lineno <= n.lineno <= a.end_lineno for a in tree.body)]
        found += [f"{relative}:{n.lineno} spells {n.value!r}" for n in spelled]
    assert not found, found


def test_the_load_edit_nodes_variants_are_the_edit_familys():
    from trainer_core.core.choices import EDIT_VARIANT_CHOICES
    from trainer_core.families.qwen_image_edit.variants import AUTO, EDIT_VARIANTS

    assert EDIT_VARIANT_CHOICES == (AUTO, *EDIT_VARIANTS)


def test_no_node_decides_what_a_family_decides():
    """The nodes present; the engine decides: no node compares a model set's family (by name or class) or checks an
    instance against a family's class; which previews take control images, which family loads a Load node's files,
    how a dataset of a kind is read are the families' answers (`takes_condition_images`, `families.loading`,
    `family_for_dataset`)."""
    found = []
    for path in sorted((REPO / "nodes").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Compare):
                for operand in (node.left, *node.comparators):
                    chain = ast.unparse(operand)
                    if chain.endswith((".family", ".family.name")):
                        found.append(f"{path.relative_to(REPO)}:{node.lineno} compares {chain}")
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance"
                    and "Family" in ast.unparse(node.args[1]) + ast.unparse(node.args[0])):
                found.append(f"{path.relative_to(REPO)}:{node.lineno} {ast.unparse(node)}")
    assert not found, found


def test_where_diffusers_predates_qwen_image_21_the_others_load_and_21_is_refused_by_name(tiny_files, tmp_path):
    """The registry imports every family package; requirements.txt's floor (diffusers 0.37) has no 2.1 classes, so the
    2.1 package names them only where it uses them, and a 2.1 file is refused saying which diffusers it needs. Checked
    in a fresh process whose diffusers hides every 2.1 name."""
    from trainer_core.families import get_family

    files21 = get_family("qwen-image-2.1").export_tiny(tmp_path / "tiny21", layout="comfyui")
    script = f"""
import diffusers
lazy = type(diffusers)
found = lazy.__getattr__
def hidden(module, name):
    if "QwenImage21" in name or "qwenimage21" in name:
        raise AttributeError(name)
    return found(module, name)
lazy.__getattr__ = hidden

from trainer_core.core.errors import UserInputError
from trainer_core.families.loading import LoadRequest, load_model_set
from trainer_core.families.registry import family_names, get_family, packages
from trainer_core.models.source import FILES

packages()
print(sorted(get_family(n).name for n in family_names()))
get_family("qwen-image").planned_arch()
components = load_model_set(LoadRequest(source=FILES, device="cpu", storage="bfloat16",
                                        transformer={str(tiny_files["transformer_bf16"])!r},
                                        text_encoder={str(tiny_files["text_encoder_bf16"])!r},
                                        vae={str(tiny_files["vae"])!r}, tokenizer={str(tiny_files["tokenizer"])!r}))
print("loaded", components.family.name)
try:
    load_model_set(LoadRequest(source=FILES, device="cpu", transformer={str(files21["transformer_bf16"])!r},
                               text_encoder={str(files21["text_encoder"])!r}, vae={str(files21["vae"])!r},
                               diffusers_folder={str(files21["diffusers_folder"])!r}))
except UserInputError as e:
    print("refused:", e)
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "qwen-image-2.1" in done.stdout
    assert "loaded qwen-image\n" in done.stdout
    refusal = done.stdout.split("refused: ", 1)[1]
    assert "is Qwen-Image 2.1, which needs diffusers 0.42.1 or newer" in refusal
    assert str(files21["transformer_bf16"]) in refusal
