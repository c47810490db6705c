"""Decoding an image file's bytes: Pillow's formats opened safely (a decompression-bomb guard, raster formats only),
EXIF rotation, and every kind of pixel made 8-bit RGB (transparency composited onto a background) or RGBA
(transparency kept, for a VAE that encodes alpha); the `Sample.decode` tag that says how pixels depend on settings.
Errors name the file."""

from __future__ import annotations

import contextlib
import io
import re
import threading
from pathlib import Path

import numpy as np
from PIL import (
    BmpImagePlugin,
    GifImagePlugin,
    Image,
    ImageOps,
    JpegImagePlugin,
    PngImagePlugin,
    TiffImagePlugin,
    UnidentifiedImageError,
    WebPImagePlugin,
)

from ..core.errors import UserInputError

# Formats opened, whatever the extension says (Pillow opens by content): raster formats Pillow decodes
# itself. Never PostScript/PDF (Pillow would hand those to Ghostscript) or other exotic plugins.
IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "TIFF", "BMP")  # JPEG includes MPO (its factory opens both)
WHITE = (255, 255, 255)
ALPHA_MODES = ("RGBA", "LA", "PA", "RGBa", "La")
GREY_HIGH_MODES = ("I", "I;16", "I;16B", "I;16L", "I;16N", "F")  # more than 8 bits of grey
# Image.open(formats=...) needs these registered (Pillow loads only some plugins up front).
_PLUGINS = (BmpImagePlugin, GifImagePlugin, JpegImagePlugin, PngImagePlugin, TiffImagePlugin, WebPImagePlugin)


_pixel_limit_lock = threading.Lock()


@contextlib.contextmanager
def _no_pixel_limit():
    """Pillow's decompression-bomb limit is a module global: lift it only around one open, under a lock."""
    with _pixel_limit_lock:
        saved = Image.MAX_IMAGE_PIXELS
        Image.MAX_IMAGE_PIXELS = None
        try:
            yield
        finally:
            Image.MAX_IMAGE_PIXELS = saved


def _too_large(path: Path, size: tuple[int, int], limit: int) -> UserInputError:
    return UserInputError(
        f"image {path} is {size[0]}x{size[1]} ({size[0] * size[1]} pixels), larger than Pillow's safety limit of "
        f"{limit} pixels (a decompression bomb guard). Shrink the image, or turn on allow_large_images on the "
        "Dataset node if you trust it."
    )


def decode_image(data: bytes, path: Path, background: tuple[int, int, int] = WHITE,
                 allow_large_images: bool = False, keep_alpha: bool = False) -> tuple[Image.Image, str]:
    """Decode an image file's bytes to RGB (the first frame of an animation; EXIF rotation applied;
    transparency composited onto `background`, or kept as RGBA with `keep_alpha`; 16/32-bit and float grey
    scaled). Returns the image and its `Sample.decode` tag. Errors name the file."""
    limit = Image.MAX_IMAGE_PIXELS
    try:
        if allow_large_images:
            with _no_pixel_limit():
                img = Image.open(io.BytesIO(data), formats=IMAGE_FORMATS)
        else:
            try:
                img = Image.open(io.BytesIO(data), formats=IMAGE_FORMATS)
            except Image.DecompressionBombError:
                with _no_pixel_limit():  # only to read its size for the message
                    img = Image.open(io.BytesIO(data), formats=IMAGE_FORMATS)
                raise _too_large(path, img.size, limit) from None
            if limit and img.width * img.height > limit:  # Pillow only warns up to twice its limit
                raise _too_large(path, img.size, limit)
        with img:
            rawmode = _rawmode(img)
            img.load()
            img = ImageOps.exif_transpose(img)
            tag = decode_tag(img, background)
            if tag.startswith("alpha") and _fully_transparent(img):  # else one flat colour, trained without a word
                raise UserInputError(
                    f"image {path} is fully transparent: composited onto the background it is one flat colour, with "
                    "nothing to learn from. Re-export it with its visible pixels, or remove it from the folder.")
            if keep_alpha and has_transparency(img):
                return to_rgba(img, rawmode), tag
            return to_rgb(img, background, rawmode), tag
    except UserInputError:
        raise
    except UnidentifiedImageError:
        raise UserInputError(
            f"image {path} cannot be read (not a PNG, JPEG, WebP, GIF, TIFF or BMP image, or damaged). Re-export "
            "it or remove it from the folder."
        ) from None
    except Exception as e:  # a damaged or hostile file: Pillow's plugins raise many types
        raise UserInputError(
            f"image {path} cannot be read ({type(e).__name__}: {e}). Re-export it or remove it from the folder."
        ) from None


def _rawmode(img: Image.Image) -> str | None:
    """How the file stores its pixels (e.g. 'I;16B', 'I;32S'), before loading clears it."""
    try:
        args = img.tile[0][3]
    except (IndexError, TypeError, AttributeError):
        return None
    rawmode = args if isinstance(args, str) else (args[0] if args and isinstance(args[0], str) else None)
    return rawmode


