"""What the Comfy registry archive holds: the git-tracked files less `.comfyignore`'s patterns (comfy-cli's
`zip_files`, which `comfy node publish` uploads), read here without comfy-cli; `make validate` builds the real
archive with comfy-cli's own code (tools/registry_archive.py) against the same lists."""

from __future__ import annotations

import fnmatch
import importlib.util
import re
import subprocess
import tomllib

import pytest

from conftest import REPO


def _lists():
    spec = importlib.util.spec_from_file_location("registry_archive", REPO / "tools" / "registry_archive.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _patterns() -> list[str]:
    lines = (REPO / ".comfyignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


def _ignored(path: str, pattern: str) -> bool:
    """gitignore matching for the shapes .comfyignore uses (anchored at the root: `/dir/`, `/file`, `/dir/*.ext`)."""
    body = pattern[1:]
    if body.endswith("/"):
        return path.startswith(body)
    return fnmatch.fnmatchcase(path, body) and path.count("/") == body.count("/")


def published_files() -> list[str]:
    tracked = subprocess.run(["git", "-C", str(REPO), "ls-files"], capture_output=True, text=True, check=True)
    includes = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["comfy"]["includes"]
    assert includes == [], "includes force paths in over .comfyignore: published_files() would have to add them"
    return [p for p in tracked.stdout.splitlines() if not any(_ignored(p, pat) for pat in _patterns())]


def test_comfyignore_uses_only_the_patterns_this_test_reads():
    """Each pattern anchored at the pack's root, a folder, a file or a file pattern within one folder: what
    `_ignored` reads as gitignore (pathspec's gitwildmatch, comfy-cli's) does. Another shape: extend `_ignored`."""
    for pattern in _patterns():
        assert re.fullmatch(r"/[\w.-]+/|/[\w.-]+|/[\w.-]+/\*\.\w+", pattern), pattern


def test_the_archive_holds_the_pack_and_not_the_developers_checkout():
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout: the archive is git's tracked files")
    lists = _lists()
    names = published_files()
    assert not lists.check(names), lists.check(names)
    for entry in ("tests/", "benchmarks/", "tools/"):
        assert not [n for n in names if n.startswith(entry)], entry
    # The first-run workflows run from what ships: the shapes model, the example pictures, every template's picture.
    for picture in (REPO / "example_workflows").glob("*.jpg"):
        assert f"example_workflows/{picture.name}" in names


def test_the_registry_fields():
    """[tool.comfy] as docs.comfy.org/registry/specifications has it; requires-comfyui is the oldest ComfyUI the host
    tests run (0.3.64), in the [operator]major.minor.patch form comfy-cli accepts (it drops other forms with a
    warning); the icon is the tracked docs/icon.png (at most 800x400) as GitHub serves it."""
    from PIL import Image

    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    comfy = project["tool"]["comfy"]
    assert comfy["PublisherId"] and comfy["DisplayName"]
    assert comfy["requires-comfyui"] == ">=0.3.64"
    repository = project["project"]["urls"]["Repository"].removeprefix("https://github.com/")
    assert comfy["Icon"] == f"https://raw.githubusercontent.com/{repository}/main/docs/icon.png"
    with Image.open(REPO / "docs" / "icon.png") as icon:
        assert icon.width <= 800 and icon.height <= 400 and icon.width == icon.height
    assert (REPO / "docs" / "icon.png").stat().st_size < 16_000
