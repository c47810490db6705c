"""Writes example_workflows/*.json (UI format for the canvas, API format for POST /prompt) from one graph.

Run after changing a node's inputs: `python tools/build_workflows.py`. tests/canvas/test_workflows.py checks
every file against the node definitions, that no two nodes overlap and that each stage's group holds
its nodes.

The workflows come from one graph (NODES, LINKS): the real one (Qwen-Image files, settings a real
run wants), the Edit, Layered and 2.1 variants, a first-run one (the small pretrained shapes model and the star
pictures shipped with the pack) that trains and previews in a minute or two on a CPU, and that one with a
regularisation set mixed in by a Dataset Mix node (REG_NODES, REG_LINKS). Node sizes and positions are computed
here, not stored: a node's size follows its title, sockets and widgets (see `node_size`), the Note's its text (see
`note_size`), nodes are stacked in columns inside their stage's group below a row left for the frontend's
node-source badges, so a widget added to a node moves the nodes below it instead of hiding them. The file names are
the template browser's titles (WORKFLOWS); the pictures beside them come from tools/screenshots.py --thumbnail.
"""

from __future__ import annotations

import json
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "example_workflows"
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tools"))

from pack_import import load_pack  # noqa: E402
from trainer_core.families.comfyui_files import known_file  # noqa: E402
from trainer_core.runs.demo import SHAPES_LEARNING_RATE, SHAPES_MICRO_BATCH  # noqa: E402

# Stages: group key -> (title, canvas column, colour). Groups in one column are stacked top to bottom.
GROUPS = {
    "models": ("1. Models", 0, "#3f789e"),
    "data": ("2. Data and cache", 0, "#3f789e"),
    "lora": ("3. LoRA and optimizer", 1, "#8A8"),
    "train": ("4. Training (queue again to continue)", 2, "#b06634"),
    "look": ("5. Looking and saving", 3, "#88A"),
}

# (id, class, widget values by input name, (group, sub-column inside the group)). One node per entry;
# inside a group's sub-column nodes are stacked in this order. The values are the ones a real run wants
# (README, "Why these defaults"): learning rate 1e-4 with rank = alpha = 16 and 8-bit AdamW, 50 warm-up
# steps, 250 steps a queue (a preview and a LoRA file about every 250 steps, as ai-toolkit's Qwen-Image
# example samples and saves).
NODES = [
    (1, "QwenLoRALoadModels", {"source": "ComfyUI model files",
                               "transformer": "qwen_image_fp8_e4m3fn.safetensors",
                               "text_encoder": "qwen_2.5_vl_7b_fp8_scaled.safetensors",
                               "vae": "qwen_image_vae.safetensors", "diffusers_folder": "",
                               "storage": "float8", "compute_dtype": "auto", "text_encoder_fp8": "auto"},
     ("models", 0)),
    (2, "QwenLoRADataset", {"folder": "my_lora_dataset", "resolution": 1024, "enable_buckets": True,
                            "min_bucket_side": 512, "max_bucket_side": 2048, "repeats": 1,
                            "caption_extension": ".txt", "missing_caption": "error",
                            "upscale_small_images": False, "background": "white",
                            "allow_large_images": False, "validation_images": 0,
                            "input_folder": "(custom path)", "mask_background_weight": 0.1, "loss_weight": 1.0,
                            "is_regularization": False, "transparency": "auto"}, ("data", 0)),
    (3, "QwenLoRACache", {"preview_prompts": "a photo of sks dog on a beach", "negative_prompt": "",
                          "caching_batch_size": 4, "cache_folder": "", "preservation_trigger": "",
                          "preservation_class": ""}, ("data", 0)),
    (4, "QwenLoRAConfig", {"rank": 16, "alpha": 16.0, "dropout": 0.0, "targets": "attention+mlp",
                           "dtype": "float32", "adapter": "lora", "lokr_factor": -1, "lokr_decompose_both": False},
     ("lora", 0)),
    (5, "QwenLoRAOptimizer", {"optimizer": "adamw8bit", "learning_rate": 1e-4, "beta1": 0.9, "beta2": 0.999,
                              "eps": 1e-8, "weight_decay": 0.01, "warmup_steps": 50, "schedule": "constant",
                              "schedule_steps": 1000, "min_lr_ratio": 0.0, "max_grad_norm": 1.0, "ema": False,
                              "ema_decay": 0.999}, ("lora", 0)),
    (6, "QwenLoRAInitTrainer", {"run_name": "my_qwen_lora", "micro_batch_size": 1, "grad_accum_steps": 1,
                                "gradient_checkpointing": "auto", "blocks_to_swap": -1, "training_seed": 42,
                                "timestep_sampling": "logit_normal", "logit_mean": 0.0, "logit_std": 1.0,
                                "resolution_shift": True, "caption_dropout": 0.0, "checkpoint_every": 100,
                                "max_nonfinite_steps": 3, "continue_from_lora": "(none: start from zero)",
                                "validation_every": 0, "fp8_activations": False,
                                "compile_float8": False, "preservation_weight": 0.0,
                                "int8_compute": False, "fused_blocks": "auto", "attention_backend": "auto"},
     ("train", 0)),
    (13, "PreviewAny", {}, ("train", 0)),  # Init Trainer's status: started/resumed, blocks_to_swap, memory plan
    (7, "QwenLoRATrain", {"steps": 250, "preview_every": 25, "preview_size": 512, "preview_sampling_steps": 20,
                          "snapshot_every": 0}, ("train", 1)),
    (14, "PreviewAny", {}, ("train", 1)),  # Train Steps' report: steps, losses, speed
    (8, "QwenLoRAPreview", {"prompt": "", "width": 1024, "height": 1024, "steps": 20, "cfg": 4.0,
                            "preview_seed": 0, "weights": "raw"}, ("look", 0)),
    (10, "QwenLoRASave", {"filename": "{run_name}_{step}", "dtype": "bfloat16", "layout": "comfyui"}, ("look", 0)),
    (9, "QwenLoRALossPlot", {"width": 768, "height": 384}, ("look", 0)),
    (11, "SaveImage", {"filename_prefix": "qwen_lora/preview"}, ("look", 1)),
    (12, "PreviewImage", {}, ("look", 1)),
    (15, "QwenLoRACompareSteps", {"columns": 0, "tile_size": 256}, ("look", 0)),  # the live previews side by side
    (16, "PreviewImage", {}, ("look", 1)),
]

