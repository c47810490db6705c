"""The names users have: every Qwen-Image model file ComfyUI's own templates download is known to the pack, with the
family that trains on it and the address the templates give (families/comfyui_files.py), and the pack's workflows
name those files. Read from the templates package itself (`comfyui-workflow-templates-json`, which `make test`
installs), so the next template ComfyUI ships is checked too.
"""

import json
from collections import defaultdict
from importlib import resources

import pytest

from conftest import api_workflow
from trainer_core.families.comfyui_files import (
    EDIT,
    LAYERED,
    NOT_MODEL_PARTS,
    QWEN_IMAGE,
    QWEN_IMAGE21,
    known_file,
)

templates_package = pytest.importorskip("comfyui_workflow_templates_json")
LOADERS = {"UNETLoader": "diffusion_models", "CLIPLoader": "text_encoders", "VAELoader": "vae"}


def _nodes(workflow: dict):
    """Every node of a UI workflow, those inside its subgraph definitions too."""
    yield from workflow.get("nodes", [])
    for subgraph in workflow.get("definitions", {}).get("subgraphs", []):
        yield from subgraph.get("nodes", [])


def is_qwen_image_part(loader: str, values: list) -> bool:
    """A loader node that loads a Qwen-Image model's part: a diffusion model or VAE file named qwen_image*, a text
    encoder loaded as CLIPLoader type "qwen_image" (how ComfyUI prompts every Qwen-Image member, 2.1 included)."""
    name = str(values[0]).lower()
    if loader == "CLIPLoader":
        return len(values) > 1 and values[1] == "qwen_image"
    return name.startswith("qwen_image")


def template_files() -> dict[str, list[tuple[str, str, str]]]:
    """Template name -> [(loader folder, file name, the url its properties.models give or "")] of its loader nodes
    that load a Qwen-Image part (`is_qwen_image_part`)."""
    out = {}
    for path in sorted((resources.files(templates_package) / "templates").iterdir()):
        if not path.name.endswith(".json"):
            continue
        try:
            workflow = json.loads(path.read_text())
        except ValueError:
            continue
        files = []
        for node in _nodes(workflow) if isinstance(workflow, dict) else ():
            values = node.get("widgets_values")
            if node.get("type") not in LOADERS or not isinstance(values, list) or not values:
                continue
            if not is_qwen_image_part(node["type"], values):
                continue
            urls = {m.get("name"): m.get("url", "") for m in (node.get("properties") or {}).get("models") or []}
            files.append((LOADERS[node["type"]], values[0], urls.get(values[0], "")))
        out[path.name] = files
    return out


def qwen_image_templates() -> dict[str, list[tuple[str, str, str]]]:
    """The templates that run a Qwen-Image model (a diffusion model file named qwen_image*), with their files."""
    return {name: files for name, files in template_files().items()
            if any(folder == "diffusion_models" and file.lower().startswith("qwen_image") for folder, file, _ in files)}


# The shared parts of the 1.x members: Qwen-Image's text encoder serves Edit and Layered, its VAE serves Edit.
SERVES = {QWEN_IMAGE: {QWEN_IMAGE, EDIT, LAYERED}, EDIT: {EDIT}, LAYERED: {LAYERED}, QWEN_IMAGE21: {QWEN_IMAGE21}}


def test_every_file_of_comfyuis_qwen_image_templates_is_known_with_its_family_and_address():
    templates = qwen_image_templates()
    assert len(templates) >= 20  # 0.1.123 has 31: a much smaller count means the package's layout changed
    seen, urls = defaultdict(set), defaultdict(set)
    for files in templates.values():
        for _, name, url in files:
            urls[name] |= {url} - {""}  # a shared file is downloaded from several of Comfy-Org's repositories
    for template, files in templates.items():
        transformer = [known_file(f) for folder, f, _ in files if folder == "diffusion_models" and known_file(f)]
        families = {t.family for t in transformer}
        for folder, name, url in files:
            if name in NOT_MODEL_PARTS:
                continue
            entry = known_file(name)
            assert entry is not None, f"{template} loads {name} ({folder}), which families/comfyui_files.py does not know"
            assert entry.folder == folder, (template, name, entry.folder)
            assert not families or any(f in SERVES[entry.family] for f in families), (template, name, families)
            if urls[name]:
                assert entry.url in urls[name], (template, name, entry.url, urls[name])
            seen[entry.family].add(name)
    # ComfyUI's 2.1 and Edit-2511 files are among them: the reason the int8 reader exists
    assert {"qwen_image_2.1_int8_convrot.safetensors", "qwen_image_2.1_turbo_int8_convrot.safetensors",
            "qwen3vl_8b_int8_convrot.safetensors", "qwen_image_2.1_vae_bf16.safetensors"} <= seen[QWEN_IMAGE21]
    assert {"qwen_image_edit_2511_int8_convrot.safetensors", "qwen_image_edit_2511_fp8mixed.safetensors"} <= seen[EDIT]


def test_the_pack_workflows_name_comfyuis_files_of_their_family():
    want = {"main": QWEN_IMAGE, "edit": EDIT, "layered": LAYERED, "qwen21": QWEN_IMAGE21}
    for name, family in want.items():
        workflow = json.loads(api_workflow(name).read_text())
        load = next(node["inputs"] for node in workflow.values() if node["class_type"].startswith("QwenLoRALoad"))
        for part in ("transformer", "text_encoder", "vae"):
            entry = known_file(load[part])
            assert entry is not None and entry.readable, (name, part, load[part])
            assert family in SERVES[entry.family], (name, part, entry)
