"""Model families by name, and the one place a family's package is imported: on first use.

A name is what the CLI's `--model`, a run's records and a cache say. Listing the names costs nothing: this module
imports no family (and no torch). A family lives in one package (or module) of its own, which says at its top:

    FAMILIES   {name: ModelFamily}: its families, by the names it is registered with
    load       (request: loading.LoadRequest) -> a model set of one of its families, or None when the request names
               files or a folder that are not its own (see `families.loading`)
    missing_with_file  (optional; transformer path) -> what a request naming only that transformer file must add,
               when the file is its own and the text encoder and VAE files are not what it lacks; else None
    misplaced  (optional; request) -> a message when the request names one of its members where the node asking
               cannot train it (the member, and the node or setting that trains it), else None

and, where its text encoder file is a whole vision-language model it can generate words with (captioning,
trainer_core/captions):

    vision_language_model   (path, tokenizer_dir, compute_dtype, device, fp8, caption_image, caption_tokens)
               -> a models.vision_language.VisionLanguageModel, or None when the file is not its encoder (the
               captioner asks each package in turn)

It imports what it needs there (torch, diffusers): nothing imports it before a family of it is asked for.

The pack's own packages are listed below in the order loading asks them: the first whose `load` takes a request
wins, so the ones that recognise their own files come first, and the ones that take whatever is left (text-to-image
Qwen-Image for the Load node, Qwen-Image-Edit for the Load Edit node) last. A package defined elsewhere (a test's
family, a user's) registers itself with `register_family` and is asked before them.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module
from types import ModuleType

from ..core.errors import UserInputError


@dataclass(frozen=True)
class Registered:
    module: str  # ".qwen_image21": a module of this package; "my_pack.family": an absolute module name
    names: tuple[str, ...]  # the names of its families, in the order listings show them
    # Other names of its families: (alias, name). Qwen-Image-2512 is Qwen-Image's architecture and tensor names with
    # new weights: its files load as Qwen-Image, and export-tiny names the tiny model's files as ComfyUI names 2512's.
    aliases: tuple[tuple[str, str], ...] = ()


_REGISTERED: list[Registered] = [
    Registered(".qwen_image21", ("qwen-image-2.1",)),
    Registered(".qwen_image_layered", ("qwen-image-layered",)),
    # edit-auto: the Load Edit node's variant "auto"; from files it is the variant they are, without them Edit-2511.
    Registered(".qwen_image_edit", ("edit-2511", "edit-2509", "edit"), aliases=(("edit-auto", "edit-2511"),)),
    Registered(".qwen_image", ("qwen-image",), aliases=(("qwen-image-2512", "qwen-image"),)),
]
DEFAULT = "qwen-image"  # the family the CLI plans and demonstrates when none is named


def register_family(module: str, names: tuple[str, ...] | list[str]) -> None:
    """Register the family package `module` (an absolute module name) with the names of its families. It is asked
    before the pack's own packages when a model set is loaded. Registering the same package again does nothing."""
    entry = Registered(module, tuple(names))
    if entry in _REGISTERED:
        return
    taken = [n for n in entry.names if n in family_names(aliases=True)]
    if taken:
        raise ValueError(f"family names {taken} are registered already (by {[r.module for r in _REGISTERED if set(taken) & set(r.names)]})")
    _REGISTERED.insert(0, entry)


def unregister_family(module: str) -> None:
    """Forget the package `module` registered (tests register a family of their own and leave no trace)."""
    _REGISTERED[:] = [r for r in _REGISTERED if r.module != module]


def family_names(aliases: bool = False) -> tuple[str, ...]:
    """Every registered family's name in the order of `_REGISTERED`'s listing (and their aliases after, if asked)."""
    names = tuple(name for r in _REGISTERED for name in r.names)
    return names + tuple(alias for r in _REGISTERED for alias, _ in r.aliases) if aliases else names


def packages() -> list[ModuleType]:
    """The registered family packages, imported, in the order loading asks them."""
    return [_import(r) for r in list(_REGISTERED)]


def get_family(name: str):
    """The family `name` (a families.base.ModelFamily; an alias gives its family), its package imported now if it
    was not."""
    for r in _REGISTERED:
        name = dict(r.aliases).get(name, name)
        if name in r.names:
            family = _import(r).FAMILIES[name]
            if family.name != name:
                raise RuntimeError(f"{r.module}.FAMILIES[{name!r}] is named {family.name!r}")
            return family
    raise UserInputError(f"model family {name!r} is not one of {list(family_names())}.")


def family_for_dataset(kind: str):
    """The first registered family that trains on datasets of the convention `kind` alone (`data.images.Sample.kind`):
    the one whose `load_dataset` reads such a folder (the Layered Dataset node's, for "layered")."""
    for name in family_names():
        family = get_family(name)
        if tuple(family.dataset_kinds) == (kind,):
            return family
    raise UserInputError(f"no model family trains on {kind!r} datasets.")


def _import(r: Registered) -> ModuleType:
    if r.module.startswith("."):
        return import_module(r.module, __package__)
    return import_module(r.module)
