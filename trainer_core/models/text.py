"""Prompt embeddings from the Qwen2.5-VL text encoder, the way the pinned diffusers pipeline makes them.

The pipeline wraps each prompt in a chat template and keeps the last hidden state of the prompt's own
tokens, dropping the template's prefix. We take the template and the token limit from the installed
diffusers `QwenImagePipeline` and derive the prefix length by tokenizing the prefix (34 tokens with the
real tokenizer; a tiny test tokenizer gives another number), so training sees exactly what sampling sees.
"""

from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=1)
def pipeline_prompt_constants() -> tuple[str, int]:
    """(chat template with one '{}', maximum prompt tokens) of the installed diffusers release."""
    from diffusers import QwenImagePipeline

    pipe = QwenImagePipeline(scheduler=None, vae=None, text_encoder=None, tokenizer=None, transformer=None)
    return pipe.prompt_template_encode, pipe.tokenizer_max_length


def template_prefix_length(tokenizer, template: str | None = None) -> int:
    """Tokens of a prompt template before the user's text or images: what the pipelines drop from the
    encoder's output. `template`: a pipeline's `prompt_template_encode` (default: the text-to-image one;
    the edit pipelines' put the images' vision tokens before the text)."""
    if template is None:
        template, _ = pipeline_prompt_constants()
    cut = min(i for i in (template.find("{}"), template.find("<|vision_start|>")) if i >= 0)
    return len(tokenizer(template[:cut]).input_ids)


@torch.no_grad()
def encode_prompts(text_encoder, tokenizer, prompts: list[str]) -> list[torch.Tensor]:
    """One embedding per prompt, each (num_prompt_tokens, hidden_size), on the encoder's device/dtype.

    Prompts are encoded together (padded, with an attention mask) and split back per prompt.
    """
    template, max_tokens = pipeline_prompt_constants()
    drop = template_prefix_length(tokenizer)
    device = next(text_encoder.parameters()).device
    batch = tokenizer(
        [template.format(p) for p in prompts],
        max_length=max_tokens + drop, padding=True, truncation=True, return_tensors="pt",
    ).to(device)
    out = text_encoder(input_ids=batch.input_ids, attention_mask=batch.attention_mask, output_hidden_states=True)
    hidden = out.hidden_states[-1]  # (B, T, D)
    mask = batch.attention_mask.bool()  # (B, T)
    return [hidden[i][mask[i]][drop:].clone() for i in range(len(prompts))]


def pad_prompt_batch(embeds: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Stack (L_i, D) embeddings into (B, L_max, D) with a (B, L_max) 0/1 mask; mask None when unpadded.

    Matches the pipeline: a batch without padding runs with no mask at all.
    """
    longest = max(e.shape[0] for e in embeds)
    padded = torch.stack([torch.cat([e, e.new_zeros(longest - e.shape[0], e.shape[1])]) for e in embeds])
    if all(e.shape[0] == longest for e in embeds):
        return padded, None
    mask = torch.stack([
        torch.cat([torch.ones(e.shape[0], dtype=torch.long), torch.zeros(longest - e.shape[0], dtype=torch.long)])
        for e in embeds
    ]).to(padded.device)
    return padded, mask
