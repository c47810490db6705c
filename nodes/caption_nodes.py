"""The Caption Dataset node: captions written into a dataset folder by the text encoder file's own vision-language
model (trainer_core/captions), for the artist to read in the canvas before training."""

from __future__ import annotations

from ..trainer_core.captions.folder import EMPTY, KEPT, caption_dataset
from ..trainer_core.captions.review import caption_sheet
from ..trainer_core.core.config import CUSTOM_FOLDER, CaptionConfig
from ..trainer_core.core.errors import UserInputError
from ..trainer_core.data.images import folder_state
from ..trainer_core.models.tokenizer import tokenizer_candidates
from . import host
from .common import CATEGORY, engine_mode, pil_to_image
from .data_nodes import dataset_folder
from .widgets import widgets


class QwenLoRACaptionDataset:
    DESCRIPTION = (
        "Writes a caption (name.txt) beside every image of a dataset folder that has none, with the vision-language "
        "model inside the text encoder file you already have (Qwen2.5-VL for Qwen-Image, Edit and Layered; Qwen3-VL "
        "for 2.1): nothing is downloaded. Existing captions are kept (overwrite keeps the old one as name.txt.bak). "
        "The picture shows each image with its caption: read them, fix any on disk, then train (the Cache node "
        "encodes only what changed). The model is freed after; cancel stops between images, keeping what was written."
    )
    CATEGORY = CATEGORY
    FUNCTION = "caption"
    OUTPUT_NODE = True  # queued alone, before the training graph is built
    RETURN_TYPES = ("IMAGE", "STRING", "STRING")
    RETURN_NAMES = ("captions", "report", "folder")
    OUTPUT_TOOLTIPS = ("Each image with the caption it has now, to read before training.",
                       "One line per image (name: caption) and a summary.",
                       "The folder captioned (its full path): wire it into the Dataset node's folder, so the Dataset "
                       "reads the folder after its captions are written.")

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": widgets(CaptionConfig, "folder", "text_encoder", "style", "instruction", "trigger", "avoid",
                                    "max_new_tokens", "overwrite", "sampling_seed"),
                "optional": widgets(CaptionConfig, "input_folder", "text_encoder_fp8", "batch_size", "image_side")}

    @classmethod
    def IS_CHANGED(cls, folder, input_folder=CUSTOM_FOLDER, **_):
        # A caption edited or removed on disk runs the node again (it keeps the edited one and captions the removed).
        try:
            return folder_state(dataset_folder(folder, input_folder))
        except UserInputError as e:
            return str(e)

    def caption(self, folder, text_encoder, style, instruction, trigger, avoid, max_new_tokens, overwrite,
                sampling_seed, input_folder=CUSTOM_FOLDER, text_encoder_fp8="auto", batch_size=0, image_side=1024):
        settings = CaptionConfig(folder=dataset_folder(folder, input_folder), text_encoder=text_encoder, style=style,
                                 instruction=instruction, trigger=trigger, avoid=avoid, max_new_tokens=max_new_tokens,
                                 overwrite=overwrite, sampling_seed=sampling_seed, input_folder=input_folder,
                                 text_encoder_fp8=text_encoder_fp8, batch_size=batch_size, image_side=image_side)
        path = host.model_file_path("text_encoders", text_encoder)
        # the tokenizer as the Load node finds it: a tokenizer/ folder beside the file, else the one ComfyUI ships
        beside = any(c.is_dir() for c in tokenizer_candidates(None, path))
        progress = host.Progress(1)
        host.free_host_models()  # ComfyUI's own models out of the way of a 7-8B model, as the Cache node does

        def advance(done, total, _result):
            progress.update(done, total=total)  # raises ComfyUI's interrupt between images (what was written stays)

        with engine_mode():
            report = caption_dataset(settings, path, None if beside else host.bundled_qwen_tokenizer(),
                                     device=host.compute_device(), progress=advance)
        return (pil_to_image(caption_sheet(report.results)), report_text(report), settings.folder)


def report_text(report) -> str:
    shown = {KEPT: "(kept) ", EMPTY: "(no caption: the model wrote nothing usable)"}
    lines = [f"{r.image.name}: {shown.get(r.status, '')}{r.caption}" for r in report.results]
    return "\n".join([*lines, report.summary()])
