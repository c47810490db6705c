"""Executes an API-format workflow the way ComfyUI does, for tests without ComfyUI: nodes run in
dependency order under torch.inference_mode(), outputs are cached by an input signature over the node
and its ancestors (with IS_CHANGED folded in; NaN never equals itself), and core output nodes the
workflow uses (SaveImage, PreviewImage) record what they receive; Upscale Image By scales as ComfyUI's does."""

from __future__ import annotations

import itertools
import math

import torch

_never_equal = itertools.count()


class RecordImages:
    FUNCTION = "record"
    received: list = []

    def record(self, images, filename_prefix="ComfyUI"):
        RecordImages.received.append(images)
        return {"ui": {}, "result": ()}


class RecordText:
    FUNCTION = "record"
    received: list = []

    def record(self, source=None):
        RecordText.received.append(source)
        return {"ui": {"text": (str(source),)}, "result": ()}


class ImageScaleBy:
    """ComfyUI's "Upscale Image By" (nodes.py, 0.3.64 and 0.33.0): comfy.utils.common_upscale, which for these
    methods is torch's interpolate (the first-run workflow uses nearest-exact)."""

    FUNCTION = "upscale"

    def upscale(self, image, upscale_method, scale_by):
        samples = image.movedim(-1, 1)  # (B, C, H, W)
        size = (round(samples.shape[2] * scale_by), round(samples.shape[3] * scale_by))
        mode = {"bilinear": "bilinear", "bicubic": "bicubic", "area": "area"}.get(upscale_method, "nearest-exact")
        return (torch.nn.functional.interpolate(samples, size=size, mode=mode).movedim(1, -1),)


class LoadImage:
    """ComfyUI's "Load Image" (nodes.py, 0.3.64 and 0.33.0) for one still picture: the file in the input folder
    ($QWEN_LORA_INPUT here), EXIF-rotated, RGB in [0, 1] as (1, H, W, 3), and its mask 1 - alpha (a 64x64 zero mask
    when the picture has no alpha)."""

    FUNCTION = "load_image"

    def load_image(self, image, upload="image"):
        import os
        from pathlib import Path

        import numpy as np
        from PIL import Image, ImageOps

        picture = ImageOps.exif_transpose(Image.open(Path(os.environ.get("QWEN_LORA_INPUT", "input")) / image))
        rgb = torch.from_numpy(np.asarray(picture.convert("RGB"), dtype=np.float32) / 255.0)[None]
        if "A" in picture.getbands():
            mask = 1.0 - torch.from_numpy(np.asarray(picture.getchannel("A"), dtype=np.float32) / 255.0)[None]
        else:
            mask = torch.zeros((1, 64, 64), dtype=torch.float32)
        return (rgb, mask)


class ImageCrop:
    """ComfyUI's "ImageCrop" (comfy_extras/nodes_images.py): x and y clamped into the picture, then sliced."""

    FUNCTION = "crop"

    def crop(self, image, width, height, x, y):
        x, y = min(x, image.shape[2] - 1), min(y, image.shape[1] - 1)
        return (image[:, y:y + height, x:x + width, :],)


CORE = {"SaveImage": RecordImages, "PreviewImage": RecordImages, "PreviewAny": RecordText, "ImageScaleBy": ImageScaleBy,
        "LoadImage": LoadImage, "ImageCrop": ImageCrop}


class GraphRunner:
    def __init__(self, mappings):
        self.mappings = {**CORE, **mappings}
        self.cache: dict[str, tuple] = {}  # node id -> (signature, outputs)
        self.executed: list[str] = []

    def _signature(self, prompt, node_id, memo):
        if node_id in memo:
            return memo[node_id]
        node = prompt[node_id]
        cls = self.mappings[node["class_type"]]
        parts = [node["class_type"]]
        widgets = {}
        for name, value in sorted(node["inputs"].items()):
            if isinstance(value, list):
                parts.append((name, self._signature(prompt, value[0], memo), value[1]))
            else:
                parts.append((name, value))
                widgets[name] = value
        if hasattr(cls, "IS_CHANGED"):
            changed = cls.IS_CHANGED(**widgets)
            is_nan = isinstance(changed, float) and math.isnan(changed)
            parts.append(("IS_CHANGED", f"nan{next(_never_equal)}" if is_nan else changed))
        memo[node_id] = repr(parts)
        return memo[node_id]

    def run(self, prompt: dict) -> dict[str, tuple]:
        """Run every node of `prompt`; return node id -> outputs of this run."""
        self.executed = []
        memo, outputs = {}, {}
        order = self._order(prompt)
        # As ComfyUI does, every node's signature (IS_CHANGED included) is taken before any node runs.
        signatures = {node_id: self._signature(prompt, node_id, memo) for node_id in order}
        with torch.inference_mode():
            for node_id in order:
                signature = signatures[node_id]
                cached = self.cache.get(node_id)
                if cached and cached[0] == signature:
                    outputs[node_id] = cached[1]
                    continue
                node = prompt[node_id]
                inputs = {k: outputs[v[0]][v[1]] if isinstance(v, list) else v for k, v in node["inputs"].items()}
                cls = self.mappings[node["class_type"]]
                result = getattr(cls(), cls.FUNCTION)(**inputs)
                result = result["result"] if isinstance(result, dict) else result
                outputs[node_id] = result
                self.cache[node_id] = (signature, result)
                self.executed.append(node_id)
        return outputs

    @staticmethod
    def _order(prompt):
        done, order = set(), []

        def visit(node_id):
            if node_id in done:
                return
            for value in prompt[node_id]["inputs"].values():
                if isinstance(value, list):
                    visit(value[0])
            done.add(node_id)
            order.append(node_id)

        for node_id in sorted(prompt, key=int):
            visit(node_id)
        return order