# (from node, from output slot, to node, to input name)
LINKS = [
    (1, 0, 3, "models"), (2, 0, 3, "dataset"),
    (1, 0, 6, "models"), (3, 0, 6, "cached_dataset"), (4, 0, 6, "lora_config"), (5, 0, 6, "optimizer_config"),
    (6, 0, 7, "trainer"), (7, 0, 8, "trainer"), (7, 0, 9, "trainer"), (7, 0, 10, "trainer"),
    (8, 0, 11, "images"), (9, 0, 12, "images"), (6, 1, 13, "source"), (7, 2, 14, "source"),
    (7, 0, 15, "trainer"), (15, 0, 16, "images"),
]

NOTE_ID = 100

# The Notes: one line per paragraph (the canvas wraps them to the box; `note_size` makes the box tall enough to show
# every line).
MAIN_NOTE = """How to train a Qwen-Image LoRA
1. Models: put ComfyUI's Qwen-Image files in models/diffusion_models, text_encoders and vae (missing ones: loading this workflow offers their downloads). Qwen-Image-2512 works the same: choose qwen_image_2512_fp8_e4m3fn as transformer.
2. Data: a folder of images with same-name .txt captions; set its path in Dataset.
3. Queue: Train Steps trains 250 steps per queue and shows the loss and a preview live. Queue again to continue; a stopped run resumes from its last checkpoint.
4. Preview shows the LoRA as it is now; Save writes it to models/loras.
No model files yet? Open the first-run workflow (1 First run ...): it trains on a CPU in a minute or two."""

TINY_NOTE = """First run: nothing to download. The shapes model that ships with the pack (a small Qwen-Image, 64x64 px) draws circles, squares and triangles; it has never seen a star. The 8 pictures of stars teach it one.
Queue it: 200 steps train in a minute or two on a CPU. Train Steps shows a preview every 50 steps beside the loss; Previews by step lays them side by side from step 0 (before training): the blob the model draws for "a red star" becomes a red star.
Queue again to continue; Save writes the LoRA to models/loras.
For a real LoRA open "2 Qwen-Image LoRA" and point it at your files."""

# The first-run workflow: the same graph with these values changed, and the Preview's 64 px picture enlarged 4x
# (nearest neighbour: each pixel a 4x4 block, nothing sampled differently) before it is shown and saved.
ENLARGE_ID = 20
ENLARGE = (ENLARGE_ID, "ImageScaleBy", {"upscale_method": "nearest-exact", "scale_by": 4.0}, ("look", 0))
TINY_NODES = [n for node in NODES for n in ((node, ENLARGE) if node[0] == 8 else (node,))]
TINY_LINKS = [*[link for link in LINKS if link != (8, 0, 11, "images")], (8, 0, ENLARGE_ID, "image"),
              (ENLARGE_ID, 0, 11, "images")]
TINY = {
    1: {"source": "shapes model (small, pretrained, ships with the pack)", "transformer": "(not used)", "text_encoder": "(not used)",
        "vae": "(not used)", "compute_dtype": "float32"},
    2: {"folder": "(example: stars)", "resolution": 64, "min_bucket_side": 32, "max_bucket_side": 128},
    3: {"preview_prompts": "a red star in the centre on a white background",
        "cache_folder": "qwen_lora_training/tiny_cache"},
    4: {"rank": 8, "alpha": 8.0},  # attention+mlp: on every layer the stars cost more of what the model knew
    # make demo's settings (runs/demo.py): all 8 pictures in every step, 2e-3
    5: {"learning_rate": SHAPES_LEARNING_RATE, "warmup_steps": 10, "weight_decay": 0.0},
    6: {"run_name": "tiny_first_run", "micro_batch_size": SHAPES_MICRO_BATCH, "gradient_checkpointing": "off",
        "blocks_to_swap": 0, "checkpoint_every": 200},
    7: {"steps": 200, "preview_every": 50, "preview_size": 64, "preview_sampling_steps": 20},
    15: {"columns": 5, "tile_size": 256},  # steps 0, 50, ..., 200 in one row, each preview 4x (nearest)
    8: {"width": 64, "height": 64},
    9: {"width": 512, "height": 256},
    11: {"filename_prefix": "qwen_lora/tiny_preview"},
}

