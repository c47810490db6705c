"""ComfyUI nodes: thin wrappers that turn widget values into trainer_core calls."""

from pathlib import Path

from . import host

from .caption_nodes import QwenLoRACaptionDataset
from .config_nodes import QwenLoRAConfig, QwenLoRAOptimizer
from .data_nodes import QwenLoRACache, QwenLoRADataset, QwenLoRADatasetMix, QwenLoRAImagesToDataset
from .edit_nodes import QwenLoRAEditDataset, QwenLoRAEditPreview, QwenLoRALoadEditModels
from .layered_nodes import QwenLoRALayeredDataset
from .model_nodes import QwenLoRALoadModels
from .output_nodes import QwenLoRACompareSteps, QwenLoRALossPlot, QwenLoRAPreview, QwenLoRASave
from .train_nodes import QwenLoRAInitTrainer, QwenLoRARelease, QwenLoRATrain

NODE_CLASS_MAPPINGS = {
    "QwenLoRALoadModels": QwenLoRALoadModels,
    "QwenLoRADataset": QwenLoRADataset,
    "QwenLoRADatasetMix": QwenLoRADatasetMix,
    "QwenLoRACache": QwenLoRACache,
    "QwenLoRAConfig": QwenLoRAConfig,
    "QwenLoRAOptimizer": QwenLoRAOptimizer,
    "QwenLoRAInitTrainer": QwenLoRAInitTrainer,
    "QwenLoRATrain": QwenLoRATrain,
    "QwenLoRAPreview": QwenLoRAPreview,
    "QwenLoRALossPlot": QwenLoRALossPlot,
    "QwenLoRACompareSteps": QwenLoRACompareSteps,
    "QwenLoRASave": QwenLoRASave,
    "QwenLoRARelease": QwenLoRARelease,
    "QwenLoRALoadEditModels": QwenLoRALoadEditModels,
    "QwenLoRAEditDataset": QwenLoRAEditDataset,
    "QwenLoRAEditPreview": QwenLoRAEditPreview,
    "QwenLoRALayeredDataset": QwenLoRALayeredDataset,
    "QwenLoRACaptionDataset": QwenLoRACaptionDataset,
    "QwenLoRAImagesToDataset": QwenLoRAImagesToDataset,
}

NODE_DISPLAY_NAME_MAPPINGS = {
    "QwenLoRALoadModels": "Load Qwen-Image (LoRA training)",
    "QwenLoRADataset": "Qwen LoRA Dataset",
    "QwenLoRADatasetMix": "Qwen LoRA Dataset Mix",
    "QwenLoRACache": "Qwen LoRA Cache Latents + Prompts",
    "QwenLoRAConfig": "Qwen LoRA Config",
    "QwenLoRAOptimizer": "Qwen LoRA Optimizer",
    "QwenLoRAInitTrainer": "Qwen LoRA Init Trainer",
    "QwenLoRATrain": "Qwen LoRA Train Steps",
    "QwenLoRAPreview": "Qwen LoRA Preview",
    "QwenLoRALossPlot": "Qwen LoRA Loss Plot",
    "QwenLoRACompareSteps": "Qwen LoRA Compare Steps",
    "QwenLoRASave": "Qwen LoRA Save",
    "QwenLoRARelease": "Qwen LoRA Release Memory",
    "QwenLoRALoadEditModels": "Load Qwen-Image-Edit (LoRA training)",
    "QwenLoRAEditDataset": "Qwen LoRA Edit Dataset",
    "QwenLoRAEditPreview": "Qwen LoRA Preview (Edit)",
    "QwenLoRALayeredDataset": "Qwen LoRA Layered Dataset",
    "QwenLoRACaptionDataset": "Qwen LoRA Caption Dataset",
    "QwenLoRAImagesToDataset": "Qwen LoRA Images to Dataset",
}

# The template browser lists the example workflows in their names' order, the first run first (host.py).
host.order_workflow_templates(Path(__file__).parent.parent.name)
