"""The model-family seam: what differs between model families and tasks, behind one small protocol.

A family is what a model set *is* (`QwenImageComponents.family`): Qwen-Image text-to-image (qwen_image.py),
a Qwen-Image-Edit variant (qwen_image_edit/) or Qwen-Image-Layered (qwen_image_layered/). The shared engine
(cache, training step, memory plan, previews, demo) is written once and asks the family at these hooks, never
the samples or the model set what they happen to carry:

    what it is       name, display_name, dataset_kinds (the dataset conventions it trains on),
                     previews_take_condition_images
    data and cache   load_dataset, check_samples, cache_conditioning (keys and encoding of targets, prompts
                     and conditions), data_settings, check_cached
    training step    patch_size, batch_group, dropped_text_key, conditions, token_grid, pack, resolution_mu,
                     transformer_inputs, extra_transformer_kwargs, transformer_kwargs, loss_tokens,
                     target_prediction
    memory plan      planned_image_size, planned_vision_sizes, planned_arch, planned_parts, planned_caption_parts
    previews         preview_inputs, preview_pipeline, preview_image
    built-ins        tiny_components, demo, export_tiny

Tensor shapes (text-to-image Qwen-Image; another family documents its own):
    latents      (C, h, w) per sample, normalised; a micro-batch stacks them to (B, C, h, w)
    hidden       (B, N, D_in) packed noisy target tokens, N = grid[0] * grid[1]
    conditions   per sample a list of condition latents [(C, h_i, w_i)] (Edit: the control images; Qwen-Image
                 2.1: its reference images), or None
    embedding    (L, D) prompt embedding per prompt
(Layered: latents (C, F, h, w), the composite and its layers as frames; its grid (F, h/2, w/2).)

A family's package imports what it needs at its top: nothing imports it before one of its families is asked for
(families/registry.py), and the names the CLI and the run file read are the registry's.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diffusers import FlowMatchEulerDiscreteScheduler, QwenImagePipeline

from ..core.errors import UserInputError
from ..data.cache import latent_key
from ..data.edit_dataset import EditSample
from ..data.images import IMAGES, load_dataset
from ..models.latents import pack_latents
from ..models.scheduler import resolution_mu
from ..planner.arch import QwenImageArch, real_arch
from ..planner.inference import PartSizes, real_parts
from .registry import family_names, get_family
from .sampling import prompt_embedding

# write(tensors, kind, key, what): the shared cache builder's atomic write of one entry
# (kind "latents" or "text"; `what` names the input in an error).
Write = Callable[[dict, str, str, str], None]


class CacheConditioning:
    """A family's part of one cache build (`cache.build_cache`), made by `ModelFamily.cache_conditioning`
    for one model set, sample list and data settings. The target latents are the shared builder's own
    (an RGB image to (C, h, w)) unless the family keys and encodes them itself (`target_key`,
    `encode_target`: Layered's composite and layers, (C, F, h, w))."""

    def target_key(self, sample, vae_fingerprint: str) -> str:
        """Cache key of `sample`'s target latents."""
        return latent_key(sample, vae_fingerprint)

    def encode_target(self, sample):
        """`sample`'s target latents fp32 (the VAE is loaded), or None for the shared builder's own encoding."""
        return None

    def text_key(self, prompt: str, sample) -> str:
        """Cache key of `prompt` as the text encoder sees it beside `sample`'s conditions (`sample` is a
        data.Sample; a family without conditions ignores it)."""
        raise NotImplementedError

    def condition_jobs(self, sample) -> dict[str, Any]:
        """Cache key -> what `encode_conditions` needs, for each condition latent of `sample` ({}: none)."""
        return {}

    def entry_fields(self, sample) -> dict[str, Any]:
        """The condition fields of `sample`'s cache entry (`CachedSample.condition_keys`, `condition_sizes`,
        `condition_paths`); {} leaves them empty."""
        return {}

    def encode_conditions(self, jobs: dict[str, Any], write: Write) -> None:
        """Encode each job's condition latent (C, h_i, w_i) fp32 (the VAE is loaded) and `write` it as
        {"latents": ...}, alone (cache.py: a batch of one)."""
        if jobs:
            raise NotImplementedError

    def encode_prompts(self, jobs: dict[str, tuple[str, Any]], write: Write) -> None:
        """Encode each key's (prompt, sample whose conditions it sees) to an (L, D) embedding (the text
        encoder is loaded) and `write` it as {"embedding": ...}, alone."""
        raise NotImplementedError


@dataclass(frozen=True)
class DemoSpec:
    """What `demo.run_demo` trains on for a family: its built-in data and the names of its outputs."""

    run_name: str
    lora_name: str  # file name of the LoRA in the demo's folder
    preview_prompt: str
    plot_title: str
    # (folder) -> (training samples, the family's data settings) for the built-in dataset written into folder
    make_dataset: Callable[[Any], tuple[list, Any]]
    # The LoRA's layers and learning rate: "all" at 2e-3 for the tiny random models (anything that lowers the
    # loss will do); the pretrained shapes model keeps more of what it knew with the blocks' layers only.
    lora_targets: str = "all"
    learning_rate: float = 2e-3
    micro_batch_size: int = 2
    schedule: str = "cosine"  # down to a tenth over demo.SCHEDULE_STEPS, or "constant"


class ModelFamily:
    """The hooks (module docstring). Subclasses override what differs; defaults are the plain
    text-to-image behaviour (no conditions, the loss over every image token)."""

    name: str = ""  # what the CLI's --model and a model set's family are called ("qwen-image", "edit-2511")
    display_name: str = ""  # what messages call it ("Qwen-Image-Edit-2511")
    # The licence its published weights are under: a LoRA trained on them derives from them, so the run's status, the
    # LoRA file's metadata and the README's member table say it (Qwen-Image 1.x: Apache-2.0; 2.1: non-commercial).
    weights_licence: str = "Apache-2.0"
    dataset_kinds: tuple[str, ...] = (IMAGES,)  # the dataset conventions it trains on (`data.images.Sample.kind`)
    patch_size: int = 2  # latent cells per token side (Qwen-Image packs 2 x 2; Qwen-Image 2.1 takes 1)
    # Whether a preview samples with condition images (the Edit Preview node's control image sockets): Edit's
    # controls; Qwen-Image 2.1's references when its dataset has them (`takes_condition_images`).
    previews_take_condition_images: bool = False
    # Whether its VAE encodes alpha, so that a dataset may keep transparent images as they are (DatasetConfig's
    # transparency: "auto" keeps them for such a family); the others composite them onto the background colour.
    keeps_transparency: bool = False

    # ----------------------------------------------------------------------------------------------
    # data and cache

    def load_dataset(self, cfg, settings=None):
        """The `data.Dataset` a dataset folder holds under this family's convention (headless runs; the canvas
        has a Dataset node per convention). `settings`: the family's own data settings from the run file (Edit:
        an EditDataConfig), None: its defaults."""
        return load_dataset(cfg)

    def check_samples(self, samples: list) -> None:
        """Refuse samples of a dataset convention this family does not train on, naming the families that do."""
        other = next((s for s in samples if s.kind not in self.dataset_kinds), None)
        if other is not None:
            takers = [f.display_name for f in map(get_family, family_names()) if other.kind in f.dataset_kinds]
            raise UserInputError(f"the loaded model is {self.display_name}, but this dataset is {_a(other.kind)} "
                                 f"{other.kind} dataset: load a model that trains on {other.kind} datasets "
                                 f"({', '.join(takers) or 'none is registered'}).")

    def check_transparency(self, samples: list) -> None:
        """Refuse a dataset set to keep transparency (`transparency = "keep"`) that holds a transparent image (or
        control image) when this family's VAE encodes RGB only: the user asked for what the model cannot learn. Only a
        picture with a pixel that is not opaque is transparent: an RGBA file opaque everywhere (many exporters write
        one) is the same picture flattened, and trains as it is."""
        from ..data.decoding import has_transparent_pixels
        from ..data.images import read_file

        if self.keeps_transparency:
            return
        for s in samples:
            if s.transparency != "keep":
                continue
            kept = [(s.image_path, s.decode), *((c.path, c.decode) for c in
                                                 (s.controls if isinstance(s, EditSample) else ()))]
            found = next((path for path, decode in kept if decode.startswith("alpha")
                          and has_transparent_pixels(read_file(Path(path)), Path(path))), None)
            if found is not None:
                name = Path(found).name
                raise UserInputError(
                    f"image {name} is transparent and its dataset's transparency is 'keep', but {self.display_name}'s "
                    "VAE encodes RGB only, so the LoRA cannot learn transparency. Set transparency to 'auto' or "
                    "'flatten' (transparent pixels composited onto the background colour), or train Qwen-Image 2.1, "
                    "whose VAE encodes alpha.")

    def takes_condition_images(self, dataset) -> bool:
        """Whether a preview of a run on `dataset` (a cache.CachedDataset) samples with condition images."""
        return self.previews_take_condition_images

    def data_settings(self, dataset) -> Any:
        """The family's data settings of a loaded `data.Dataset` (for `cache.build_cache`), or None."""
        return None

    def cache_conditioning(self, components, samples: list, settings: Any) -> CacheConditioning:
        """The family's part of caching `samples` (training and validation) for `components`."""
        raise NotImplementedError

    def check_cached(self, dataset) -> None:
        """Refuse a cached dataset that another kind of family made (its prompts were encoded without, or
        with, the conditions this family trains on). Variants of one kind share their caches' meaning."""
        made_by = get_family(dataset.family)
        if type(made_by) is not type(self):
            raise UserInputError(
                f"the dataset was cached for the model family {made_by.name}, but the model trained is {self.name}: run "
                "the Cache node with the model set you train (only what is missing is encoded).")

    # ----------------------------------------------------------------------------------------------
    # training step (the trainer calls these; `dataset` is a cache.CachedDataset, samples its CachedSamples)

    def batch_group(self, sample) -> Hashable:
        """The data order's grouping key: samples of one micro-batch share it (their tensors are stacked)."""
        return sample.bucket

    def dropped_text_key(self, dataset, sample) -> str:
        """The prompt key a sample trains with when its caption is dropped (caption dropout)."""
        return dataset.prompt_keys[""]

    def conditions(self, dataset, samples: list) -> list[list] | None:
        """Per sample its condition latents [(C, h_i, w_i)] fp32, or None when the family has none."""
        return None

    def token_grid(self, latent_shape) -> tuple[int, ...]:
        """The token grid of latents of `latent_shape` (B, C, h, w): (h/p, w/p), p = `patch_size`. Only this
        family's own hooks (`transformer_inputs`, `loss_tokens`, `target_prediction`) read it."""
        h, w = latent_shape[-2:]
        return h // self.patch_size, w // self.patch_size

    def pack(self, latents):
        """Latents (B, C, h, w) -> the transformer's tokens (B, N, p*p*C): p x p patches (models.latents)."""
        return pack_latents(latents, self.patch_size)

    def resolution_mu(self, latent_shape, scheduler_config: dict) -> float:
        """The resolution shift's mu for latents of `latent_shape` (B, C, h, w), as the family's pipeline
        computes it for its schedule (text-to-image: `calculate_shift` of the image's tokens)."""
        grid = ModelFamily.token_grid(self, latent_shape)
        return resolution_mu(grid[0] * grid[1], scheduler_config)

    def extra_transformer_kwargs(self, batch: int, device) -> dict[str, Any]:
        """Keyword arguments the transformer takes beside the step's own, for a batch of `batch` ({}: none;
        Layered: its `additional_t_cond`)."""
        return {}

    def transformer_inputs(self, hidden, grid: tuple[int, int], conditions: list[list] | None):
        """(hidden (B, N, D_in) noisy target tokens, the target's token grid, `conditions`) ->
        (hidden_states (B, N + M, D_in), img_shapes) as the transformer takes them."""
        return hidden, [[(1, *grid)]] * hidden.shape[0]

    def loss_tokens(self, grid: tuple[int, int]) -> int:
        """How many leading output tokens the loss covers (the target's; conditions are inputs only)."""
        return grid[0] * grid[1]

    def transformer_kwargs(self, hidden, grid: tuple[int, ...], conditions: list[list] | None, text, text_mask,
                           text_keys: list[str] | None = None, dataset=None) -> dict[str, Any]:
        """The transformer's keyword arguments besides `timestep` and `return_dict`: `hidden` (B, N, D_in) noisy
        target tokens, `text` (B, L, D) padded prompt embeddings with `text_mask` (B, L) or None; `text_keys`
        and `dataset` say which cached prompts they are (a family that cached more per prompt reads it)."""
        hidden_states, img_shapes = self.transformer_inputs(hidden, grid, conditions)
        return dict(hidden_states=hidden_states, encoder_hidden_states=text, encoder_hidden_states_mask=text_mask,
                    img_shapes=img_shapes, **self.extra_transformer_kwargs(hidden.shape[0], hidden.device))

    def target_prediction(self, output, grid: tuple[int, int]):
        """The transformer's output tokens the loss covers: (B, N, D_out) of the target (default: the leading
        `loss_tokens`; a family whose output holds the whole joint sequence picks the target's)."""
        return output[:, : self.loss_tokens(grid)]

    # ----------------------------------------------------------------------------------------------
    # memory plan

    def planned_image_size(self, dataset) -> tuple[int, int]:
        """(width, height) px the memory plan plans the image sequence at: the largest bucket (a family whose
        conditions are image tokens too: `conditioned_image_size`)."""
        return max((s.bucket for s in dataset.samples), key=lambda b: b[0] * b[1])

    def planned_arch(self) -> QwenImageArch:
        """The real model's transformer, as the `plan` command plans it: Qwen-Image's 60-block MMDiT unless the family
        trains another (its numbers read off a model built on the meta device)."""
        return real_arch()

    def planned_parts(self, text_encoder_file: bool = True) -> PartSizes:
        """The real model's other parts as loaded, with their measured constants: Qwen2.5-VL (its language model) and
        Qwen-Image's VAE unless the family's are others. `text_encoder_file`: the encoder as ComfyUI's single file
        loads it, else as a diffusers folder does."""
        return real_parts()

    def planned_caption_parts(self) -> PartSizes:
        """The whole vision-language model the captioner builds from the real model's text encoder file (language
        model, vision tower, lm_head: the `plan --caption` phase, planner/captioning.py): Qwen2.5-VL-7B unless the
        family's encoder is another."""
        from ..planner.captioning import qwen25_vl_parts

        return qwen25_vl_parts()

    def planned_vision_sizes(self, dataset) -> tuple[tuple[int, int], ...]:
        """(W, H) px of the images the text encoder's vision tower sees with the planned sample's prompt: none, or
        the references' own sizes (Qwen-Image 2.1: the plan reads them from `condition_sizes`)."""
        return ()

    # ----------------------------------------------------------------------------------------------
    # previews (sampling.sample_image)

    def preview_inputs(self, components, dataset, prompts: list[str], condition_images: list | None
                       ) -> tuple[Any, dict[str, Any]]:
        """(the conditions a preview samples with, {prompt: (L, D) embedding} for each of `prompts`).
        `condition_images`: PIL images given now (the canvas), or None for the family's default. Text-to-image: no
        conditions, the cached embeddings; images given are refused."""
        if condition_images:
            raise UserInputError(f"control images were connected to Preview, but the model is {self.display_name}, "
                                 "a text-to-image model: disconnect them, or train a Qwen-Image-Edit model.")
        return None, {p: prompt_embedding(dataset, p) for p in dict.fromkeys(prompts)}

    def preview_pipeline(self, components, conditions: Any):
        """The pinned diffusers pipeline that samples a preview around our transformer and VAE, taking
        prompt embeddings (no text encoder) and `conditions` from `preview_inputs`. Text-to-image: diffusers'
        `QwenImagePipeline`."""
        return QwenImagePipeline(scheduler=FlowMatchEulerDiscreteScheduler.from_config(components.scheduler_config),
                                 vae=components.vae, text_encoder=None, tokenizer=None,
                                 transformer=components.transformer)

    def describe(self, components) -> str:
        """The loaded member for a run's status: its display name (2.1's Turbo says so, and how it previews)."""
        return self.display_name

    def preview_schedule(self, components, steps: int, cfg_scale: float) -> tuple[int, float, tuple[float, ...] | None]:
        """(steps, cfg_scale, sigmas) a preview samples with: the preview settings' own, the scheduler spacing the
        steps (sigmas None). A distilled model samples on its own fixed schedule (2.1's Turbo: turbo.py)."""
        return steps, cfg_scale, None

    def preview_image(self, pipe, conditions: Any, call: dict[str, Any]):
        """One PIL image from `pipe` (`preview_pipeline`'s) called with the shared sampler's arguments `call`
        (prompt embeddings and masks, true_cfg_scale, width, height, num_inference_steps, generator,
        output_type, callback_on_step_end). Layered: its own arguments, the layers laid out in one image."""
        return pipe(**call).images[0]

    # ----------------------------------------------------------------------------------------------
    # built-ins

    def tiny_components(self, seed: int = 0, storage: str = "float32", compute_dtype=None, device="cpu"):
        """The family's tiny model set with random weights (tests, the demo)."""
        raise NotImplementedError

    def demo(self) -> DemoSpec:
        """The built-in demo's data and names (`python -m trainer_core demo --model <name>`)."""
        raise NotImplementedError

    def export_tiny(self, folder, layout: str = "comfyui", seed: int = 0, name: str | None = None) -> dict:
        """The tiny model set (`tiny_components(seed)`) written as ComfyUI's single files, named as ComfyUI's own are,
        or a diffusers folder (`python -m trainer_core export-tiny --model <name>`): {what: path}. `name`: the name it
        was asked by (a registered alias names the files its own way)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<model family {self.name}>"


def _a(word: str) -> str:
    return "an" if word[:1] in "aeiou" else "a"


# -- the memory plan of a family whose condition images are image tokens beside the target's (Edit's controls, 2.1's
# references): they lengthen the image sequence as much as target tokens do.

def conditioned_image_size(dataset) -> tuple[int, int]:
    """(width, height) px to plan a cached dataset at: the largest sample's target with its condition images' pixels
    added as extra rows (a taller target of the same token count), rounded up to the 32 px bucket grid."""
    largest = largest_conditioned_sample(dataset)
    width = largest.bucket[0]
    return width, -(-_conditioned_area(largest) // (width * 32)) * 32


def largest_conditioned_sample(dataset):
    """The cached sample the plan plans: the most pixels, its target and condition images together."""
    return max(dataset.samples, key=_conditioned_area)


def _conditioned_area(s) -> int:
    return s.bucket[0] * s.bucket[1] + sum(w * h for w, h in s.condition_sizes)