# Qwen-Image-Edit: the same graph with the Edit loader, the Edit dataset and the Edit Preview (same sockets, so
# the same links). Edit Preview edits the first training sample's controls; wire a Load Image into its
# control_image_1 to edit another picture from the canvas.
EDIT_NOTE = """How to train a Qwen-Image-Edit LoRA (Edit, Edit-2509, Edit-2511)
1. Models: an Edit transformer in models/diffusion_models (the variant is read from the file), qwen_2.5_vl_7b_fp8_scaled (it has the vision tower), qwen_image_vae. Missing ones: loading this workflow offers their downloads.
2. Data: per sample name.png + name.txt (the instruction) + name_control.png (name_control_2.png, name_control_3.png for 2509/2511), or control/name.png.
3. Queue; queue again to continue. Preview (Edit) edits the first sample's controls, or a Load Image wired into its control_image_1; Save writes to models/loras."""

EDIT_CLASSES = {"QwenLoRAPreview": "QwenLoRAEditPreview"}  # same widgets, plus the control image sockets
EDIT_NODES = [
    (1, "QwenLoRALoadEditModels", {"source": "ComfyUI model files",
                                   "transformer": "qwen_image_edit_2511_fp8mixed.safetensors",
                                   "text_encoder": "qwen_2.5_vl_7b_fp8_scaled.safetensors",
                                   "vae": "qwen_image_vae.safetensors", "diffusers_folder": "",
                                   "storage": "float8", "compute_dtype": "auto", "text_encoder_fp8": "dequantize",
                                   "edit_variant": "auto"}, ("models", 0)),
    (2, "QwenLoRAEditDataset", {**dict(NODES[1][2]), "folder": "my_edit_dataset", "control_resolution": 0},
     ("data", 0)),
    *[(i, EDIT_CLASSES.get(c, c), v, place) for i, c, v, place in NODES if i not in (1, 2)],
]
EDIT = {3: {"preview_prompts": "turn the sky into a sunset"}, 6: {"run_name": "my_qwen_edit_lora"}}

# Qwen-Image-Layered: the text-to-image graph with the Layered dataset; the Load node reads the family from
# the transformer file. Preview decomposes the first training sample's composite.
LAYERED_NOTE = """How to train a Qwen-Image-Layered LoRA (RGBA layers)
1. Models: qwen_image_layered_bf16 in models/diffusion_models (the Load node reads Layered from the file), qwen_2.5_vl_7b_fp8_scaled, qwen_image_layered_vae. Missing ones: loading this workflow offers their downloads.
2. Data: per sample name.png (the composite) + name.txt + name_layer_1.png, name_layer_2.png, ... (RGBA, the composite's size), numbered from 1.
3. Queue; queue again to continue. Preview decomposes the first composite and shows its layers side by side; Save writes to models/loras."""

LAYERED_NODES = [
    (1, NODES[0][1], {**dict(NODES[0][2]), "transformer": "qwen_image_layered_bf16.safetensors",
                      "vae": "qwen_image_layered_vae.safetensors"}, NODES[0][3]),
    (2, "QwenLoRALayeredDataset", {**dict(NODES[1][2]), "folder": "my_layered_dataset", "resolution": 640},
     ("data", 0)),
    *[(i, c, v, place) for i, c, v, place in NODES if i not in (1, 2)],
]
LAYERED = {3: {"preview_prompts": "a poster: a title over a photo"}, 6: {"run_name": "my_qwen_layered_lora"}}

# Qwen-Image 2.1: the text-to-image graph; the Load node reads 2.1 from the transformer file. The file names are those
# ComfyUI's own 2.1 templates download (int8 ConvRot transformer and text encoder, the bf16 VAE); the processor (and
# any part set to (not used)) comes from a diffusers 2.1 folder.
QWEN21_NOTE = """How to train a Qwen-Image 2.1 LoRA (text-to-image)
1. Models: the files ComfyUI's 2.1 template downloads (loading this workflow offers the missing ones): qwen_image_2.1_int8_convrot (models/diffusion_models; the Load node reads 2.1 from it), qwen3vl_8b_int8_convrot (text_encoders), qwen_image_2.1_vae_bf16 (vae); and in diffusers_folder the diffusers folder of the Hugging Face repository Qwen/Qwen-Image-2.1, of which only model_index.json and processor/ are read (hf download Qwen/Qwen-Image-2.1 --include model_index.json "processor/*" --local-dir models/diffusers/Qwen-Image-2.1).
2. Data: per sample name.png + name.txt (its caption), as for Qwen-Image.
3. Queue; queue again to continue. Preview samples with the 2.1 pipeline; Save writes to models/loras (ComfyUI's 2.1 layout, the MLP pair fused).
To edit with 2.1: the Edit workflow, these files in its Load Edit node, an Edit Dataset (its controls are the reference images), Preview (Edit)."""

QWEN21_NODES = [
    (1, NODES[0][1], {**dict(NODES[0][2]), "transformer": "qwen_image_2.1_int8_convrot.safetensors",
                      "text_encoder": "qwen3vl_8b_int8_convrot.safetensors", "vae": "qwen_image_2.1_vae_bf16.safetensors",
                      "diffusers_folder": "models/diffusers/Qwen-Image-2.1"}, NODES[0][3]),
    *[(i, c, v, place) for i, c, v, place in NODES if i != 1],
]
QWEN21 = {3: {"preview_prompts": "a lighthouse on a cliff at dusk"}, 6: {"run_name": "my_qwen_image21_lora"}}

