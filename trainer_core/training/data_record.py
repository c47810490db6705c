"""What a checkpoint records of the data it trained on, and the sentence a resume says when the data differs now.

A resumed run trains on the data as it is now (a re-captioned image trains with its new caption, a changed
`transparency` or background with its new pixels): that is right, and it is said once in the status, naming what
changed, so a person knows that the steps after the checkpoint learn from other data than the steps before it.

The record is the cache's own identity of each sample (data/cache.py's keys: the caption's prompt key, the picture's
latent key, which covers the file's pixels, its crop and bucket and how it was decoded, the control images' and the
mask's keys), by image file:

    {"samples": {image_path: [latent_key, text_key, "WxH", [condition keys], mask_key]}, "validation": [image_path]}

A checkpoint written before the record existed has none: nothing is said then.
"""

from __future__ import annotations

from pathlib import Path

# What each position of a sample's record is, as said in the note (the latent's: see `_changes`).
LATENT, TEXT, BUCKET, CONDITIONS, MASK = range(5)
SHOWN = 3  # file names named per kind of change


def data_record(dataset) -> dict:
    """The record of a cache.CachedDataset (module docstring)."""
    def row(s) -> list:
        return [s.latent_key, s.text_key, f"{s.bucket[0]}x{s.bucket[1]}", list(s.condition_keys), s.mask_key]

    samples = {s.image_path: row(s) for s in [*dataset.samples, *dataset.validation]}
    return {"samples": samples, "validation": sorted(s.image_path for s in dataset.validation)}


def _names(paths: list[str]) -> str:
    names = sorted(Path(p).name for p in paths)
    more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
    return ", ".join(names[:SHOWN]) + more


def _images(count: int) -> str:
    return f"{count} image{'s' if count != 1 else ''}"


def _changes(saved: dict, now: dict) -> list[str]:
    """The phrases of what differs between two records, in a fixed order."""
    before, after = saved.get("samples", {}), now["samples"]
    common = [p for p in after if p in before]
    kinds = {"caption": [], "size": [], "picture": [], "controls": [], "mask": []}
    for path in common:
        old, new = before[path], after[path]
        if old[TEXT] != new[TEXT]:
            kinds["caption"].append(path)
        if old[BUCKET] != new[BUCKET]:
            kinds["size"].append(path)
        elif old[LATENT] != new[LATENT]:
            kinds["picture"].append(path)
        if list(old[CONDITIONS]) != list(new[CONDITIONS]):
            kinds["controls"].append(path)
        if old[MASK] != new[MASK]:
            kinds["mask"].append(path)
    words = {
        "caption": "the caption of {n} changed ({names})",
        "size": "{n} train at another size or crop ({names}: resolution or bucket settings)",
        "picture": "the pixels of {n} changed ({names}: the file, or how it is decoded: transparency, background)",
        "controls": "the control images of {n} changed ({names})",
        "mask": "the loss mask of {n} changed ({names})",
    }
    phrases = [words[k].format(n=_images(len(v)), names=_names(v)) for k, v in kinds.items() if v]
    added = [p for p in after if p not in before]
    removed = [p for p in before if p not in after]
    if added:
        phrases.append(f"{_images(len(added))} added ({_names(added)})")
    if removed:
        phrases.append(f"{_images(len(removed))} no longer in the dataset ({_names(removed)})")
    if saved.get("validation", []) != now["validation"] and not (added or removed):
        phrases.append("other images are held out for validation")
    return phrases


def data_changed_note(saved: dict | None, now: dict, step: int) -> str | None:
    """The status sentence for a resume from the checkpoint of `step` whose record is `saved` (None: a checkpoint
    that has none) when the data now (`now`) differs; None when it does not (or cannot be told)."""
    if not saved:
        return None
    phrases = _changes(saved, now)
    if not phrases:
        return None
    return (f"the data differs from the checkpoint of step {step}'s: {'; '.join(phrases)}. Steps from {step + 1} on "
            "train on the data as it is now; to train the old data, restore it (or start a new run_name).")
