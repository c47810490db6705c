"""Run by tests/host/test_host_qwen_image21_vae.py with ComfyUI's Python in a ComfyUI that reads Qwen-Image 2.1's VAE
(comfy/sd.py: "Qwen Image 2.1 VAE: Wan 2.2 layout, temporal kernel 1, no patchify, RGBA"): load our 2.1 VAE file as
ComfyUI's VAELoader does (comfy.sd.VAE over the file's state dict), encode an RGBA IMAGE and an RGB one, decode the
RGBA one's latent (its VAELoader node, on the CPU).

    python comfy_vae21_probe.py <comfyui checkout> <request.json>

request.json: {"vae": path of the VAE file, "images": a .safetensors of `rgba` (1, H, W, 4) and `rgb` (1, H, W, 3) in
[0, 1] (ComfyUI's IMAGE), "out": path of the answer (.safetensors; the JSON report beside it, same name + .json)}.
Writes `latent.rgba`, `latent.rgb` (VAE.encode: (1, C, 1, h, w) or (1, C, h, w) as ComfyUI gives them) and
`decoded.rgba` (VAE.decode of latent.rgba: ComfyUI's IMAGE, (1, H, W, channels)); the report: the VAE's latent and
output channels, its dtype and what ComfyUI logged. Nothing here imports this repository.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path


def main() -> None:
    comfy_root, request_file = sys.argv[1], sys.argv[2]
    sys.path.insert(0, comfy_root)
    import torch
    from safetensors.torch import load_file, save_file

    from comfy.cli_args import args

    args.cpu = True  # as `main.py --cpu`: comfy.model_management reads it at import
    import folder_paths
    import nodes

    request = json.loads(Path(request_file).read_text())
    root = Path(tempfile.mkdtemp(prefix="vae21_probe_"))  # a private vae folder, as a user's would be
    (root / "vae").mkdir()
    folder_paths.add_model_folder_path("vae", str(root / "vae"), is_default=True)
    (root / "vae" / "ours.safetensors").symlink_to(Path(request["vae"]).resolve())
    (vae,) = nodes.VAELoader().load_vae("ours.safetensors")
    images = load_file(request["images"])
    with torch.no_grad():
        rgba = vae.encode(images["rgba"])
        rgb = vae.encode(images["rgb"])
        decoded = vae.decode(rgba)
    save_file({"latent.rgba": rgba.float().contiguous(), "latent.rgb": rgb.float().contiguous(),
               "decoded.rgba": decoded.float().contiguous()}, request["out"])
    Path(request["out"] + ".json").write_text(json.dumps({
        "latent_channels": vae.latent_channels, "output_channels": getattr(vae, "output_channels", None),
        "vae_dtype": str(vae.vae_dtype), "model": type(vae.first_stage_model).__module__}))
    shutil.rmtree(root)


if __name__ == "__main__":
    main()