# The first-run workflow with a regularisation set mixed in (run_files/shapes_stars_regularized.toml in the canvas):
# a second Dataset node with the 24 known-shape pictures shipped with the pack, marked is_regularization at a lower
# loss_weight, and a Dataset Mix that hands both to the Cache node; the stars come up 3 times a round.
REG_NOTE = """First run with a regularisation set: the shapes model learns stars while 24 pictures of the shapes it already draws (circles, squares, triangles) train beside them, so it forgets less of them (benchmarks/README.md).
Dataset Mix joins the two Dataset nodes for the Cache node; each keeps its own repeats and loss_weight, and the loss report shows each set's mean.
Queue it: 200 steps train in a few minutes on a CPU; queue again to continue."""

REG_WEIGHT = 0.5  # the regularisation set's loss_weight: it keeps the prior without outweighing the stars

REG_NODES = [
    *TINY_NODES,
    (17, "QwenLoRADataset", dict(NODES[1][2]), ("data", 1)),  # the regularisation set
    (18, "QwenLoRADatasetMix", {}, ("data", 1)),
    (19, "PreviewAny", {}, ("data", 1)),  # Dataset Mix's summary: each set's images, buckets and weight
]
REG_LINKS = [
    *[(src, slot, dst, name) for src, slot, dst, name in TINY_LINKS if (dst, name) != (3, "dataset")],
    (2, 0, 18, "dataset_1"), (17, 0, 18, "dataset_2"), (18, 0, 3, "dataset"), (18, 1, 19, "source"),
]
REG = {
    **TINY,
    2: {**TINY[2], "repeats": 3},  # 24 star draws a round against the set's 24 pictures (kohya's balance)
    17: {**TINY[2], "folder": "(example: shapes regularization)", "is_regularization": True, "loss_weight": REG_WEIGHT},
    6: {**TINY[6], "run_name": "tiny_regularized"},
    11: {"filename_prefix": "qwen_lora/tiny_regularized_preview"},
}

# Captions first: the text-to-image graph with a Caption Dataset node that writes the missing captions with the text
# encoder file's own vision-language model, its folder wired into the Dataset node (so the Dataset reads the folder
# after the captions are written), its review picture and report beside it.
CAPTION_NOTE = """Caption your images, then train a Qwen-Image LoRA
1. Models: as in "2 Qwen-Image LoRA": qwen_2.5_vl_7b_fp8_scaled in text_encoders writes the captions too (its vision tower; nothing else to download).
2. Data: a folder of images; set its path in Caption Dataset. Images without a name.txt get one; your own captions are kept. Set a trigger word if the LoRA should have one.
3. Queue once with Train Steps' steps at 0: the captions are written and cached, nothing trains, Save writes nothing (Preview shows the model before training). Read the captions in the picture; fix any in its .txt file. Set steps back to 250 and queue again to train: the captions you kept or edited are used as they are."""

CAPTION_ID, CAPTION_SHEET_ID, CAPTION_REPORT_ID = 21, 22, 23
CAPTION_NODES = [
    (CAPTION_ID, "QwenLoRACaptionDataset", {"folder": "my_lora_dataset",
                                            "text_encoder": "qwen_2.5_vl_7b_fp8_scaled.safetensors", "style": "short",
                                            "instruction": "", "trigger": "", "avoid": "", "max_new_tokens": 0,
                                            "overwrite": False, "sampling_seed": -1, "input_folder": "(custom path)",
                                            "text_encoder_fp8": "auto", "batch_size": 0, "image_side": 1024},
     ("data", 1)),
    (CAPTION_SHEET_ID, "PreviewImage", {}, ("data", 1)),
    (CAPTION_REPORT_ID, "PreviewAny", {}, ("data", 1)),
    *NODES,
]
CAPTION_LINKS = [*LINKS, (CAPTION_ID, 2, 2, "folder"), (CAPTION_ID, 0, CAPTION_SHEET_ID, "images"),
                 (CAPTION_ID, 1, CAPTION_REPORT_ID, "source")]
CAPTION = {6: {"run_name": "my_captioned_lora"}}

# Images from the graph: the first-run graph with the Dataset node replaced by Images to Dataset, fed by ComfyUI's own
# Load Image (ComfyUI ships input/example.png) and Image Crop: any IMAGE batch a workflow loads, generates or edits
# trains the same way. The shapes model learns the crop in a few minutes on a CPU.
GRAPH_NOTE = """Train on images from the graph: nothing to download. Load Image loads ComfyUI's example picture, Image Crop cuts a square out of it, and Images to Dataset hands the pictures and their captions to the Cache node as a dataset folder would.
Wire any IMAGE batch into images (Batch Images, a generated batch, an edit) and type one caption per picture, a line each, or one line for all; a MASK batch wired into mask weights the loss (1 trains).
Queue it: the shapes model (a small Qwen-Image) learns the crop in a few minutes on a CPU. An unchanged batch is not encoded again; a changed picture is.
For a real LoRA use these nodes in "2 Qwen-Image LoRA" in place of its Dataset node."""

