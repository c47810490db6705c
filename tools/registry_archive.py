"""The archive `comfy node publish` would upload to the Comfy registry, built by comfy-cli's own code and checked.

    make validate      (or: .venv-comfy-cli/bin/python tools/registry_archive.py, from the repository root)

comfy-cli packs the git-tracked files less `.comfyignore`'s patterns, plus pyproject.toml's [tool.comfy].includes
(`comfy_cli.file_utils.zip_files`). This builds that zip in a temporary folder (nothing is uploaded), prints what it
holds by top-level entry, and fails if it misses something the pack needs (SHIPS) or carries what it does not
(LEFT_OUT). tests/house/test_published_pack.py checks the same lists against git and .comfyignore without comfy-cli.
"""

from __future__ import annotations

import os
import sys
import tempfile
import zipfile
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# What the installed pack needs: ComfyUI imports __init__.py (nodes/, trainer_core/); the first-run workflows read the
# shapes model (pretrained/) and the example pictures (example_dataset/); the template browser lists
# example_workflows/ (the API twins in its api/ are for POST /prompt); run_files/ are the headless examples; web/docs/
# holds the node help pages ComfyUI's node documentation panel shows (WEB_DIRECTORY).
SHIPS = ("__init__.py", "nodes/", "trainer_core/", "pretrained/", "example_dataset/", "example_workflows/",
         "example_workflows/api/", "run_files/", "web/docs/", "requirements.txt", "pyproject.toml", "README.md",
         "CHANGELOG.md")
# The developers' checkout: nothing the installed pack imports or reads (tests/house/test_layout.py: what ComfyUI
# imports stays in nodes/ and trainer_core/).
LEFT_OUT = ("tests/", "benchmarks/", "tools/", ".ci/", "Makefile", "constraints.txt", "requirements-test.txt",
            ".gitignore", "docs/icon.png")


def holds(names: list[str], entry: str) -> bool:
    return any(n.startswith(entry) for n in names) if entry.endswith("/") else entry in names


def check(names: list[str]) -> list[str]:
    """What is wrong with an archive holding `names` (paths relative to the pack's root)."""
    return ([f"missing: {e}" for e in SHIPS if not holds(names, e)]
            + [f"should not ship: {e}" for e in LEFT_OUT if holds(names, e)])


def main() -> int:
    from comfy_cli.file_utils import zip_files  # comfy-cli's venv (make validate installs it)
    from comfy_cli.registry.config_parser import extract_node_configuration

    os.chdir(REPO)  # comfy-cli reads pyproject.toml, "." and .comfyignore from the working folder
    includes = extract_node_configuration().tool_comfy.includes  # what `comfy node publish` passes
    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(tmp) / "node.zip"
        zip_files(str(archive), includes=includes)
        with zipfile.ZipFile(archive) as z:
            names = sorted(i.filename for i in z.infolist() if not i.is_dir())
        size = archive.stat().st_size
    tops = Counter(n.split("/", 1)[0] + ("/" if "/" in n else "") for n in names)
    print(f"registry archive: {len(names)} files, {size / 2**20:.1f} MiB zipped")
    for top, count in sorted(tops.items()):
        print(f"  {top:<24} {count} file{'s' if count > 1 else ''}")
    problems = check(names)
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
