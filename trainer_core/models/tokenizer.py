"""The Qwen2.5 tokenizer for a single-file text encoder (single files carry none).

The caller names a tokenizer folder: tokenizer_config.json with tokenizer.json (what transformers 5's
`save_pretrained` writes) or vocab.json + merges.txt (what ComfyUI ships in
comfy/text_encoders/qwen25_tokenizer/).
Without one, a `tokenizer/` folder beside the text encoder file or beside its folder is used (where
`python -m trainer_core export-tiny` puts the tiny model's).
"""

from __future__ import annotations

from pathlib import Path

from ..core.errors import UserInputError

# The chat template's markers: a folder without them is not a Qwen2.5 tokenizer.
REQUIRED_TOKENS = ("<|im_start|>", "<|im_end|>")


def tokenizer_candidates(tokenizer_dir: str | Path | None, text_encoder_file: str | Path) -> list[Path]:
    if tokenizer_dir is not None and str(tokenizer_dir).strip():
        return [Path(tokenizer_dir).expanduser()]
    here = Path(text_encoder_file).expanduser().parent
    return [here / "tokenizer", here.parent / "tokenizer"]


def load_tokenizer(tokenizer_dir: str | Path | None, text_encoder_file: str | Path, vocab_rows: int):
    """`Qwen2Tokenizer` from the first candidate folder that exists; checked against the encoder's
    embedding table (`vocab_rows` rows): every token id must have a row."""
    from transformers import Qwen2Tokenizer

    candidates = tokenizer_candidates(tokenizer_dir, text_encoder_file)
    folder = next((c for c in candidates if c.is_dir()), None)
    if folder is None:
        raise UserInputError(
            f"no tokenizer folder: looked for {[str(c) for c in candidates]}. Single-file text encoders carry no "
            "tokenizer: pass the folder of the Qwen2.5 tokenizer (inside ComfyUI: comfy/text_encoders/qwen25_tokenizer)."
        )
    try:
        tokenizer = Qwen2Tokenizer.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError, TypeError) as e:
        raise UserInputError(f"tokenizer folder {folder} could not be read as a Qwen2.5 tokenizer ({e}). It needs "
                             "tokenizer_config.json with tokenizer.json or vocab.json + merges.txt.") from e
    unknown = [t for t in REQUIRED_TOKENS if tokenizer.convert_tokens_to_ids(t) in (None, tokenizer.unk_token_id)]
    if unknown:
        raise UserInputError(f"tokenizer folder {folder} lacks the tokens {unknown}: it is not a Qwen2.5 tokenizer.")
    if len(tokenizer) > vocab_rows:
        raise UserInputError(
            f"tokenizer folder {folder} has {len(tokenizer)} tokens but the text encoder {text_encoder_file} only "
            f"{vocab_rows} embeddings: they do not belong together. Choose the tokenizer of this text encoder."
        )
    return tokenizer