LOAD_IMAGE_ID, CROP_ID = 24, 25
GRAPH_NODES = [
    (LOAD_IMAGE_ID, "LoadImage", {"image": "example.png"}, ("data", 0)),
    (CROP_ID, "ImageCrop", {"width": 384, "height": 384, "x": 192, "y": 192}, ("data", 0)),  # the middle of 768²
    (2, "QwenLoRAImagesToDataset", {"captions": "a picture of sks", "resolution": 64, "enable_buckets": True,
                                    "min_bucket_side": 32, "max_bucket_side": 128, "repeats": 8,
                                    "upscale_small_images": False, "background": "white", "transparency": "auto",
                                    "validation_images": 0, "mask_background_weight": 0.1, "loss_weight": 1.0,
                                    "is_regularization": False}, ("data", 0)),
    *[node for node in TINY_NODES if node[0] != 2],
]
GRAPH_LINKS = [(LOAD_IMAGE_ID, 0, CROP_ID, "image"), (CROP_ID, 0, 2, "images"), *TINY_LINKS]
GRAPH = {
    **{k: v for k, v in TINY.items() if k != 2},
    3: {**TINY[3], "preview_prompts": "a picture of sks"},
    6: {**TINY[6], "run_name": "tiny_graph_images", "micro_batch_size": 1},
    11: {"filename_prefix": "qwen_lora/tiny_graph_preview"},
}
GRAPH_TITLES = {2: "Images to Dataset: the crop, captioned", LOAD_IMAGE_ID: "Load Image (ComfyUI's example)",
                CROP_ID: "Image Crop: a square of it"}

# The nodes' titles where the type's name does not say what the node does here (by node id, for every workflow that
# has the node; a workflow's own titles go on top).
TITLES = {
    13: "Init Trainer's status",  # PreviewAny: started or resumed, blocks_to_swap, memory plan
    14: "Train Steps' report",  # PreviewAny: steps, losses, speed
    11: "Preview image (saved to output)",
    12: "Loss curve",
    16: "Previews by step",
    19: "Dataset Mix summary",  # PreviewAny: each set's images, buckets and weight
    ENLARGE_ID: "Enlarge 4x for display (nearest)",
}
CAPTION_TITLES = {2: "Dataset: the captioned folder", CAPTION_SHEET_ID: "The captions, to read before training",
                  CAPTION_REPORT_ID: "Caption report"}
TINY_TITLES = {1: "Load the shapes model (ships with the pack)", 2: "Dataset: 8 pictures of stars"}
REG_TITLES = {**TINY_TITLES, 2: "Dataset: the stars (to learn)", 17: "Dataset: known shapes (regularisation)"}

# The box an image-showing node gives its image (width, height of the area below its sockets and widgets), by
# class, and by node id where a workflow shows a larger image there. The canvas scales an image down to fit its
# box, never up.
IMAGE_BOX = {"QwenLoRATrain": (560, 290),  # the live image: the newest preview (512 px) beside the loss plot
             "SaveImage": (360, 300), "PreviewImage": (360, 260), "LoadImage": (300, 300)}
MAIN_IMAGE_BOXES = {16: (520, 440)}  # Compare Steps: 11 previews of 256 px, 4 a row
TINY_IMAGE_BOXES = {16: (720, 230), 11: (300, 300)}  # 5 previews in one row; the enlarged 256 px preview


@dataclass
class Workflow:
    """One example workflow: the graph's widget values changed by node id, its Note, nodes, links, titles, image
    boxes, and what the template browser shows of it (the file name is its title there)."""

    overrides: dict
    note: str
    nodes: list = field(default_factory=lambda: NODES)
    links: list = field(default_factory=lambda: LINKS)
    titles: dict = field(default_factory=dict)
    image_boxes: dict = field(default_factory=lambda: MAIN_IMAGE_BOXES)


# File stem -> workflow. ComfyUI's template browser (frontends 1.27 and 1.49) reads nothing but the file names of a
# pack's workflows (and a same-name .jpg as the picture): the stem is the title, the number in front the order
# (nodes/host.py sorts the pack's list by name, which ComfyUI leaves in the folder's order; the browser's
# Alphabetical sort and Windows' folder order agree), so the first run comes first.
FIRST_RUN = "1 First run - learn a star on a CPU"
MAIN = "2 Qwen-Image LoRA - your images"
EDIT_STEM = "3 Qwen-Image-Edit LoRA - pairs"
QWEN21_STEM = "4 Qwen-Image 2.1 LoRA - your images"
LAYERED_STEM = "5 Qwen-Image-Layered LoRA - RGBA"
REGULARIZED = "6 First run with a regularisation set"
CAPTIONED = "7 Qwen-Image LoRA - captions first"
GRAPH_IMAGES = "8 Images from the graph - CPU"
WORKFLOWS = {
    FIRST_RUN: Workflow(TINY, TINY_NOTE, TINY_NODES, TINY_LINKS, TINY_TITLES, TINY_IMAGE_BOXES),
    MAIN: Workflow({}, MAIN_NOTE, titles={2: "Dataset: your images"}),
    EDIT_STEM: Workflow(EDIT, EDIT_NOTE, EDIT_NODES),
    QWEN21_STEM: Workflow(QWEN21, QWEN21_NOTE, QWEN21_NODES, titles={2: "Dataset: your images"}),
    LAYERED_STEM: Workflow(LAYERED, LAYERED_NOTE, LAYERED_NODES),
    REGULARIZED: Workflow(REG, REG_NOTE, REG_NODES, REG_LINKS, REG_TITLES, TINY_IMAGE_BOXES),
    CAPTIONED: Workflow(CAPTION, CAPTION_NOTE, CAPTION_NODES, CAPTION_LINKS, CAPTION_TITLES,
                        {**MAIN_IMAGE_BOXES, CAPTION_SHEET_ID: (360, 420)}),
    GRAPH_IMAGES: Workflow(GRAPH, GRAPH_NOTE, GRAPH_NODES, GRAPH_LINKS, {**TINY_TITLES, **GRAPH_TITLES},
                           TINY_IMAGE_BOXES),
}

