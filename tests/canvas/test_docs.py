"""The generated references (tools/build_docs.py): docs/settings.md, docs/nodes.md and each node's help page in
ComfyUI's node documentation panel (web/docs/<NodeName>.md, the pack's WEB_DIRECTORY) are what the generator writes
from the settings' one source today, and cover every node, every node input and every run-file key."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from conftest import REPO


@pytest.fixture(scope="module")
def build():
    spec = importlib.util.spec_from_file_location("build_docs", REPO / "tools" / "build_docs.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("build_docs", module)  # its dataclasses look their module up there
    spec.loader.exec_module(sys.modules["build_docs"])
    return sys.modules["build_docs"]


@pytest.fixture(scope="module")
def generated(build, pack):
    return build.render(pack)


def test_the_generated_files_are_current(build, generated):
    """Run `python tools/build_docs.py` after changing a setting's help or range, a node or a workflow."""
    stale = [rel for rel, text in generated.items()
             if not (REPO / rel).exists() or (REPO / rel).read_bytes() != text.encode("utf-8")]
    assert not stale, f"stale or missing (run python tools/build_docs.py): {stale}"
    pages = {f"{build.WEB_DOCS}/{p.name}" for p in (REPO / build.WEB_DOCS).glob("*.md")}
    assert pages <= set(generated), f"help pages of no node: {sorted(pages - set(generated))}"
    for rel in generated:
        assert (REPO / rel).read_text(encoding="utf-8").splitlines()[0] == build.HEADER, rel


def test_every_node_has_its_help_page_where_comfyui_looks(pack, build):
    """ComfyUI's frontend asks /extensions/<pack folder>/docs/<NodeName>.md: WEB_DIRECTORY/docs/<key of
    NODE_CLASS_MAPPINGS>.md, each naming the node and its inputs and outputs."""
    assert pack.WEB_DIRECTORY == "./web" and "WEB_DIRECTORY" in pack.__all__
    web = (REPO / pack.WEB_DIRECTORY).resolve()
    assert web == (REPO / build.WEB_DOCS).parent
    assert not list(web.rglob("*.js")), "web/ holds the help pages only: ComfyUI would load any .js as an extension"
    for key, cls in pack.NODE_CLASS_MAPPINGS.items():
        page = (web / "docs" / f"{key}.md").read_text(encoding="utf-8")
        assert f"# {pack.NODE_DISPLAY_NAME_MAPPINGS[key]}\n" in page, key
        spec = cls.INPUT_TYPES()
        for name in {**spec.get("required", {}), **spec.get("optional", {})}:
            assert f"**`{name}`**" in page, (key, name)
        for name in getattr(cls, "RETURN_NAMES", cls.RETURN_TYPES):
            assert f"**`{name}`**" in page, (key, name)


def test_every_setting_is_in_the_settings_reference(pack, build):
    """Every input of every node under its node's heading, and every key of every run-file table under its table's."""
    from trainer_core.runs.run_file import KEYS, TABLES

    text = (REPO / build.SETTINGS).read_text(encoding="utf-8")
    sections = {}
    for part in text.split("\n### ")[1:]:
        heading, _, body = part.partition("\n")
        sections[heading] = body.split("\n## ")[0]
    for key, cls in pack.NODE_CLASS_MAPPINGS.items():
        body = sections[f"{pack.NODE_DISPLAY_NAME_MAPPINGS[key]} ({key})"]
        spec = cls.INPUT_TYPES()
        for name in {**spec.get("required", {}), **spec.get("optional", {})}:
            assert f"`{name}`" in body, (key, name)
    for table in TABLES:
        body = sections[build.table_name(table)]
        for k in (k for k in KEYS if k.table == table):
            assert f"- **`{k.name}`**" in body, (table, k.name)


def test_every_node_is_in_the_node_list(pack, build):
    text = (REPO / build.NODES).read_text(encoding="utf-8")
    for key, cls in pack.NODE_CLASS_MAPPINGS.items():
        assert f"## {pack.NODE_DISPLAY_NAME_MAPPINGS[key]} ({key})\n" in text, key
        assert build.md(" ".join(cls.DESCRIPTION.split())) in text, key


def test_the_pages_do_not_depend_on_the_models_a_machine_holds(build, pack, monkeypatch, tmp_path):
    """A file or folder widget's choices are ComfyUI's folders at run time: the pages name the folder, not what it
    holds."""
    monkeypatch.setenv("QWEN_LORA_MODELS", str(tmp_path / "none"))
    monkeypatch.setenv("QWEN_LORA_INPUT", str(tmp_path / "none"))
    empty = build.render(pack)
    (tmp_path / "models" / "loras").mkdir(parents=True)
    (tmp_path / "models" / "loras" / "some_lora.safetensors").write_bytes(b"")
    (tmp_path / "input" / "my_dataset").mkdir(parents=True)
    monkeypatch.setenv("QWEN_LORA_MODELS", str(tmp_path / "models"))
    monkeypatch.setenv("QWEN_LORA_INPUT", str(tmp_path / "input"))
    assert build.render(pack) == empty
