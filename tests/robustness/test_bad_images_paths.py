"""Bad images and bad output paths (issue 11, "Images" and "Paths"): every Pillow mode arrives as the right
RGB, transparency lands on the Dataset node's background, oversized and unreadable images are refused with
the file's name and the fix; output names are portable (no NUL, no over-long names, no Windows reserved
names, no trailing dot or space), the LoRA filename template takes only {run_name} and {step}, run names are
unique regardless of case, and no write follows a link out of ComfyUI's output or loras folders.
README.md's troubleshooting section lists each message."""

from __future__ import annotations

import os
import shutil
import tempfile
import unicodedata
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import REPO, pack_module, tiny_dataset_config
from trainer_core.core.config import DatasetConfig, TrainConfig, check_run_name
from trainer_core.data.images import discover, load_cropped
from trainer_core.core.errors import UserInputError
from trainer_core.core.files import inside


def caption(folder: Path, stem: str, text: str = "a caption") -> None:
    (folder / f"{stem}.txt").write_text(text)


def decoded_rgb(folder: Path, name: str, **settings) -> tuple[int, int, int]:
    """The centre pixel of the only image in `folder`, as training sees it (0..255)."""
    cfg = tiny_dataset_config(folder, **settings)
    (sample,) = [s for s in discover(cfg) if Path(s.image_path).name == name]
    pixels = load_cropped(sample.image_path, sample.bucket, **_decode_args(cfg))
    centre = pixels[:, pixels.shape[1] // 2, pixels.shape[2] // 2]
    return tuple(int(round(float(v))) for v in (centre + 1) * 127.5)


def _decode_args(cfg: DatasetConfig) -> dict:
    from trainer_core.data.images import decode_options

    return decode_options(cfg)


# -- images: every mode to the right RGB ------------------------------------------------------------

def test_16bit_grey_png_is_scaled_not_clipped(tmp_path):
    """Why: 'a 16-bit grayscale PNG trains as pure white (a 50% grey pixel arrives as 255)'."""
    Image.fromarray(np.full((64, 64), 32768, np.uint16)).save(tmp_path / "grey16.png")
    assert Image.open(tmp_path / "grey16.png").mode == "I;16"
    caption(tmp_path, "grey16")
    assert decoded_rgb(tmp_path, "grey16.png") == (128, 128, 128)
    Image.fromarray(np.full((64, 64), 65535, np.uint16)).save(tmp_path / "grey16.png")
    assert decoded_rgb(tmp_path, "grey16.png") == (255, 255, 255)


def test_32bit_integer_and_float_grey_are_scaled(tmp_path):
    """32-bit integer grey (full scale 2**31 - 1) and float grey (0..1) are scaled, not clipped. A TIFF named
    .png is opened by its content, as Pillow does."""
    Image.fromarray(np.full((64, 64), 2**30, np.int32)).save(tmp_path / "int32.png", format="TIFF")
    assert Image.open(tmp_path / "int32.png").mode == "I"
    caption(tmp_path, "int32")
    assert decoded_rgb(tmp_path, "int32.png") == (128, 128, 128)
    (tmp_path / "int32.png").unlink()
    Image.fromarray(np.full((64, 64), 0.25, np.float32)).save(tmp_path / "float.png", format="TIFF")
    assert Image.open(tmp_path / "float.png").mode == "F"
    caption(tmp_path, "float")
    assert decoded_rgb(tmp_path, "float.png") == (64, 64, 64)


@pytest.mark.parametrize("background, expected", [("white", (255, 255, 255)), ("black", (0, 0, 0)),
                                                  ("#00ff00", (0, 255, 0))])
def test_transparency_is_composited_onto_the_chosen_background(tmp_path, background, expected):
    """Why: 'Alpha and palette transparency become black, silently'. Every kind of transparency (alpha
    channel, palette transparency, a transparent colour key) lands on the background; half-transparent red
    is blended with it."""
    clear = every_kind_of_transparency(tmp_path)
    visible_corner(Image.new("L", (64, 64), 7), 8).save(tmp_path / "greykey.png", transparency=7)
    clear.save(tmp_path / "clear.webp", lossless=True)
    for stem in ("rgba", "la", "palette", "keyed", "greykey", "clear", "half"):
        caption(tmp_path, stem)
    for name in ("rgba.png", "la.png", "palette.png", "keyed.png", "greykey.png", "clear.webp"):
        assert decoded_rgb(tmp_path, name, background=background) == expected, name
    red = decoded_rgb(tmp_path, "half.png", background=background)  # 128/255 red over the background
    want = (round(255 * 128 / 255 + expected[0] * 127 / 255), round(expected[1] * 127 / 255),
            round(expected[2] * 127 / 255))
    assert max(abs(a - b) for a, b in zip(red, want)) <= 1, (red, want)


def every_kind_of_transparency(folder: Path) -> Image.Image:
    """rgba.png, la.png, palette.png, keyed.png: transparent but for one visible corner pixel each (a fully transparent
    image is refused: test_silent_cases.py), in an alpha channel, grey with alpha, a palette's transparency and a
    colour key; half.png: red at alpha 128. Returns the RGBA picture."""
    clear = visible_corner(Image.new("RGBA", (64, 64), (0, 0, 0, 0)), (0, 0, 0, 255))
    clear.save(folder / "rgba.png")
    clear.convert("LA").save(folder / "la.png")
    visible_corner(Image.new("P", (64, 64), 0), 1).save(folder / "palette.png", transparency=0)
    visible_corner(Image.new("RGB", (64, 64), (10, 20, 30)), (1, 2, 3)).save(folder / "keyed.png",
                                                                            transparency=(10, 20, 30))
    Image.new("RGBA", (64, 64), (255, 0, 0, 128)).save(folder / "half.png")
    return clear


def visible_corner(image: Image.Image, value) -> Image.Image:
    image.putpixel((0, 0), value)
    return image


def test_background_is_a_dataset_setting_said_in_the_summary(pack, tmp_path):
    visible_corner(Image.new("RGBA", (64, 64), (0, 0, 0, 0)), (0, 0, 0, 255)).save(tmp_path / "clear.png")
    caption(tmp_path, "clear")
    Image.new("RGB", (64, 64), "red").save(tmp_path / "opaque.png")
    caption(tmp_path, "opaque")
    assert DatasetConfig().background == "white"
    node = pack.NODE_CLASS_MAPPINGS["QwenLoRADataset"]
    assert {"background", "allow_large_images"} <= set(node.INPUT_TYPES()["required"])
    settings = dict(folder=str(tmp_path), resolution=64, enable_buckets=True, min_bucket_side=32,
                    max_bucket_side=128, repeats=1, caption_extension=".txt", missing_caption="error",
                    upscale_small_images=False, allow_large_images=False)
    _, summary = node().discover(background="white", **settings)
    assert "1 with transparency kept by Qwen-Image 2.1, composited onto white for the other models" in summary
    _, summary = node().discover(background="#102030", transparency="flatten", **settings)
    assert summary.endswith("1 with transparency composited onto #102030")
    with pytest.raises(pack_module(pack, "trainer_core.core.errors").UserInputError,
                       match=r"background='nope' is not a colour.*white.*#RRGGBB"):
        node().discover(background="nope", **settings)


def test_a_changed_background_is_encoded_again(tmp_path):
    """The latent cache key of an image with transparency depends on the background (else a cache built
    with another background would be reused silently); an opaque image's key does not."""
    from trainer_core.data.cache import latent_key

    visible_corner(Image.new("RGBA", (64, 64), (0, 0, 0, 0)), (0, 0, 0, 255)).save(tmp_path / "clear.png")
    Image.new("RGB", (64, 64), "red").save(tmp_path / "opaque.png")
    caption(tmp_path, "clear")
    caption(tmp_path, "opaque")
    white = {Path(s.image_path).name: latent_key(s, "vae") for s in discover(tiny_dataset_config(tmp_path))}
    black = {Path(s.image_path).name: latent_key(s, "vae")
             for s in discover(tiny_dataset_config(tmp_path, background="black"))}
    assert white["clear.png"] != black["clear.png"] and white["opaque.png"] == black["opaque.png"]


@pytest.mark.parametrize("mode", ["1", "L", "P", "RGB", "CMYK", "YCbCr", "LA", "La", "PA", "RGBA", "RGBa", "I",
                                  "I;16", "I;16B", "I;16L", "F", "HSV", "LAB"])
def test_every_pillow_mode_decodes_to_rgb(mode):
    """In-memory images of each mode (some cannot be saved as png/jpg/webp) showing grey 200 decode to grey 200
    within 1 (mode '1': white; palette modes: their palette's nearest colour)."""
    from trainer_core.data.images import to_rgb

    expected = (200, 200, 200)
    if mode in ("I;16", "I;16B", "I;16L"):
        dtype = {"I;16": "=u2", "I;16B": ">u2", "I;16L": "<u2"}[mode]
        img = Image.frombytes(mode, (8, 8), np.full((8, 8), 200 * 257, dtype).tobytes())
    elif mode == "I":  # a 32-bit integer image: full scale 2**31 - 1
        img = Image.fromarray(np.full((8, 8), round(200 / 255 * (2**31 - 1)), np.int32))
    elif mode == "F":  # float: 0..1
        img = Image.fromarray(np.full((8, 8), 200 / 255, np.float32))
    elif mode == "La":
        img = Image.new("LA", (8, 8), (200, 255)).convert("La")
    elif mode == "RGBa":
        img = Image.new("RGBA", (8, 8), (200, 200, 200, 255)).convert("RGBa")
    elif mode == "PA":
        img = Image.new("RGBA", (8, 8), (200, 200, 200, 255)).convert("PA")
        expected = img.convert("RGB").getpixel((4, 4))
    else:
        img = Image.new("L", (8, 8), 200).convert("RGB").convert(mode)
        if mode in ("1", "P"):
            expected = img.convert("RGB").getpixel((4, 4))
    assert img.mode == mode
    rgb = to_rgb(img, (255, 255, 255))
    assert rgb.mode == "RGB" and rgb.size == (8, 8)
    assert max(abs(a - b) for a, b in zip(rgb.getpixel((4, 4)), expected)) <= 1, (mode, rgb.getpixel((4, 4)))


def test_half_transparent_premultiplied_grey_is_unpremultiplied():
    from trainer_core.data.images import to_rgb

    img = Image.new("LA", (8, 8), (200, 128)).convert("La")  # stored as (100, 128)
    got = to_rgb(img, (0, 0, 0)).getpixel((4, 4))
    assert abs(got[0] - round(200 * 128 / 255)) <= 2, got


def test_animated_images_train_their_first_frame(tmp_path):
    frames = [Image.new("RGB", (64, 64), c) for c in ((200, 0, 0), (0, 0, 200))]
    frames[0].save(tmp_path / "anim.gif", save_all=True, append_images=frames[1:])
    frames[0].save(tmp_path / "anim.webp", save_all=True, append_images=frames[1:], lossless=True)
    caption(tmp_path, "anim")
    cfg = tiny_dataset_config(tmp_path)
    for ext in (".webp",):  # .gif is not a dataset extension; the webp one is
        assert decoded_rgb(tmp_path, f"anim{ext}")[0] > 150
    assert {Path(s.image_path).suffix for s in discover(cfg)} == {".webp"}


def test_exif_rotation_is_applied(tmp_path):
    """Decision: EXIF orientation is applied (as cameras and viewers show the photo)."""
    img = Image.new("RGB", (128, 64), "red")
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to view
    img.save(tmp_path / "photo.jpg", exif=exif)
    caption(tmp_path, "photo")
    (sample,) = discover(tiny_dataset_config(tmp_path))
    assert (sample.width, sample.height) == (64, 128)


def test_zero_byte_and_non_image_files_name_the_file(tmp_path):
    (tmp_path / "empty.png").write_bytes(b"")
    caption(tmp_path, "empty")
    with pytest.raises(UserInputError, match=r"image .*empty.png cannot be read .*Re-export it or remove it"):
        discover(tiny_dataset_config(tmp_path))


def test_only_raster_formats_are_opened(tmp_path):
    """A file whose content is PostScript (Pillow would hand it to Ghostscript) is refused by its content."""
    (tmp_path / "script.png").write_bytes(b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 64 64\nshowpage\n")
    caption(tmp_path, "script")
    with pytest.raises(UserInputError, match=r"image .*script.png cannot be read"):
        discover(tiny_dataset_config(tmp_path))


# -- images: oversized and unreadable -------------------------------------------------------------

@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")
def test_decompression_bomb_names_the_file_and_the_option(tmp_path, monkeypatch):
    """Why: 'an image over Pillow's decompression-bomb limit gives a raw error without the file's name'.
    Pillow's limit is lowered to 64x64 pixels (its own setting), so a 96x96 image is over it (Pillow raises
    beyond twice the limit and only warns between)."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 64 * 64)
    for size in ((96, 96), (64, 72)):  # over twice the limit (Pillow raises), and just over it (Pillow warns)
        for p in tmp_path.iterdir():
            p.unlink()
        Image.new("RGB", size, "red").save(tmp_path / "huge.png")
        caption(tmp_path, "huge")
        with pytest.raises(UserInputError, match=rf"image .*huge.png is {size[0]}x{size[1]} .*larger than .*"
                                                 r"4096 pixels.*allow_large_images"):
            discover(tiny_dataset_config(tmp_path))
        cfg = tiny_dataset_config(tmp_path, allow_large_images=True)
        (sample,) = discover(cfg)
        assert load_cropped(sample.image_path, sample.bucket, **_decode_args(cfg)).shape[0] == 3
        assert Image.MAX_IMAGE_PIXELS == 64 * 64  # restored


def test_a_folder_named_like_an_image_is_named(tmp_path):
    Image.new("RGB", (64, 64), "red").save(tmp_path / "good.png")
    caption(tmp_path, "good")
    (tmp_path / "folder.png").mkdir()
    with pytest.raises(UserInputError, match=r"image .*folder.png is a folder, not an image file.*rename it"):
        discover(tiny_dataset_config(tmp_path))


def test_a_broken_link_is_named(tmp_path):
    Image.new("RGB", (64, 64), "red").save(tmp_path / "good.png")
    caption(tmp_path, "good")
    (tmp_path / "gone.png").symlink_to(tmp_path / "moved_away.png")
    with pytest.raises(UserInputError, match=r"image .*gone.png is a link to .*moved_away.png, which does not exist"
                                             r".*Fix the link or remove it"):
        discover(tiny_dataset_config(tmp_path))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="POSIX only")
def test_a_pipe_named_like_an_image_does_not_hang(tmp_path):
    Image.new("RGB", (64, 64), "red").save(tmp_path / "good.png")
    caption(tmp_path, "good")
    os.mkfifo(tmp_path / "pipe.png")
    with pytest.raises(UserInputError, match=r"image .*pipe.png is not a regular file"):
        discover(tiny_dataset_config(tmp_path))


def test_a_caption_that_is_a_folder_or_a_broken_link_is_named(tmp_path):
    """(Before: 'has no caption file', which sends the user looking for a file that is there.)"""
    Image.new("RGB", (64, 64), "red").save(tmp_path / "a.png")
    (tmp_path / "a.txt").mkdir()
    with pytest.raises(UserInputError, match=r"caption .*a.txt is a folder, not a text file"):
        discover(tiny_dataset_config(tmp_path))
    (tmp_path / "a.txt").rmdir()
    (tmp_path / "a.txt").symlink_to(tmp_path / "gone.txt")
    with pytest.raises(UserInputError, match=r"caption .*a.txt is a link to .*gone.txt, which does not exist"):
        discover(tiny_dataset_config(tmp_path))


def test_macos_resource_fork_companions_are_skipped(tmp_path):
    """Decision: hidden files (macOS leaves '._name.png' beside each image on non-Apple disks) are no images."""
    Image.new("RGB", (64, 64), "red").save(tmp_path / "a.png")
    caption(tmp_path, "a")
    (tmp_path / "._a.png").write_bytes(b"\x00\x05\x16\x07 Mac OS X attributes")
    assert [Path(s.image_path).name for s in discover(tiny_dataset_config(tmp_path))] == ["a.png"]


def run_as_unprivileged(folder: Path) -> str:
    """Discover `folder` as a user that permission bits stop: this user when not root; as root (which
    permission bits do not stop), in a forked child that drops to `nobody` first (setgroups/setgid/setuid:
    the venv's interpreter lives under /root, which `nobody` may not run). Returns "USER: <message>",
    "RAW: <type>: <message>" or "no error"."""
    def attempt() -> str:
        try:
            discover(tiny_dataset_config(folder))
        except UserInputError as e:
            return f"USER: {e}"
        except BaseException as e:  # noqa: BLE001 - reported to the test
            return f"RAW: {type(e).__name__}: {e}"
        return "no error"

    if os.geteuid() != 0:
        return attempt()
    import pwd

    nobody = pwd.getpwnam("nobody")
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop root for good, try, report, leave without pytest's clean-up
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
            os.write(write_end, attempt().encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        out = f.read().decode()
    os.waitpid(pid, 0)
    return out


@pytest.fixture
def shared_dir():
    """A folder other users can enter (pytest's tmp_path is private to its user)."""
    folder = Path(tempfile.mkdtemp(prefix="qwen_lora_perm_"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.skipif(os.name != "posix", reason="POSIX permission bits")
def test_an_unreadable_image_gives_its_path_and_the_fix(shared_dir):
    """Why: 'Unreadable files give a raw PermissionError without a fix'. Run as `nobody` when the suite runs
    as root (root reads any file)."""
    if os.geteuid() == 0:
        import pwd

        try:
            pwd.getpwnam("nobody")
        except KeyError:
            pytest.skip("no 'nobody' user to drop to")
    for name in ("good", "secret"):
        Image.new("RGB", (64, 64), "red").save(shared_dir / f"{name}.png")
        caption(shared_dir, name)
        (shared_dir / f"{name}.png").chmod(0o644)
        (shared_dir / f"{name}.txt").chmod(0o644)
    (shared_dir / "secret.png").chmod(0o000)
    out = run_as_unprivileged(shared_dir)
    assert "USER:" in out and "secret.png cannot be read: permission denied" in out, out
    assert "chmod a+r" in out
    (shared_dir / "secret.png").chmod(0o644)
    (shared_dir / "secret.txt").chmod(0o000)
    out = run_as_unprivileged(shared_dir)
    assert "USER:" in out and "secret.txt cannot be read: permission denied" in out, out
    (shared_dir / "secret.txt").chmod(0o644)
    shared_dir.chmod(0o311)  # enterable, not listable
    out = run_as_unprivileged(shared_dir)
    shared_dir.chmod(0o755)
    assert "USER:" in out and "cannot be listed: permission denied" in out, out


def test_captions_in_utf16_with_a_bom_are_read(tmp_path):
    """Decision: a caption with a UTF-16 or UTF-32 byte order mark (Windows Notepad's 'Unicode') is read;
    without a mark, captions are UTF-8 (with or without its BOM)."""
    Image.new("RGB", (64, 64), "red").save(tmp_path / "a.png")
    (tmp_path / "a.txt").write_bytes("café au lait".encode("utf-16"))
    assert discover(tiny_dataset_config(tmp_path))[0].caption == "café au lait"
    (tmp_path / "a.txt").write_bytes(b"\xef\xbb\xbf" + "crème".encode())
    assert discover(tiny_dataset_config(tmp_path))[0].caption == "crème"


def test_a_dataset_folder_with_a_nul_byte_is_named(tmp_path):
    with pytest.raises(UserInputError, match="dataset folder .* does not exist"):
        discover(tiny_dataset_config(str(tmp_path) + "\x00x"))


# -- paths: the LoRA filename template ------------------------------------------------------------

@pytest.fixture
def lora_output_path(pack):
    return pack_module(pack, "nodes.output_nodes").lora_output_path


@pytest.mark.parametrize("template", ["{0}", "{epoch}", "{run_name.__class__.__mro__}", "{run_name[0]}",
                                      "{step!r}", "{step:>10}", "{}", "lora_{", "lora}", "{run_name"])
def test_filename_template_takes_only_run_name_and_step(pack, lora_output_path, tmp_path, template):
    """Why: '{0}, {epoch} give raw errors; {run_name.__class__.__mro__} is evaluated'."""
    with pytest.raises(pack_module(pack, "trainer_core.core.errors").UserInputError,
                       match=r"filename=.* Use only \{run_name\} and \{step\}"):
        lora_output_path(tmp_path, template, "myrun", 12)
    assert list(tmp_path.iterdir()) == []


def test_filename_template_fills_in_its_placeholders(lora_output_path, tmp_path):
    assert lora_output_path(tmp_path, "qwen/{run_name}_{step}", "myrun", 12) == \
        tmp_path.resolve() / "qwen" / "myrun_000012.safetensors"
    assert lora_output_path(tmp_path, "{{literal}}_{step}", "r", 3).name == "{literal}_000003.safetensors"


# -- paths: portable names on every OS ------------------------------------------------------------

RESERVED = ["CON", "con", "PRN", "aux", "NUL", "nul.txt", "COM1", "com9", "LPT1", "Lpt9.tar.gz", "CON .x"]
BAD_COMPONENTS = {
    "nul byte": "a\x00b", "control character": "a\x1fb", "trailing dot": "name.", "trailing space": "name .x ",
    "over 255 bytes": "é" * 128, "windows character": "a:b", "windows character 2": "what?",
}


@pytest.mark.parametrize("name", RESERVED)
def test_windows_reserved_run_names_are_refused(name):
    with pytest.raises(UserInputError, match="run_name=.* reserved .*Windows"):
        TrainConfig(run_name=name).validate()


@pytest.mark.parametrize("name", ["name.", "name ", "a\x00b", "x" * 101, "."])
def test_run_names_with_trailing_dot_space_nul_or_too_long_are_refused(name):
    with pytest.raises(UserInputError, match="run_name=.* is not a usable name"):
        check_run_name(name)


@pytest.mark.parametrize("name", RESERVED + list(BAD_COMPONENTS.values()))
@pytest.mark.parametrize("where", ["{}", "sub/{}", "{}/file"])
def test_bad_lora_filenames_are_refused_in_every_component(pack, lora_output_path, tmp_path, name, where):
    """Why: 'NUL bytes and over-long names give raw errors; Windows reserved names (CON, NUL, COM1, trailing dot or
    space) are accepted'. Each component of the filename is checked, on every OS, the file's own name before
    '.safetensors' too ('name.' would write 'name..safetensors': issue 25), and a trailing space of the whole filename
    is refused too, not stripped (issue 45: 'name ' wrote name.safetensors)."""
    with pytest.raises(pack_module(pack, "trainer_core.core.errors").UserInputError, match=r"filename[= ]"):
        lora_output_path(tmp_path, where.format(name), "myrun", 1)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", RESERVED + list(BAD_COMPONENTS.values()))
def test_bad_cache_folder_names_are_refused(name, tmp_path):
    with pytest.raises(UserInputError, match=r"cache_folder[= ]"):
        inside(tmp_path, f"caches/{name}/x", "cache_folder", "qwen_lora_training/cache")
    assert list(tmp_path.iterdir()) == []


def test_a_whole_path_that_is_too_long_is_refused(lora_output_path, pack, tmp_path):
    deep = "/".join(["d" * 200] * 25)  # each part fine, 5000 bytes in all
    with pytest.raises(pack_module(pack, "trainer_core.core.errors").UserInputError,
                       match=r"filename=.* is too long: the path .* bytes"):
        lora_output_path(tmp_path, deep, "r", 1)


@pytest.mark.parametrize("template", ["a:b", "C:/loras/x", "C:x"])
def test_a_colon_or_drive_letter_is_refused_as_windows_would(pack, lora_output_path, tmp_path, template):
    with pytest.raises(pack_module(pack, "trainer_core.core.errors").UserInputError, match=r"contains ':', which Windows"):
        lora_output_path(tmp_path, template, "r", 1)


def test_backslash_is_a_folder_separator_on_every_os(lora_output_path, tmp_path):
    """Decision: a workflow written on Windows ('qwen\\lora') saves into the subfolder 'qwen' everywhere,
    instead of a file named 'qwen\\lora' on Linux."""
    assert lora_output_path(tmp_path, "qwen\\{run_name}", "r", 1) == tmp_path.resolve() / "qwen" / "r.safetensors"


def test_unicode_names_are_normalised(lora_output_path, tmp_path):
    """Decision: names are NFC-normalised, so the same name typed on macOS (NFD) and Linux is one file."""
    nfd = unicodedata.normalize("NFD", "café")
    assert lora_output_path(tmp_path, nfd, "r", 1).name == unicodedata.normalize("NFC", "café") + ".safetensors"


@pytest.mark.parametrize("template", ["", "   ", "sub/", "."])
def test_a_filename_without_a_name_is_refused(pack, lora_output_path, tmp_path, template):
    with pytest.raises(pack_module(pack, "trainer_core.core.errors").UserInputError, match="filename=.*"):
        lora_output_path(tmp_path, template, "r", 1)


# -- paths: run folders -----------------------------------------------------------------------------

@pytest.fixture
def output_dir(tmp_path, monkeypatch):
    folder = tmp_path / "output"
    monkeypatch.setenv("QWEN_LORA_OUTPUT", str(folder))
    return folder


def test_run_names_are_unique_regardless_of_case(pack, output_dir):
    """Why: 'run names differing only by case are accepted, so a workflow breaks when moved to Windows or a
    case-insensitive disk'."""
    run_directory = pack_module(pack, "nodes.train_nodes").run_directory
    existing = output_dir / "qwen_lora_training" / "runs" / "MyRun"
    existing.mkdir(parents=True)
    assert run_directory("MyRun") == existing.resolve()
    with pytest.raises(pack_module(pack, "trainer_core.core.errors").UserInputError,
                       match=r"run_name='myrun' differs only by case from the run folder .*MyRun.*run_name='MyRun'"):
        run_directory("myrun")


def test_a_run_folder_that_links_outside_the_output_folder_is_refused(pack, output_dir, tmp_path):
    """Why: 'A run folder that is a symlink to a place outside the output folder is followed'."""
    run_directory = pack_module(pack, "nodes.train_nodes").run_directory
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    runs = output_dir / "qwen_lora_training" / "runs"
    runs.mkdir(parents=True)
    (runs / "linked").symlink_to(elsewhere)
    with pytest.raises(pack_module(pack, "trainer_core.core.errors").UserInputError,
                       match=r"run_name 'linked' leads outside .*output through the link .*linked -> .*elsewhere"):
        run_directory("linked")
    (runs / "inner").mkdir()
    (runs / "inner" / "checkpoints").symlink_to(elsewhere)
    with pytest.raises(pack_module(pack, "trainer_core.core.errors").UserInputError, match="through the link"):
        run_directory("inner")
    assert list(elsewhere.iterdir()) == []


def test_a_lora_subfolder_that_links_outside_the_loras_folder_is_refused(pack, lora_output_path, tmp_path):
    loras, elsewhere = tmp_path / "loras", tmp_path / "elsewhere"
    loras.mkdir()
    elsewhere.mkdir()
    (loras / "sub").symlink_to(elsewhere)
    with pytest.raises(pack_module(pack, "trainer_core.core.errors").UserInputError,
                       match=r"filename 'sub/x.safetensors' leads outside .*loras through the link "
                             r".*sub -> .*elsewhere"):
        lora_output_path(loras, "sub/x", "r", 1)


def test_the_catalogue_rows_are_in_the_troubleshooting_page():
    section = (REPO / "docs" / "troubleshooting.md").read_text()
    for topic in ("16-bit", "transparen", "allow_large_images", "permission denied", "is a folder, not an image",
                  "is a link to", "Use only {run_name} and {step}", "reserved", "differs only by case",
                  "through the link", "is too long"):
        assert topic in section, topic


def test_kept_transparency_decodes_every_kind_to_rgba_as_it_is(tmp_path):
    """transparency kept (Qwen-Image 2.1's RGBA VAE): every kind of transparency (alpha channel, grey with alpha,
    palette transparency, a colour key) decodes to RGBA with its colours as they are, not blended with a background;
    an opaque image stays RGB (2.1's pipeline makes it opaque RGBA)."""
    from trainer_core.data.images import cropped_image

    every_kind_of_transparency(tmp_path)
    Image.new("RGB", (64, 64), "red").save(tmp_path / "opaque.png")
    for name in ("rgba.png", "la.png", "palette.png", "keyed.png"):
        image = cropped_image(tmp_path / name, (64, 64), background=(0, 255, 0), keep_alpha=True)
        alpha = np.asarray(image.getchannel("A"))
        assert image.mode == "RGBA" and alpha[0, 0] == 255 and (alpha.ravel()[1:] == 0).all(), name
    half = cropped_image(tmp_path / "half.png", (64, 64), background=(0, 255, 0), keep_alpha=True)
    assert half.getpixel((5, 5)) == (255, 0, 0, 128)  # the colour as it is: no background blended in
    assert cropped_image(tmp_path / "opaque.png", (64, 64), keep_alpha=True).mode == "RGB"
    # resized as premultiplied colour: a transparent pixel's black does not darken its opaque neighbour
    edge = Image.new("RGBA", (128, 128), (0, 0, 0, 0))
    edge.paste((255, 255, 255, 255), (0, 0, 64, 128))
    edge.save(tmp_path / "edge.png")
    small = np.asarray(cropped_image(tmp_path / "edge.png", (64, 64), keep_alpha=True))  # (H, W, 4)
    visible = small[..., 3] > 0
    assert (small[visible][:, :3] >= 254).all()


def test_keep_transparency_is_refused_by_models_whose_vae_is_rgb_and_auto_flattens_for_them(tiny, tmp_path):
    """Qwen-Image's VAE encodes RGB: "keep" with a transparent image is refused by name at caching (nothing encoded);
    "auto" caches what "flatten" caches (the composite on the background, under the same key)."""
    from trainer_core.data.cache import build_cache

    visible_corner(Image.new("RGBA", (64, 64), (0, 0, 0, 0)), (0, 0, 0, 255)).save(tmp_path / "clear.png")
    caption(tmp_path, "clear")
    kept = discover(tiny_dataset_config(tmp_path, transparency="keep"))
    with pytest.raises(UserInputError, match=r"image clear.png is transparent and its dataset's transparency is "
                                             r"'keep', but Qwen-Image's VAE encodes RGB only.*'flatten'"):
        build_cache(tiny, kept, tmp_path / "cache")
    assert not (tmp_path / "cache" / "latents").exists() or not any((tmp_path / "cache" / "latents").iterdir())
    auto = build_cache(tiny, discover(tiny_dataset_config(tmp_path)), tmp_path / "cache")
    flat = build_cache(tiny, discover(tiny_dataset_config(tmp_path, transparency="flatten")), tmp_path / "cache")
    assert auto.samples[0].latent_key == flat.samples[0].latent_key