# Core nodes the workflows use, as ComfyUI declares them: inputs, and outputs as (type, name).
CORE_INPUTS = {
    "SaveImage": {"required": {"images": ("IMAGE",), "filename_prefix": ("STRING", {"default": "ComfyUI"})}},
    "PreviewImage": {"required": {"images": ("IMAGE",)}},
    "PreviewAny": {"required": {"source": ("*", {})}},
    "ImageScaleBy": {"required": {"image": ("IMAGE",),
                                  "upscale_method": (["nearest-exact", "bilinear", "area", "bicubic", "lanczos"],),
                                  "scale_by": ("FLOAT", {"default": 1.0, "min": 0.01, "max": 8.0, "step": 0.01})}},
    # Load Image: its file list is the input folder's; the canvas adds an upload button, stored as a second value
    "LoadImage": {"required": {"image": (["example.png"], {"image_upload": True})}},
    "ImageCrop": {"required": {"image": ("IMAGE",), **{name: ("INT", {"default": default, "min": low, "max": 16384,
                                                                     "step": 1})
                                                      for name, default, low in (("width", 512, 1), ("height", 512, 1),
                                                                                 ("x", 0, 0), ("y", 0, 0))}}},
}
CORE_OUTPUTS = {"ImageScaleBy": [("IMAGE", "IMAGE")], "LoadImage": [("IMAGE", "IMAGE"), ("MASK", "MASK")],
                "ImageCrop": [("IMAGE", "IMAGE")]}

# --- Sizes, the way the LiteGraph canvas (ComfyUI frontend 1.49) computes a node's size: the title bar
# (30 px) sits above `pos`; the body has one 20 px row per socket row (inputs and outputs side by side),
# then every widget (20 px, multiline text boxes at least 50 px) plus 4 px, 8 px after the widgets and
# 6 px at the bottom. Width: at least 1.5 x 140 px with widgets, and the longest label with its value.
TITLE_H = 30
SLOT_H = 20
WIDGET_H = 20
TEXTBOX_H = 80  # a multiline text box (the canvas' minimum is 50)
CHAR_W = 7.0  # widget text (the canvas measures its ~12 px font; 7 px a character covers it)
# The title: 14 px Inter (measured 7.97 px a character on "Qwen LoRA Compare Steps"), drawn within the node's width
# less two title-bar heights; 8.6 px a character covers wider letters.
TITLE_CHAR_W = 8.6
# Nodes that show an image while or after they run (Train Steps' live loss plot is a progress preview).
SHOWS_IMAGE = {"SaveImage", "PreviewImage", "QwenLoRATrain", "LoadImage"}
DISPLAY_TEXTBOX = {"PreviewAny"}  # the canvas adds a text box that shows the value, and a markdown toggle
REPORT_H = 120
# Init Trainer's status (what happened, the model and its licence, blocks_to_swap, the memory plan's verdict and where
# the whole plan is: ~10 lines at this width, more with warnings): a wider, taller text box, so its last line shows.
STATUS_ID = 13
REPORT_BOXES = {STATUS_ID: (520, 240)}
GAP = 30  # between stacked nodes (below a node's body, above the next one's title bar)
GROUP_PAD = 12
GROUP_TITLE_H = 40  # a group's title bar (font 24)
GROUP_TITLE_CHAR_W = 14.0  # its title at 24 px (Inter / Arial: 12-13.5 px a character)
# The frontend draws each custom node's source badge (the pack's name) in a row just above the node's title bar:
# the first node of a group starts this much lower, so the badge sits below the group's title, not over it.
BADGE_ROW = 26
# The Note: a text box of 10 px monospace (frontends 1.27 and 1.49: 6.02 px a character, 11 px a line with DejaVu
# Sans Mono; Consolas and Menlo are narrower or no wider, and up to 12 px a line), 20 px narrower and 22 px lower than
# the node, 2 px padding. Sized for 6.1 px a character, 12 px a line, a scroll bar's width and one spare line.
NOTE_W = 460
NOTE_CHAR_W = 6.1
NOTE_LINE_H = 12
NOTE_SCROLLBAR_W = 15


