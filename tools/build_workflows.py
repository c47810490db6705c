"""Writes workflows/*.json (UI format for the canvas, API format for POST /prompt) from one graph.

Run after changing a node's inputs: `python tools/build_workflows.py`. tests/test_workflows.py checks
both files against the node definitions.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "workflows"

# (id, class, widget values by input name, canvas position)
NODES = [
    (1, "QwenLoRALoadModels", {"source": "ComfyUI model files",
                               "transformer": "qwen_image_fp8_e4m3fn.safetensors",
                               "text_encoder": "qwen_2.5_vl_7b_fp8_scaled.safetensors",
                               "vae": "qwen_image_vae.safetensors", "diffusers_folder": "",
                               "storage": "float8", "compute_dtype": "auto", "text_encoder_fp8": "dequantize"},
     (40, 60)),
    (2, "QwenLoRADataset", {"folder": "my_lora_dataset", "resolution": 1024, "enable_buckets": True,
                            "min_bucket_side": 512, "max_bucket_side": 2048, "repeats": 1,
                            "caption_extension": ".txt", "missing_caption": "error",
                            "upscale_small_images": False, "background": "white",
                            "allow_large_images": False, "validation_images": 0,
                            "input_folder": "(custom path)"}, (40, 300)),
    (3, "QwenLoRACache", {"preview_prompts": "a photo of sks dog on a beach", "negative_prompt": "",
                          "caching_batch_size": 4, "cache_folder": ""}, (420, 160)),
    (4, "QwenLoRAConfig", {"rank": 16, "alpha": 16.0, "dropout": 0.0, "targets": "attention+mlp",
                           "dtype": "float32"}, (420, 440)),
    (5, "QwenLoRAOptimizer", {"optimizer": "adamw8bit", "learning_rate": 1e-4, "beta1": 0.9, "beta2": 0.999,
                              "eps": 1e-8, "weight_decay": 0.01, "warmup_steps": 20, "schedule": "constant",
                              "schedule_steps": 1000, "min_lr_ratio": 0.0, "max_grad_norm": 1.0}, (420, 680)),
    (6, "QwenLoRAInitTrainer", {"run_name": "my_qwen_lora", "micro_batch_size": 1, "grad_accum_steps": 1,
                                "gradient_checkpointing": True, "blocks_to_swap": -1, "training_seed": 42,
                                "timestep_sampling": "logit_normal", "logit_mean": 0.0, "logit_std": 1.0,
                                "resolution_shift": True, "caption_dropout": 0.0, "checkpoint_every": 100,
                                "max_nonfinite_steps": 3, "continue_from_lora": "(none: start from zero)",
                                "validation_every": 0},
     (820, 160)),
    (7, "QwenLoRATrain", {"steps": 100, "preview_every": 25, "preview_size": 512, "preview_sampling_steps": 20,
                          "snapshot_every": 0}, (1200, 160)),
    (8, "QwenLoRAPreview", {"prompt": "", "width": 1024, "height": 1024, "steps": 20, "cfg": 4.0,
                            "preview_seed": 0}, (1520, 60)),
    (9, "QwenLoRALossPlot", {"width": 768, "height": 384}, (1520, 380)),
    (10, "QwenLoRASave", {"filename": "{run_name}_{step}", "dtype": "bfloat16", "layout": "comfyui"}, (1520, 560)),
    (11, "SaveImage", {"filename_prefix": "qwen_lora/preview"}, (1880, 60)),
    (12, "PreviewImage", {}, (1880, 380)),
    (13, "PreviewAny", {}, (820, 640)),  # Init Trainer's status: started/resumed, blocks_to_swap, memory plan
    (14, "PreviewAny", {}, (1200, 420)),  # Train Steps' report: steps, losses, speed
]

# (from node, from output slot, to node, to input name)
LINKS = [
    (1, 0, 3, "models"), (2, 0, 3, "dataset"),
    (1, 0, 6, "models"), (3, 0, 6, "cached_dataset"), (4, 0, 6, "lora_config"), (5, 0, 6, "optimizer_config"),
    (6, 0, 7, "trainer"), (7, 0, 8, "trainer"), (7, 0, 9, "trainer"), (7, 0, 10, "trainer"),
    (8, 0, 11, "images"), (9, 0, 12, "images"), (6, 1, 13, "source"), (7, 2, 14, "source"),
]

# Core nodes the workflow uses, as ComfyUI declares them (name, type) for inputs; outputs none.
CORE_INPUTS = {
    "SaveImage": {"required": {"images": ("IMAGE",), "filename_prefix": ("STRING", {"default": "ComfyUI"})}},
    "PreviewImage": {"required": {"images": ("IMAGE",)}},
    "PreviewAny": {"required": {"source": ("*", {})}},
}


def load_pack():
    name = str(REPO).replace(".", "_x_")
    spec = importlib.util.spec_from_file_location(name, REPO / "__init__.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def input_types(cls_name: str, mappings) -> dict:
    if cls_name in mappings:
        spec = mappings[cls_name].INPUT_TYPES()
    else:
        spec = CORE_INPUTS[cls_name]
    return {**spec.get("required", {}), **spec.get("optional", {})}


def is_widget(spec: tuple) -> bool:
    kind = spec[0]
    return isinstance(kind, list) or kind in ("INT", "FLOAT", "STRING", "BOOLEAN")


def build(mappings, titles: dict[str, str]) -> tuple[dict, dict]:
    api, ui_nodes, ui_links = {}, [], []
    link_ids = {}
    for link_id, (src, slot, dst, name) in enumerate(LINKS, start=1):
        link_ids[(dst, name)] = link_id
        src_cls = next(c for i, c, *_ in NODES if i == src)
        out_type = mappings[src_cls].RETURN_TYPES[slot]
        dst_index = [n for n, s in input_types(next(c for i, c, *_ in NODES if i == dst), mappings).items()
                     if not is_widget(s)].index(name)
        ui_links.append([link_id, src, slot, dst, dst_index, out_type])
    for order, (node_id, cls_name, values, pos) in enumerate(NODES):
        inputs = input_types(cls_name, mappings)
        api_inputs = {}
        ui_inputs, widgets_values = [], []
        for name, spec in inputs.items():
            if is_widget(spec):
                api_inputs[name] = values[name]
                widgets_values.append(values[name])
            else:
                src, slot = next((s, sl) for s, sl, d, n in LINKS if d == node_id and n == name)
                api_inputs[name] = [str(src), slot]
                ui_inputs.append({"name": name, "type": spec[0], "link": link_ids[(node_id, name)]})
        api[str(node_id)] = {"class_type": cls_name, "inputs": api_inputs, "_meta": {"title": titles.get(cls_name, cls_name)}}
        outputs = []
        if cls_name in mappings:
            cls = mappings[cls_name]
            names = getattr(cls, "RETURN_NAMES", cls.RETURN_TYPES)
            for slot, (out_type, out_name) in enumerate(zip(cls.RETURN_TYPES, names)):
                links = [lid for lid, (s, sl, *_r) in enumerate(LINKS, start=1) if s == node_id and sl == slot]
                outputs.append({"name": out_name, "type": out_type, "links": links, "slot_index": slot})
        ui_nodes.append({
            "id": node_id, "type": cls_name, "pos": list(pos), "size": [340, 200], "flags": {}, "order": order,
            "mode": 0, "inputs": ui_inputs, "outputs": outputs,
            "properties": {"Node name for S&R": cls_name}, "widgets_values": widgets_values,
        })
    ui = {
        "last_node_id": max(n[0] for n in NODES), "last_link_id": len(LINKS), "nodes": ui_nodes,
        "links": ui_links, "groups": [], "config": {}, "extra": {}, "version": 0.4,
    }
    return ui, api


def main() -> None:
    pack = load_pack()
    ui, api = build(pack.NODE_CLASS_MAPPINGS, pack.NODE_DISPLAY_NAME_MAPPINGS)
    OUT.mkdir(exist_ok=True)
    (OUT / "qwen_image_lora_training.json").write_text(json.dumps(ui, indent=2) + "\n")
    (OUT / "api").mkdir(exist_ok=True)
    (OUT / "api" / "qwen_image_lora_training.api.json").write_text(json.dumps(api, indent=2) + "\n")
    print("wrote", OUT / "qwen_image_lora_training.json", "and its API twin")


if __name__ == "__main__":
    main()
