"""Screenshots of a workflow on ComfyUI's canvas, before and after a run, made in a real browser.

    COMFYUI_PATH=/path/to/ComfyUI COMFYUI_PYTHON=/path/to/comfy/python \\
        python tools/screenshots.py ["example_workflows/2 Qwen-Image LoRA - your images.json"] [--out docs] [--steps 40]

Starts ComfyUI on the CPU on a loopback port with a temporary --base-directory (the checkout is not
written to), with this pack linked into its custom_nodes, the tiny test model exported into its model
folders and the generated demo dataset in its input folder. Then tools/screenshots.mjs opens the
workflow in headless Chromium (the system's `chromium`, driven by playwright-core from npm, installed
into tools/.node/ on first use, no browser download), points it at the tiny model and demo dataset of its family
(widgets set by node type and name, so re-laid-out workflows keep working), fits the view to the graph,
saves `<out>/<name>_before.png`, queues it from the page, waits until it has run and saves
`<out>/<name>_after.png` (and with --thumbnail, the template browser's picture: Train Steps and the Looking group
after the run, square). PNGs are reduced to a 256-colour palette (UI screenshots lose nothing visible).

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
MAIN_WORKFLOW = REPO / "example_workflows" / "2 Qwen-Image LoRA - your images.json"


def tiny_setup(workflow: dict, base: Path, steps: int | None) -> dict:
    """Puts the tiny model of the workflow's family (read from its Load node: Qwen-Image, Edit-2511, Layered or 2.1)
    into ComfyUI's model folders and that family's demo dataset into its input folder, and returns the widget values
    that point the workflow at them, by node type and widget name, with CPU-sized settings."""
    from trainer_core.families import get_family
    from trainer_core.runs.demo import make_demo_dataset

    load = next(n for n in workflow["nodes"] if n["type"].startswith("QwenLoRALoad"))
    transformer = load["widgets_values"][1]
    models, data = base / "models", base / "input"
    prompts = "a red circle on a white background\na blue square"
    dataset_type, extra = "QwenLoRADataset", {}
    if load["type"] == "QwenLoRALoadEditModels":
        from trainer_core.families.qwen_image_edit.demo import make_edit_demo_dataset

        files, dataset = get_family("edit-2511").export_tiny(models), make_edit_demo_dataset(data / "edit_dataset")
        dataset_type, prompts = "QwenLoRAEditDataset", "paint the circle red"
        extra = {"control_resolution": 96}  # the controls near the targets' size (0: Edit-2511's ~1024 px area)
    elif transformer.startswith("qwen_image_layered"):
        from trainer_core.families.qwen_image_layered.demo import make_layered_demo_dataset

        files, dataset = get_family("qwen-image-layered").export_tiny(models), make_layered_demo_dataset(data / "layered_dataset")
        dataset_type, prompts = "QwenLoRALayeredDataset", "a red circle on a grey card"
    elif transformer.startswith("qwen_image_2.1"):
        files, dataset = get_family("qwen-image-2.1").export_tiny(models), make_demo_dataset(data / "demo_dataset")
        files = {"transformer_fp8_e4m3fn": files["transformer_bf16"], "text_encoder_fp8_scaled": files["text_encoder"],
                 "vae": files["vae"], "diffusers_folder": files["diffusers_folder"]}
    else:
        files, dataset = get_family("qwen-image").export_tiny(models, layout="comfyui"), make_demo_dataset(data / "demo_dataset")
    # The exported tiny files through the same path as real model files (their names say "tiny").
    out = {load["type"]: {"source": "ComfyUI model files", "storage": "float8", "compute_dtype": "float32",
                          "transformer": files["transformer_fp8_e4m3fn"].name,
                          "text_encoder": files["text_encoder_fp8_scaled"].name, "vae": files["vae"].name,
                          **({"diffusers_folder": str(files["diffusers_folder"])} if "diffusers_folder" in files else {})},
           dataset_type: {"folder": dataset.name, "resolution": 64, "min_bucket_side": 32, "max_bucket_side": 128,
                          **extra},
           "QwenLoRACache": {"preview_prompts": prompts},
           "QwenLoRAOptimizer": {"learning_rate": 2e-3, "warmup_steps": 5},
           "QwenLoRAInitTrainer": {"run_name": "screenshot_demo", "checkpoint_every": 0}}
    if any(n["type"] == "QwenLoRACaptionDataset" for n in workflow["nodes"]):
        # the caption-first workflow: three of the demo's captions removed, written again by the tiny text encoder file
        # (random weights: its words are noise; the picture shows where they go)
        for caption in sorted(dataset.glob("*.txt"))[:3]:
            caption.unlink()
        out["QwenLoRACaptionDataset"] = {"folder": dataset.name, "text_encoder": files["text_encoder_fp8_scaled"].name,
                                         "max_new_tokens": 8}
    for preview in ("QwenLoRAPreview", "QwenLoRAEditPreview"):
        out[preview] = {"width": 128, "height": 128, "steps": 8}
    # Train Steps' previews at 128 px in 8 sampling steps (a tiny model's 512 px previews cost minutes on a CPU).
    out["QwenLoRATrain"] = {"preview_size": 128, "preview_sampling_steps": 8, **({"steps": steps} if steps else {})}
    return out


def host_tools(need_node: bool = False) -> tuple[str, str, str]:
    """(ComfyUI's checkout, the Python that runs it, chromium) from COMFYUI_PATH, COMFYUI_PYTHON and CHROMIUM (or the
    PATH), or exit saying what is missing; `need_node`: node.js too (the browser checks' script)."""
    comfyui = os.environ.get("COMFYUI_PATH")
    if not comfyui or not (Path(comfyui) / "main.py").exists():
        raise SystemExit("set COMFYUI_PATH to a ComfyUI checkout (and COMFYUI_PYTHON to a Python with its requirements)")
    python = os.environ.get("COMFYUI_PYTHON", sys.executable)
    chromium = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium or (need_node and not shutil.which("node")):
        raise SystemExit("needs chromium" + (" and node" if need_node else "") + " (apt-get install chromium"
                         + (" nodejs npm" if need_node else "") + ", or set CHROMIUM)")
    return comfyui, python, chromium


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


def save_thumbnail(shot: Path, path: Path, side: int = 512) -> None:
    """The square screenshot as the template browser's picture: a JPEG of side x side (it shows it square)."""
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.open(shot).convert("RGB").resize((side, side), Image.Resampling.LANCZOS).save(path, quality=85,
                                                                                           optimize=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("workflow", nargs="?", default=str(MAIN_WORKFLOW), help="UI-format workflow (default: %(default)s)")
    p.add_argument("--out", default=str(REPO / "docs"), help="folder for the PNGs (default: docs/)")
    p.add_argument("--name", help="file name stem (default: the workflow's)")
    p.add_argument("--steps", type=int, default=40, help="Train Steps' steps for the run (default: %(default)s)")
    p.add_argument("--as-is", action="store_true",
                   help="run the workflow as shipped (the first-run workflows: the shapes model and example pictures)")
    p.add_argument("--thumbnail", help="also save the workflow's template-browser picture here after the run (.jpg): "
                   "Train Steps and the Looking group in view, 512x512")
    p.add_argument("--width", type=int, default=1920)
    p.add_argument("--height", type=int, default=1080)
    p.add_argument("--timeout", type=int, default=900, help="seconds the run may take (default: %(default)s)")
    p.add_argument("--keep", action="store_true", help="keep the temporary ComfyUI folder (its log, outputs)")
    args = p.parse_args(argv)

    comfyui, python, chromium = host_tools()
    if not shutil.which("node"):
        raise SystemExit("node not found (apt-get install nodejs npm)")
    workflow = json.loads(Path(args.workflow).read_text())
    name = args.name or Path(args.workflow).stem
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    modules = ensure_playwright()

    tmp = Path(tempfile.mkdtemp(prefix="qwen_lora_screens_"))
    base = tmp / "comfy_base"
    (base / "custom_nodes").mkdir(parents=True)
    (base / "custom_nodes" / "qwen_image_lora_trainer").symlink_to(REPO, target_is_directory=True)
    values = {} if args.as_is else tiny_setup(workflow, base, args.steps)
    # A fresh user without the first-start template browser, the host's template-package version warning,
    # the minimap and the canvas statistics: nothing covers the graph. The node-source badges stay as a new user
    # has them (the pack's name over each of its nodes: the layout leaves them room below the group titles).
    settings = base / "user" / "default" / "comfy.settings.json"
    settings.parent.mkdir(parents=True)
    settings.write_text(json.dumps({"Comfy.TutorialCompleted": True, "Comfy.VersionCompatibility.DisableWarnings": True,
                                    "Comfy.Minimap.Visible": False, "Comfy.Graph.CanvasInfo": False}))

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp / "comfyui.log"
    server = subprocess.Popen([python, "main.py", "--cpu", "--listen", "127.0.0.1", "--port", str(port),
                               "--base-directory", str(base), "--disable-auto-launch"],
                              cwd=comfyui, stdout=open(log, "w"), stderr=subprocess.STDOUT)
    try:
        wait_ready(url, server, log)
        job = {"url": url, "title": Path(args.workflow).name, "chromium": chromium, "profile": str(tmp / "chromium_profile"), "workflow": workflow,
               "overrides": values,
               "before": str(out / f"{name}_before.png"), "after": str(out / f"{name}_after.png"),
               "width": args.width, "height": args.height, "timeout_s": args.timeout,
               "thumbnail": str(tmp / "thumbnail.png") if args.thumbnail else None}
        (tmp / "job.json").write_text(json.dumps(job))
        rc = subprocess.run(["node", str(REPO / "tools" / "screenshots.mjs"), str(tmp / "job.json")],
                            env={**os.environ, "PLAYWRIGHT_CORE_DIR": str(modules)}).returncode
        for png in (job["before"], job["after"], job["after"].replace(".png", "_failed.png")):
            if Path(png).exists():
                shrink_png(Path(png))
                print(f"{png}: {Path(png).stat().st_size // 1024} KiB")
        if args.thumbnail and Path(job["thumbnail"]).exists():
            save_thumbnail(Path(job["thumbnail"]), Path(args.thumbnail))
            print(f"{args.thumbnail}: {Path(args.thumbnail).stat().st_size // 1024} KiB")
        if rc:
            print(f"the browser script failed (exit {rc}); ComfyUI's log ends:\n"
                  f"{log.read_text(errors='replace')[-3000:]}", file=sys.stderr)
        return rc
    finally:
        stop(server, tmp, args.keep)


def stop(server: subprocess.Popen, tmp: Path, keep: bool) -> None:
    """Stop the ComfyUI server and remove its temporary base directory (unless `keep`)."""
    server.terminate()
    try:
        server.wait(timeout=20)
    except subprocess.TimeoutExpired:
        server.kill()
    if keep:
        print(f"kept {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
