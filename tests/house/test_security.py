"""No unpickling of user files, no remote code, no network at run time (checked on the source)."""

import re

from conftest import REPO

SOURCES = sorted([*(REPO / "trainer_core").rglob("*.py"), *(REPO / "nodes").rglob("*.py"), REPO / "__init__.py"])


def test_no_pickle_torch_load_or_remote_code():
    for path in SOURCES:
        text = path.read_text()
        for pattern in (r"\bimport pickle\b", r"\btorch\.load\(", r"trust_remote_code\s*=\s*True", r"\bhf_hub_download\b",
                        r"\bsnapshot_download\b", r"\burllib\b", r"\brequests\b"):
            assert not re.search(pattern, text), f"{path.relative_to(REPO)}: {pattern}"


def call_arguments(text: str, name: str) -> list[str]:
    """The argument text of every `name(...)` call, parentheses balanced."""
    calls = []
    for match in re.finditer(re.escape(name) + r"\(", text):
        depth, i = 1, match.end()
        while depth:
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
        calls.append(text[match.end():i - 1])
    return calls


def test_from_pretrained_is_local_and_safetensors_only():
    for path in SOURCES:
        for call in call_arguments(path.read_text(), "from_pretrained"):
            assert "local_files_only" in call or "**local" in call, f"{path.relative_to(REPO)}: {call}"


def test_engine_imports_nothing_from_comfyui():
    for path in (REPO / "trainer_core").rglob("*.py"):
        text = path.read_text()
        assert not re.search(r"^\s*(import|from)\s+(comfy|folder_paths|server|nodes|execution|comfy_api)\b", text,
                             re.M), path
