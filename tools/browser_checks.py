"""What a new user sees of the pack in ComfyUI's own frontend, checked in a real browser and saved as screenshots.

    COMFYUI_PATH=/path/to/ComfyUI COMFYUI_PYTHON=/path/to/comfy/python [COMFYUI_FRONTEND_ROOT=.../static] \\
        python tools/browser_checks.py --tag 0.33.0 [--out docs]

Starts ComfyUI on the CPU (as tools/screenshots.py does: a temporary --base-directory with the pack linked into its
custom_nodes, and no model files at all), then tools/browser_checks.mjs opens its frontend in headless Chromium:

- templates_<tag>.png: the template browser on the pack's category; the first-run workflow must come first;
- missing_models_<tag>.png: the real Qwen-Image workflow opened as a template without its files; the frontend must
  list each file its Load node names (properties.models) and offer the download;
- first_run_canvas_<tag>.png: the first-run workflow at 100% with the node-source badges as a new user has them.

Prints what it found (JSON) and exits 1 when a check fails. COMFYUI_FRONTEND_ROOT runs another frontend (ComfyUI
0.3.64 pins 1.27.10: README, "Tests").
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))

from screenshots import ensure_playwright, free_port, host_tools, shrink_png, stop, wait_ready  # noqa: E402

PACK = "qwen_image_lora_trainer"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tag", required=True, help="names the screenshots, e.g. the ComfyUI version")
    p.add_argument("--out", default=str(REPO / "docs"))
    p.add_argument("--keep", action="store_true", help="keep the temporary ComfyUI folder (its log)")
    args = p.parse_args(argv)
    comfyui, python, chromium = host_tools(need_node=True)
    modules = ensure_playwright()

    sys.path.insert(0, str(REPO))
    from build_workflows import FIRST_RUN, MAIN, WORKFLOWS
    from trainer_core.families.comfyui_files import known_file

    load = next(n for n in json.loads((REPO / "example_workflows" / f"{MAIN}.json").read_text())["nodes"]
                if n["type"] == "QwenLoRALoadModels")
    files = [m["name"] for m in load["properties"]["models"]]
    assert all(known_file(f) for f in files)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="qwen_lora_checks_"))
    base = tmp / "comfy_base"
    (base / "custom_nodes").mkdir(parents=True)
    (base / "custom_nodes" / PACK).symlink_to(REPO, target_is_directory=True)
    settings = base / "user" / "default" / "comfy.settings.json"
    settings.parent.mkdir(parents=True)
    settings.write_text(json.dumps({"Comfy.TutorialCompleted": True, "Comfy.VersionCompatibility.DisableWarnings": True,
                                    "Comfy.Minimap.Visible": False}))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [python, "main.py", "--cpu", "--listen", "127.0.0.1", "--port", str(port), "--base-directory", str(base),
               "--disable-auto-launch"]
    if os.environ.get("COMFYUI_FRONTEND_ROOT"):
        command += ["--front-end-root", os.environ["COMFYUI_FRONTEND_ROOT"]]
    log = tmp / "comfyui.log"
    server = subprocess.Popen(command, cwd=comfyui, stdout=open(log, "w"), stderr=subprocess.STDOUT)
    try:
        wait_ready(url, server, log)
        job = {"url": url, "chromium": chromium, "profile": str(tmp / "chromium_profile"), "pack": PACK,
               "names": list(WORKFLOWS), "first_run": FIRST_RUN, "real": MAIN, "files": files, "out": str(out),
               "tag": args.tag}
        (tmp / "job.json").write_text(json.dumps(job))
        run = subprocess.run(["node", str(REPO / "tools" / "browser_checks.mjs"), str(tmp / "job.json")],
                             env={**os.environ, "PLAYWRIGHT_CORE_DIR": str(modules)}, capture_output=True, text=True)
        if run.returncode:
            print(run.stdout[-2000:], run.stderr[-3000:], file=sys.stderr)
            return run.returncode
        result = json.loads(run.stdout.strip().splitlines()[-1])
        for name in ("templates", "missing_models", "first_run_canvas"):
            png = out / f"{name}_{args.tag}.png"
            if png.exists():
                shrink_png(png)
                print(f"{png}: {png.stat().st_size // 1024} KiB")
        print(json.dumps(result, indent=1))
        failed = []
        if result.get("templates_shown", [None])[0] != FIRST_RUN:
            failed.append("the first-run workflow is not the first template shown")
        if sorted(result.get("missing_listed", [])) != sorted(files) or not result.get("download_offered"):
            failed.append("the missing-models list does not offer every file of the real workflow")
        for f in failed:
            print("FAILED:", f, file=sys.stderr)
        return 1 if failed else 0
    finally:
        stop(server, tmp, args.keep)


if __name__ == "__main__":
    sys.exit(main())