def has_transparency(img: Image.Image) -> bool:
    return img.mode in ALPHA_MODES or "transparency" in img.info


def has_transparent_pixels(data: bytes, path: Path) -> bool:
    """Whether the image file's bytes hold a pixel that is not fully opaque. An RGBA (or palette, or colour-keyed)
    file whose every pixel is opaque has an alpha channel and no transparency: it decodes to the same RGB either way."""
    img, _tag = decode_image(data, path, keep_alpha=True, allow_large_images=True)
    return img.mode == "RGBA" and img.getchannel("A").getextrema()[0] < 255


def _fully_transparent(img: Image.Image) -> bool:
    if img.mode in GREY_HIGH_MODES:  # a colour key only
        return bool(np.all(np.asarray(img) == img.info.get("transparency")))
    alpha = img.getchannel("a") if img.mode == "La" else img.convert("RGBA").getchannel("A")
    return alpha.getextrema()[1] == 0


def decode_tag(img: Image.Image, background: tuple[int, int, int]) -> str:
    """How an image's pixels depend on decoding choices: '' for an opaque 8-bit image (decoded as always);
    the background for one with transparency; 'grey-scaled' for grey of more than 8 bits."""
    parts = ["alpha on #%02x%02x%02x" % tuple(background)] if has_transparency(img) else []
    if img.mode in GREY_HIGH_MODES:
        parts.append("grey-scaled")
    return "; ".join(parts)


def to_rgb(img: Image.Image, background: tuple[int, int, int] = WHITE, rawmode: str | None = None) -> Image.Image:
    """Any Pillow mode as 8-bit RGB: grey of more than 8 bits scaled by its full range (not clipped),
    transparency (alpha, palette or colour key) composited onto `background`."""
    if img.mode in GREY_HIGH_MODES:
        raw = np.asarray(img)
        grey = _grey_to_8bit(raw, img.mode, rawmode)
        rgb = np.repeat(grey[..., None], 3, axis=2)
        key = img.info.get("transparency")
        if isinstance(key, (int, float)) and not isinstance(key, bool):
            rgb[raw == key] = background
        return Image.fromarray(np.ascontiguousarray(rgb))
    if has_transparency(img):
        rgba = to_rgba(img)
        out = Image.new("RGB", img.size, tuple(background))
        out.paste(rgba.convert("RGB"), mask=rgba.getchannel("A"))
        return out
    return img.convert("RGB")


def to_rgba(img: Image.Image, rawmode: str | None = None) -> Image.Image:
    """Any Pillow mode as 8-bit RGBA, transparency kept (alpha, palette or colour key; premultiplied grey
    unmultiplied; grey of more than 8 bits scaled as `to_rgb` scales it): what an RGBA VAE encodes."""
    if img.mode in GREY_HIGH_MODES:
        raw = np.asarray(img)
        grey = _grey_to_8bit(raw, img.mode, rawmode)
        key = img.info.get("transparency")
        alpha = np.full(grey.shape, 255, np.uint8)
        if isinstance(key, (int, float)) and not isinstance(key, bool):
            alpha[raw == key] = 0
        return Image.fromarray(np.ascontiguousarray(np.stack([grey, grey, grey, alpha], axis=-1)), "RGBA")
    if img.mode == "La":  # premultiplied: Pillow converts it to nothing else
        arr = np.asarray(img).astype(np.float64)
        alpha = arr[..., 1]
        lum = np.where(alpha > 0, np.clip(np.round(arr[..., 0] * 255 / np.maximum(alpha, 1)), 0, 255), 0)
        img = Image.fromarray(np.stack([lum, alpha], axis=-1).astype(np.uint8), "LA")
    return img.convert("RGBA")  # (Pillow applies a palette's or a colour key's transparency here)


def _grey_to_8bit(raw: np.ndarray, mode: str, rawmode: str | None) -> np.ndarray:
    """Grey values scaled from their type's full range to 0..255: 16-bit by 65535, 32-bit integers by
    2**31 - 1 (signed) or 2**32 - 1 (unsigned), floats by 1.0 (0..1 is white)."""
    values = raw.astype(np.float64)
    if mode == "F":
        full = 1.0
        values = np.nan_to_num(values, nan=0.0, posinf=1.0, neginf=0.0)
    elif mode.startswith("I;16"):
        full = 65535.0
    else:  # "I": 32-bit signed storage of what the file held
        match = re.fullmatch(r"I;(\d+)(.*)", rawmode or "")
        bits, signed = (int(match[1]), "S" in match[2]) if match else (32, True)
        if bits == 32 and not signed:
            values = raw.astype(np.int32).view(np.uint32).astype(np.float64)
        full = float(2 ** (bits - 1) - 1 if signed else 2 ** bits - 1)
    return np.clip(np.round(values / full * 255.0), 0, 255).astype(np.uint8)
