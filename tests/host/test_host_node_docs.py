"""Host test: a real ComfyUI serves each node's help page (web/docs/<NodeName>.md, tools/build_docs.py) where its
frontend's node documentation panel asks for it, and, with chromium, the panel shows it (a screenshot in docs/).

The frontend (comfyui-frontend-package 1.49, ComfyUI 0.33.0) reads a custom node's help from
/extensions/<pack>/docs/<NodeName>/<locale>.md, then /extensions/<pack>/docs/<NodeName>.md, where <pack> is the second
part of the node's python_module in /object_info (custom_nodes.<folder name>); ComfyUI serves the pack's
WEB_DIRECTORY at /extensions/<folder name>/ (server.py, EXTENSION_WEB_DIRS) and lists its .js files (none here) as
extensions to load.

Needs COMFYUI_PATH (and COMFYUI_PYTHON), as test_host_comfyui.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from conftest import REPO
from test_host_comfyui import ComfyServer

COMFYUI = os.environ.get("COMFYUI_PATH")
PACK = "qwen_image_lora_trainer"
pytestmark = pytest.mark.skipif(
    not COMFYUI, reason="COMFYUI_PATH is not set: point it at a ComfyUI checkout (and COMFYUI_PYTHON at a Python "
                        "with ComfyUI's requirements) to check the node help pages in a real ComfyUI")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    base = tmp_path_factory.mktemp("docs") / "comfy_base"
    (base / "custom_nodes").mkdir(parents=True)
    (base / "custom_nodes" / PACK).symlink_to(REPO, target_is_directory=True)
    settings = base / "user" / "default" / "comfy.settings.json"  # no first-run tutorial over the canvas
    settings.parent.mkdir(parents=True)
    settings.write_text(json.dumps({"Comfy.TutorialCompleted": True, "Comfy.VersionCompatibility.DisableWarnings": True,
                                    "Comfy.Minimap.Visible": False}))
    comfy = ComfyServer(base)
    try:
        comfy.wait_ready()
        yield comfy
    finally:
        comfy.stop()


def fetch(url: str) -> tuple[int, str, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), b""


def test_comfyui_serves_each_nodes_help_page_where_the_frontend_asks(server, pack):
    info = server.get("/object_info")
    ours = [key for key in pack.NODE_CLASS_MAPPINGS]
    assert set(ours) <= set(info)
    for key in ours:
        module = info[key]["python_module"]
        assert module.split(".")[:2] == ["custom_nodes", PACK], module  # what the frontend makes the URL of
        # The locale's page first (none: ComfyUI answers 404, so the frontend falls back), then the default page.
        status, _, _ = fetch(f"{server.url}/extensions/{PACK}/docs/{key}/en.md")
        assert status == 404, (key, status)
        status, kind, body = fetch(f"{server.url}/extensions/{PACK}/docs/{key}.md")
        assert status == 200 and "text/html" not in kind, (key, status, kind)  # the frontend drops text/html
        assert body == (REPO / "web" / "docs" / f"{key}.md").read_bytes(), key
    # The web folder holds no JavaScript: nothing of ours is loaded as a frontend extension.
    assert not [e for e in server.get("/extensions") if e.startswith(f"/extensions/{PACK}/")]
    assert "Traceback" not in server.log()


@pytest.mark.skipif(not shutil.which("chromium") or not shutil.which("node"),
                    reason="chromium and node are not installed (apt-get install chromium nodejs npm)")
def test_the_node_library_shows_a_nodes_help_page_in_a_real_browser(server, tmp_path):
    """ComfyUI's own frontend in headless Chromium (tools/node_help.mjs): Qwen LoRA Train Steps found in the node
    library and added, selected, its Node Info button opens the documentation panel with our page. The screenshot
    goes to docs/node_help_<ComfyUI version>.png with UPDATE_SCREENSHOTS=1 (else into the test's temporary folder)."""
    sys.path.insert(0, str(REPO / "tools"))
    from screenshots import ensure_playwright, shrink_png

    modules = ensure_playwright()
    version = server.get("/system_stats")["system"]["comfyui_version"]
    name = f"node_help_{version}.png"
    shot = REPO / "docs" / name if os.environ.get("UPDATE_SCREENSHOTS") == "1" else tmp_path / name
    job = {"url": server.url, "chromium": shutil.which("chromium"), "profile": str(tmp_path / "profile"),
           "node": "QwenLoRATrain", "title": "Qwen LoRA Train Steps", "out": str(shot)}
    (tmp_path / "job.json").write_text(json.dumps(job))
    run = subprocess.run(["node", str(REPO / "tools" / "node_help.mjs"), str(tmp_path / "job.json")],
                         env={**os.environ, "PLAYWRIGHT_CORE_DIR": str(modules)}, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    print("node help:", json.dumps({k: v for k, v in result.items() if k != "panel"}))
    assert result["nodes_in_graph"] == ["QwenLoRATrain"], result
    # The locale's page first (none), then ours: the frontend's own order.
    ours = [p for p in result["fetched"] if p.startswith(f"/extensions/{PACK}/docs/")]
    assert ours[:2] == [f"/extensions/{PACK}/docs/QwenLoRATrain/en.md",
                        f"/extensions/{PACK}/docs/QwenLoRATrain.md"], result["fetched"]
    for name in ("steps", "preview_every", "snapshot_every", "trainer"):
        assert name in result["panel"], (name, result["panel"][:2000])
    assert "Trains the LoRA for N more steps" in result["panel"] and "run file:" in result["panel"]
    shrink_png(shot)
