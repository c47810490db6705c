"""Screenshots of a workflow on ComfyUI's canvas, before and after a run, made in a real browser.

    COMFYUI_PATH=/path/to/ComfyUI COMFYUI_PYTHON=/path/to/comfy/python \\
        python tools/screenshots.py [workflows/qwen_image_lora_training.json] [--out docs] [--steps 40]

Starts ComfyUI on the CPU on a loopback port with a temporary --base-directory (the checkout is not
written to), with this pack linked into its custom_nodes, the tiny test model exported into its model
folders and the generated demo dataset in its input folder. Then tools/screenshots.mjs opens the
workflow in headless Chromium (the system's `chromium`, driven by playwright-core from npm, installed
into tools/.node/ on first use, no browser download), points it at the tiny model and the demo dataset
(widgets set by node type and name, so re-laid-out workflows keep working), fits the view to the graph,
saves `<out>/<name>_before.png`, queues it from the page, waits until it has run and saves
`<out>/<name>_after.png`. PNGs are reduced to a 256-colour palette (UI screenshots lose nothing visible).

Run it with a Python that has this pack's requirements (torch, safetensors, Pillow), e.g. `.venv/bin/python`;
ComfyUI itself runs under COMFYUI_PYTHON. Needs node and npm (once, for playwright-core) and chromium.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PLAYWRIGHT_VERSION = "1.65.1"
NODE_DIR = REPO / "tools" / ".node"  # ignored by git
MAIN_WORKFLOW = REPO / "workflows" / "qwen_image_lora_training.json"


def overrides(dataset: str, files: dict[str, Path], steps: int | None, as_is: bool) -> dict:
    """Widget values by node type and widget name: the tiny model, the demo dataset, CPU-sized settings."""
    out = {"QwenLoRADataset": {"folder": dataset}}
    if as_is:
        return out
    # The exported tiny files through the same path as real model files (their names say "tiny").
    out["QwenLoRALoadModels"] = {"source": "ComfyUI model files", "storage": "float8",
                                 "transformer": files["transformer_fp8_e4m3fn"].name,
                                 "text_encoder": files["text_encoder_fp8_scaled"].name, "vae": files["vae"].name}
    out["QwenLoRADataset"].update(resolution=64, min_bucket_side=32, max_bucket_side=128)
    out["QwenLoRACache"] = {"preview_prompts": "a red circle on a white background\na blue square"}
    out["QwenLoRAOptimizer"] = {"learning_rate": 2e-3, "warmup_steps": 5}
    out["QwenLoRAInitTrainer"] = {"run_name": "screenshot_demo", "checkpoint_every": 0}
    out["QwenLoRAPreview"] = {"width": 128, "height": 128, "steps": 8}
    if steps is not None:
        out["QwenLoRATrain"] = {"steps": steps}
    return out


def ensure_playwright() -> Path:
    pkg = NODE_DIR / "node_modules" / "playwright-core"
    if not (pkg / "package.json").exists():
        NODE_DIR.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD": "1"}
        subprocess.run(["npm", "install", "--prefix", str(NODE_DIR), "--no-save", "--no-audit", "--no-fund",
                        f"playwright-core@{PLAYWRIGHT_VERSION}"], check=True, env=env)
    return NODE_DIR / "node_modules"


def wait_ready(url: str, proc: subprocess.Popen, log: Path, timeout: float = 240) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"ComfyUI exited early:\n{log.read_text(errors='replace')[-3000:]}")
        try:
            with urllib.request.urlopen(url + "/object_info/QwenLoRATrain", timeout=10) as r:
                if "QwenLoRATrain" in json.loads(r.read()):
                    return
        except (OSError, ValueError):
            pass
        time.sleep(1)
    raise SystemExit(f"ComfyUI did not start:\n{log.read_text(errors='replace')[-3000:]}")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shrink_png(path: Path) -> None:
    from PIL import Image

    img = Image.open(path).convert("RGB")
    img.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(path, optimize=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("workflow", nargs="?", default=str(MAIN_WORKFLOW), help="UI-format workflow (default: %(default)s)")
    p.add_argument("--out", default=str(REPO / "docs"), help="folder for the PNGs (default: docs/)")
    p.add_argument("--name", help="file name stem (default: the workflow's)")
    p.add_argument("--steps", type=int, default=40, help="Train Steps' steps for the run (default: %(default)s)")
    p.add_argument("--as-is", action="store_true",
                   help="change only the dataset folder (for a workflow already set up for the tiny model)")
    p.add_argument("--width", type=int, default=1920)
    p.add_argument("--height", type=int, default=1080)
    p.add_argument("--timeout", type=int, default=900, help="seconds the run may take (default: %(default)s)")
    p.add_argument("--keep", action="store_true", help="keep the temporary ComfyUI folder (its log, outputs)")
    args = p.parse_args(argv)

    comfyui = os.environ.get("COMFYUI_PATH")
    if not comfyui or not (Path(comfyui) / "main.py").exists():
        raise SystemExit("set COMFYUI_PATH to a ComfyUI checkout (and COMFYUI_PYTHON to a Python with its requirements)")
    python = os.environ.get("COMFYUI_PYTHON", sys.executable)
    chromium = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        raise SystemExit("chromium not found (apt-get install chromium, or set CHROMIUM)")
    if not shutil.which("node"):
        raise SystemExit("node not found (apt-get install nodejs npm)")
    workflow = json.loads(Path(args.workflow).read_text())
    name = args.name or Path(args.workflow).stem
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    modules = ensure_playwright()

    from trainer_core.runs.demo import make_demo_dataset
    from trainer_core.families import get_family

    tmp = Path(tempfile.mkdtemp(prefix="qwen_lora_screens_"))
    base = tmp / "comfy_base"
    (base / "custom_nodes").mkdir(parents=True)
    (base / "custom_nodes" / "qwen_image_lora_trainer").symlink_to(REPO, target_is_directory=True)
    files = get_family("qwen-image").export_tiny(base / "models", layout="comfyui")
    dataset = make_demo_dataset(base / "input" / "demo_dataset")
    # A fresh user without the first-start template browser, the host's template-package version warning,
    # the minimap, the canvas statistics and the pack badge over every node: nothing covers the graph.
    settings = base / "user" / "default" / "comfy.settings.json"
    settings.parent.mkdir(parents=True)
    settings.write_text(json.dumps({"Comfy.TutorialCompleted": True, "Comfy.VersionCompatibility.DisableWarnings": True,
                                    "Comfy.Minimap.Visible": False, "Comfy.Graph.CanvasInfo": False,
                                    "Comfy.NodeBadge.NodeSourceBadgeMode": "None"}))

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp / "comfyui.log"
    server = subprocess.Popen([python, "main.py", "--cpu", "--listen", "127.0.0.1", "--port", str(port),
                               "--base-directory", str(base), "--disable-auto-launch"],
                              cwd=comfyui, stdout=open(log, "w"), stderr=subprocess.STDOUT)
    try:
        wait_ready(url, server, log)
        # Where the Dataset node resolves relative folders against ComfyUI's input folder (and offers its
        # subfolders), the short name reads better on the canvas; elsewhere the absolute path.
        with urllib.request.urlopen(url + "/object_info/QwenLoRADataset", timeout=30) as r:
            folder = dataset.name if dataset.name in r.read().decode() else str(dataset)
        job = {"url": url, "title": Path(args.workflow).name, "chromium": chromium, "profile": str(tmp / "chromium_profile"), "workflow": workflow,
               "overrides": overrides(folder, files, args.steps, args.as_is),
               "before": str(out / f"{name}_before.png"), "after": str(out / f"{name}_after.png"),
               "width": args.width, "height": args.height, "timeout_s": args.timeout}
        (tmp / "job.json").write_text(json.dumps(job))
        rc = subprocess.run(["node", str(REPO / "tools" / "screenshots.mjs"), str(tmp / "job.json")],
                            env={**os.environ, "PLAYWRIGHT_CORE_DIR": str(modules)}).returncode
        for png in (job["before"], job["after"], job["after"].replace(".png", "_failed.png")):
            if Path(png).exists():
                shrink_png(Path(png))
                print(f"{png}: {Path(png).stat().st_size // 1024} KiB")
        if rc:
            print(f"the browser script failed (exit {rc}); ComfyUI's log ends:\n"
                  f"{log.read_text(errors='replace')[-3000:]}", file=sys.stderr)
        return rc
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