def note_size(text: str, width: int = NOTE_W) -> tuple[int, int]:
    """(width, height) of a Note that shows every line of `text` as the canvas wraps it (at spaces and hyphens)."""
    columns = int((width - 20 - 4 - NOTE_SCROLLBAR_W) // NOTE_CHAR_W)
    lines = sum(max(1, len(textwrap.wrap(paragraph, columns))) for paragraph in text.split("\n"))
    return width, int(round((lines + 1) * NOTE_LINE_H + 4 + 22 + 5, -1))


def input_types(cls_name: str, mappings) -> dict:
    if cls_name in mappings:
        spec = mappings[cls_name].INPUT_TYPES()
    else:
        spec = CORE_INPUTS[cls_name]
    return {**spec.get("required", {}), **spec.get("optional", {})}


def output_types(cls_name: str, mappings) -> list[tuple[str, str]]:
    """(type, name) of each output."""
    if cls_name in mappings:
        cls = mappings[cls_name]
        return list(zip(cls.RETURN_TYPES, getattr(cls, "RETURN_NAMES", cls.RETURN_TYPES)))
    return CORE_OUTPUTS.get(cls_name, [])


def is_widget(spec: tuple) -> bool:
    kind = spec[0]
    return isinstance(kind, list) or kind in ("INT", "FLOAT", "STRING", "BOOLEAN")


def is_textbox(spec: tuple) -> bool:
    return spec[0] == "STRING" and len(spec) > 1 and bool(spec[1].get("multiline"))


def node_size(cls_name: str, title: str, inputs: dict, values: dict, out_names: list[str],
              image_box: tuple[int, int] | None = None,
              report_box: tuple[int, int] = (IMAGE_BOX["PreviewImage"][0], REPORT_H)) -> tuple[int, int]:
    """(width, height) of a node's body (the title bar is above it); `report_box`: a PreviewAny's text box."""
    sockets = [n for n, s in inputs.items() if not is_widget(s)]
    widgets = [(n, s) for n, s in inputs.items() if is_widget(s)]
    rows = max(len(sockets), len(out_names), 1)
    height = rows * SLOT_H
    widget_heights = [TEXTBOX_H if is_textbox(s) else WIDGET_H for _, s in widgets]
    if cls_name in DISPLAY_TEXTBOX:  # the value's text box (room for a report of a few lines) and a toggle
        widget_heights += [report_box[1], WIDGET_H]
    if widget_heights:
        height += sum(h + 4 for h in widget_heights) + 8
    height += 6
    width = 1.5 * 140 if widget_heights else 140
    if image_box is not None:
        height += image_box[1]
        width = image_box[0]
    elif cls_name in DISPLAY_TEXTBOX:
        width = report_box[0]
    width = max(width, len(title) * TITLE_CHAR_W + 2 * TITLE_H,  # the title, at the canvas' 14 px font
                (max(map(len, sockets), default=0) + max(map(len, out_names), default=0)) * CHAR_W + 2 * SLOT_H + 5)
    for name, spec in widgets:
        shown = "" if is_textbox(spec) else str(values.get(name, ""))
        # label + value + the widget's margins and arrows (2 x (15 + 6 + 10)) + a gap between them
        width = max(width, min(len(name) + len(shown), 64) * CHAR_W + 62 + 20)
    return int(round(width / 10 + 0.49)) * 10, int(round(height / 10 + 0.49)) * 10


def layout(sizes: dict[int, tuple[int, int]], places: dict[int, tuple[str, int]], note: tuple[int, int]):
    """Positions of the nodes (top-left of the body) and the groups' bounding boxes [x, y, w, h]; the Note (its
    size given) sits above the first column."""
    positions, groups = {}, {}
    column_x = 40
    for column in sorted({c for _, c, _ in GROUPS.values()}):
        y = 40 + (note[1] + TITLE_H + GAP if column == 0 else 0)  # the Note sits above the first column
        column_w = note[0] + 2 * GROUP_PAD if column == 0 else 0
        for key, (title, col, _colour) in GROUPS.items():
            if col != column:
                continue
            members = [i for i, (g, _) in places.items() if g == key]
            if not members:
                continue
            x = column_x + GROUP_PAD
            top = y + GROUP_TITLE_H + BADGE_ROW + TITLE_H
            bottom = top
            for sub in sorted({places[i][1] for i in members}):
                sub_y, sub_w = top, 0
                for i in (i for i in members if places[i][1] == sub):
                    positions[i] = (x, sub_y)
                    sub_y += sizes[i][1] + GAP + TITLE_H
                    sub_w = max(sub_w, sizes[i][0])
                bottom = max(bottom, sub_y - GAP - TITLE_H)
                x += sub_w + GAP
            width = max(x - GAP + GROUP_PAD - column_x, int(len(title) * GROUP_TITLE_CHAR_W) + 2 * GROUP_PAD)
            groups[key] = [column_x, y, width, bottom + GROUP_PAD - y]
            column_w = max(column_w, width)
            y = bottom + GROUP_PAD + GAP
        column_x += column_w + 40
    return positions, groups


def loader_models(cls_name: str, values: dict) -> list[dict]:
    """`properties.models` of a Load node, as ComfyUI's own templates write them on their loaders: for each model file
    it names that ComfyUI's templates download (families/comfyui_files.py), the file name, Comfy-Org's download
    address and the models folder. The frontend lists the ones the user lacks when the workflow is loaded and offers
    their downloads."""
    if not cls_name.startswith("QwenLoRALoad"):
        return []
    entries = [known_file(values.get(part, "")) for part in ("transformer", "text_encoder", "vae")]
    return [{"name": e.name, "url": e.url, "directory": e.folder} for e in entries if e is not None and e.url]


def build(mappings, display_names: dict[str, str], workflow: Workflow) -> tuple[dict, dict]:
    links = workflow.links
    nodes = [(i, c, {**v, **workflow.overrides.get(i, {})}, place) for i, c, v, place in workflow.nodes]
    titles = {**TITLES, **workflow.titles}
    title_of = {i: titles.get(i, display_names.get(c, c)) for i, c, _v, _p in nodes}
    api, ui_nodes, ui_links = {}, [], []
    link_ids = {}

    def ui_input_names(node_id: int) -> list[str]:
        """A node's UI inputs in order: its sockets, then the widgets a link feeds (the canvas adds a socket to a
        widget that takes a link, e.g. the Dataset's folder wired from Caption Dataset)."""
        spec = input_types(next(c for i, c, *_ in nodes if i == node_id), mappings)
        wired = {n for _s, _sl, d, n in links if d == node_id}
        return ([n for n, s in spec.items() if not is_widget(s)]
                + [n for n, s in spec.items() if is_widget(s) and n in wired])

    for link_id, (src, slot, dst, name) in enumerate(links, start=1):
        link_ids[(dst, name)] = link_id
        out_type = output_types(next(c for i, c, *_ in nodes if i == src), mappings)[slot][0]
        ui_links.append([link_id, src, slot, dst, ui_input_names(dst).index(name), out_type])
    sizes = {}
    for node_id, cls_name, values, _place in nodes:
        box = workflow.image_boxes.get(node_id, IMAGE_BOX.get(cls_name))
        report = REPORT_BOXES.get(node_id, (IMAGE_BOX["PreviewImage"][0], REPORT_H))
        sizes[node_id] = node_size(cls_name, title_of[node_id], input_types(cls_name, mappings), values,
                                   [name for _, name in output_types(cls_name, mappings)], box, report)
    note_box = note_size(workflow.note) if workflow.note else (0, -TITLE_H - GAP)
    positions, group_boxes = layout(sizes, {i: place for i, _c, _v, place in nodes}, note_box)
    for order, (node_id, cls_name, values, _place) in enumerate(nodes):
        inputs = input_types(cls_name, mappings)
        api_inputs = {}
        ui_inputs, widgets_values, wired_widgets = [], [], []
        for name, spec in inputs.items():
            if is_widget(spec):
                widgets_values.append(values[name])  # kept by the canvas even where a link feeds the widget
                if len(spec) > 1 and spec[1].get("image_upload"):
                    widgets_values.append("image")  # Load Image's upload button: the canvas stores its value too
                link = next(((s, sl) for s, sl, d, n in links if d == node_id and n == name), None)
                if link is None:
                    api_inputs[name] = values[name]
                    continue
                api_inputs[name] = [str(link[0]), link[1]]
                wired_widgets.append({"name": name, "type": spec[0] if isinstance(spec[0], str) else "COMBO",
                                      "widget": {"name": name}, "link": link_ids[(node_id, name)]})
            else:
                link = next(((s, sl) for s, sl, d, n in links if d == node_id and n == name), None)
                if link is None:  # an optional socket left open (Edit Preview's control images): the canvas lists it
                    ui_inputs.append({"name": name, "type": spec[0], "link": None})
                    continue
                api_inputs[name] = [str(link[0]), link[1]]
                ui_inputs.append({"name": name, "type": spec[0], "link": link_ids[(node_id, name)]})
        ui_inputs += wired_widgets
        api[str(node_id)] = {"class_type": cls_name, "inputs": api_inputs, "_meta": {"title": title_of[node_id]}}
        outputs = []
        for slot, (out_type, out_name) in enumerate(output_types(cls_name, mappings)):
            out_links = [lid for lid, (s, sl, *_r) in enumerate(links, start=1) if s == node_id and sl == slot]
            outputs.append({"name": out_name, "type": out_type, "links": out_links, "slot_index": slot})
        properties = {"Node name for S&R": cls_name}
        models = loader_models(cls_name, values)
        if models:
            properties["models"] = models
        ui_node = {
            "id": node_id, "type": cls_name, "pos": list(positions[node_id]), "size": list(sizes[node_id]),
            "flags": {}, "order": order, "mode": 0, "inputs": ui_inputs, "outputs": outputs,
            "properties": properties, "widgets_values": widgets_values,
        }
        if node_id in titles:
            ui_node["title"] = titles[node_id]
        ui_nodes.append(ui_node)
    if workflow.note:
        # ComfyUI's core Note: a frontend-only (virtual) node holding one text box; the canvas leaves it out
        # of the prompt it queues, so the API twin has no entry for it.
        ui_nodes.append({
            "id": NOTE_ID, "type": "Note", "pos": [40 + GROUP_PAD, 40 + TITLE_H], "size": list(note_box),
            "flags": {}, "order": len(nodes), "mode": 0, "inputs": [], "outputs": [],
            "properties": {"text": ""}, "widgets_values": [workflow.note], "color": "#432", "bgcolor": "#653",
        })
    groups = [{"id": n, "title": GROUPS[key][0], "bounding": box, "color": GROUPS[key][2], "font_size": 24,
               "flags": {}} for n, (key, box) in enumerate(group_boxes.items(), start=1)]
    ui = {
        "last_node_id": max(n["id"] for n in ui_nodes), "last_link_id": len(links), "nodes": ui_nodes,
        "links": ui_links, "groups": groups, "config": {}, "extra": {}, "version": 0.4,
    }
    return ui, api


def main() -> None:
    pack = load_pack()
    OUT.mkdir(exist_ok=True)
    (OUT / "api").mkdir(exist_ok=True)
    for stem, workflow in WORKFLOWS.items():
        ui, api = build(pack.NODE_CLASS_MAPPINGS, pack.NODE_DISPLAY_NAME_MAPPINGS, workflow)
        (OUT / f"{stem}.json").write_text(json.dumps(ui, indent=2) + "\n")
        (OUT / "api" / f"{stem}.api.json").write_text(json.dumps(api, indent=2) + "\n")
        print("wrote", OUT / f"{stem}.json", "and its API twin")


if __name__ == "__main__":
    main()
