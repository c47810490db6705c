"""One .safetensors model file, read lazily: names, shapes and dtypes first, tensors one at a time.

A 20 GB transformer file is never read whole: `shapes` comes from the header alone, and `tensor(name)`
reads a single tensor. Errors for a missing or unreadable file are `UserInputError`s that name the file and
the part it was chosen for.

Tensors are read with plain file reads into memory we allocate (`read_into` can fill a tensor in place,
e.g. a view into the pinned swap arena), not through a memory map: pages of a mapped file count in the
process' resident memory while mapped, so a mapped 20 GB file would look (and, under a memory cap, act)
like a second copy of the model. Every byte of tensor data read is counted per file (`TENSOR_BYTES_READ`),
which is how tests show that a cached run reads no text-encoder weights.

A small JSON file beside the model file (`<stem>.json`, written by `export.py`) may carry the model's
config for the values tensor shapes cannot tell (a tiny test model's RoPE axes, a VAE's latent
statistics, a text encoder's head count); see `sidecar_config`.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from functools import cached_property
from pathlib import Path

import torch

from ..core.errors import UserInputError

# Bytes of tensor data read so far, by resolved file path (headers and identity samples not included).
TENSOR_BYTES_READ: Counter[str] = Counter()
# Largest single read: a tensor is read in pieces of at most this size, so reading never needs a second
# whole-tensor buffer.
READ_PIECE = 64 << 20


class SafetensorsFile:
    def __init__(self, path: str | Path, part: str):
        """Open `path` (chosen as the model's `part`, e.g. "transformer"); raise if it cannot be read."""
        from safetensors import SafetensorError, safe_open

        self.path = Path(path).expanduser()
        self.part = part
        if not self.path.is_file():
            where = "is a folder, not a file" if self.path.is_dir() else "does not exist"
            raise UserInputError(f"{part} file {self.path} {where}: choose an existing .safetensors file.")
        try:
            self._handle = safe_open(str(self.path), framework="pt")
        except (SafetensorError, OSError) as e:
            raise UserInputError(
                f"{part} file {self.path} is not a readable .safetensors file ({e}): it is cut short (an interrupted "
                "download or copy), damaged, or in another format (.ckpt and .gguf are not supported here). Download "
                "it again, or choose the model's .safetensors file."
            ) from e

    def __repr__(self) -> str:
        return f"SafetensorsFile({str(self.path)!r}, part={self.part!r})"

    @cached_property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Tensor name -> shape, from the header only (no tensor data is read)."""
        return {name: tuple(self._handle.get_slice(name).get_shape()) for name in self._handle.keys()}

    @property
    def keys(self) -> list[str]:
        return list(self.shapes)

    @cached_property
    def metadata(self) -> dict[str, str]:
        return self._handle.metadata() or {}

    @cached_property
    def _layout(self) -> tuple[int, dict]:
        """(byte offset of the data section, the header's entries): safetensors' layout is an 8-byte
        little-endian header length, the JSON header, then the data; offsets are relative to the data."""
        with open(self.path, "rb") as f:
            length = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(length))
        header.pop("__metadata__", None)
        return 8 + length, header

    def byte_range(self, name: str) -> tuple[int, int]:
        """(first byte, end) of tensor `name`'s data in the file."""
        start, header = self._layout
        begin, end = header[name]["data_offsets"]
        return start + begin, start + end

    def tensor(self, name: str) -> torch.Tensor:
        """Tensor `name`, read into fresh CPU memory (its own storage: nothing maps the file)."""
        out = torch.empty(self.shapes[name], dtype=self.dtype(name))
        self.read_into(name, out)
        return out

    def read_into(self, name: str, out: torch.Tensor) -> torch.Tensor:
        """Fill the contiguous CPU tensor `out` (the file's shape and dtype) with tensor `name`'s bytes."""
        if tuple(out.shape) != self.shapes[name] or out.dtype != self.dtype(name) or not out.is_contiguous():
            raise ValueError(f"read_into({name!r}): needs a contiguous {self.dtype(name)} tensor of shape "
                             f"{self.shapes[name]}, got {out.dtype} {tuple(out.shape)}")
        first, end = self.byte_range(name)
        if end == first:
            return out
        target = out.reshape(-1).view(torch.uint8).numpy()  # the tensor's own bytes, writable
        try:
            with open(self.path, "rb", buffering=0) as f:
                f.seek(first)
                done = 0
                while done < end - first:
                    n = f.readinto(memoryview(target[done:done + READ_PIECE]))
                    if not n:
                        raise EOFError(f"the file ends at byte {first + done}")
                    done += n
        except (OSError, EOFError) as e:
            raise UserInputError(
                f"{self.part} file {self.path}: tensor {name} cannot be read ({e}): the file was changed, moved or "
                "cut short while in use. Restore the file and run again.") from e
        TENSOR_BYTES_READ[str(self.path.resolve())] += end - first
        return out

    def dtype(self, name: str) -> torch.dtype:
        return _DTYPES[self._handle.get_slice(name).get_dtype()]

    def dtype_name(self, name: str) -> str:
        """Tensor `name`'s dtype as the header spells it ("I8", "F8_E4M3", "BF16", ...)."""
        return self._handle.get_slice(name).get_dtype()

    def require_floating(self, names: Iterable[str], int8_ok: Iterable[str] = ()) -> None:
        """Refuse the file when a weight among `names` (file keys) is not stored as floating-point numbers, except
        the int8 weights `int8_ok` (file keys of the layers ComfyUI's `comfy_quant` entries declare int8, whose
        scales and rotation are known: layouts.int8_weights).

        Other integer weights are a quantisation whose scales we cannot know (int8 from bitsandbytes, quanto,
        GGUF-style conversions each store them differently); reading their values as the weights would train
        on a silently wrong model. float8, 16, 32 and 64-bit floats are read."""
        int8_ok = set(int8_ok)
        bad = {n: self._handle.get_slice(n).get_dtype() for n in names}
        bad = {n: d for n, d in bad.items() if d not in FLOATING_DTYPE_NAMES and not (d == "I8" and n in int8_ok)}
        if bad:
            first = list(bad)[:3]
            raise UserInputError(
                f"{self.part} file {self.path} stores {len(bad)} weights as {sorted(set(bad.values()))} (first: {first}), "
                "not as floating-point numbers, and no ComfyUI int8 entry (comfy_quant) says how to read them: integer "
                "weights of another quantiser or bool weights cannot be read here. Choose the bf16, fp8 (float8_e4m3fn) "
                "or ComfyUI int8 ConvRot file of this model."
            )

    def sidecar_config(self) -> dict | None:
        """The `config` of `<stem>.json` beside the file when it exists and names this part, else None."""
        side = self.path.with_suffix(".json")
        if not side.is_file():
            return None
        try:
            data = json.loads(side.read_text())
        except (OSError, ValueError) as e:
            raise UserInputError(f"{side} (the config beside {self.path.name}) is not valid JSON: {e}. "
                                 "Fix or delete it.") from e
        if not isinstance(data, dict) or data.get("part") != self.part or not isinstance(data.get("config"), dict):
            raise UserInputError(
                f"{side} does not describe a {self.part} (expected {{\"part\": \"{self.part}\", \"config\": {{...}}}}, "
                f"found part {data.get('part') if isinstance(data, dict) else data!r}). Fix or delete it."
            )
        return data["config"]


# safetensors' names of the floating-point dtypes weights may be stored in.
FLOATING_DTYPE_NAMES = ("F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2")

# safetensors' dtype names (from the header) -> torch dtypes; only the ones model files use.
_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}


def holds_key(path, name: str, part: str = "transformer") -> bool:
    """Whether the safetensors file at `path` holds `name` under any prefix ComfyUI's files use: how a family tells
    its own files (its header only; False when there is no readable file: the part's own loader says what is wrong)."""
    if not path or not Path(path).is_file():
        return False
    try:
        keys = SafetensorsFile(path, part).keys
    except UserInputError:
        return False
    return any(k == name or k.endswith("." + name) for k in keys)
