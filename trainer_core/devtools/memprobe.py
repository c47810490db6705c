"""Measure tensor memory on any device, the CPU included: what autograd saves, and the peak of live bytes.

The planner (`planner/activations.py`) predicts activation memory from formulas; these two probes are how those
formulas are checked on a machine without a GPU (tests, `benchmarks/memory_cpu.py`).

- `SavedTensors`: a `saved_tensors_hooks` context that records every tensor autograd keeps for backward,
  counted once per storage (views of one buffer share it) and without the parameters (weights are
  counted by the planner's weight terms, not as activations).
- `LiveBytes`: a `TorchDispatchMode` that sees every tensor an op returns and keeps the bytes of each
  storage until Python frees that storage (a weak reference with a callback). `peak` is then the most
  bytes alive at once among tensors created inside the context: on a GPU this is what
  `torch.cuda.max_memory_allocated` grows by, less allocator rounding and kernels' private workspaces.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
import torch.utils.checkpoint
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


def _storage_key(t: torch.Tensor) -> tuple[str, int, int]:
    st = t.untyped_storage()
    return (str(t.device), st.data_ptr(), st.nbytes())


class SavedTensors:
    """Bytes of the tensors autograd saves inside the context, one count per storage, parameters excluded.

    A storage is known by its address while it lives, and forgotten when it is freed: a saved tensor may go
    before the context ends (a graph branch that nothing reaches any more, e.g. the last block's text stream,
    which the runner detaches), and the allocator may hand its address, at the same size, to a tensor saved
    later. Counted by address alone, that later tensor was taken for the first and left out: which addresses
    the allocator reuses depends on its threads' timing, so a busy machine counted 64 bytes fewer now and then
    (issue 25: `test_float8_compiled`'s 644992 == 644928)."""

    def __init__(self, exclude: list[torch.Tensor] | tuple = ()):
        self._excluded = {_storage_key(p) for p in exclude if p.numel()}
        self._seen: dict[tuple[str, int, int], weakref.ref] = {}  # key -> the storage counted under it
        self.by_shape: list[tuple[tuple[int, ...], torch.dtype, int]] = []  # (shape, dtype, bytes) per storage
        self.bytes = 0
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        if t.numel():
            key = _storage_key(t)
            if key not in self._excluded and key not in self._seen:
                # torch keeps one Python object per live storage, so the reference dies with the storage.
                self._seen[key] = weakref.ref(t.untyped_storage(), lambda _ref, key=key: self._forget(key, _ref))
                self.bytes += key[2]
                self.by_shape.append((tuple(t.shape), t.dtype, key[2]))
        return t

    def _forget(self, key: tuple[str, int, int], ref: weakref.ref) -> None:
        if self._seen.get(key) is ref:  # the address may already belong to a newer storage
            del self._seen[key]

    def __enter__(self) -> SavedTensors:
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)


class LiveBytes(TorchDispatchMode):
    """Current and peak bytes of the storages created by ops run inside the context (see module doc).

    Storages that existed before (parameters, inputs) are not counted; `current` therefore starts at 0
    and `peak` is the growth over that baseline. Autograd's backward runs its ops through the same
    dispatcher, so `loss.backward()` inside the context is measured too.
    """

    def __init__(self):
        super().__init__()
        self.current = 0
        self.peak = 0
        self._refs: dict[int, weakref.ref] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        # An op's output that shares an input's storage (a view, an in-place op) allocated nothing.
        inputs = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs))
                  if isinstance(t, torch.Tensor) and t.device.type != "meta"}
        out = func(*args, **kwargs)
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self._track(t, inputs)
        return out

    def _track(self, t: torch.Tensor, inputs: set[int]) -> None:
        st = t.untyped_storage()
        if id(st) in self._refs or st.nbytes() == 0 or (t.device.type != "meta" and st.data_ptr() in inputs):
            return
        nbytes = st.nbytes()
        key = id(st)

        def freed(_ref, key=key, nbytes=nbytes):
            self._refs.pop(key, None)
            self.current -= nbytes

        self._refs[key] = weakref.ref(st, freed)
        self.current += nbytes
        self.peak = max(self.peak, self.current)

    def reset_peak(self) -> None:
        self.peak = self.current


@dataclass
class BlockProbe:
    saved_bytes: int  # what autograd keeps for the block's backward (no checkpointing)
    peak_bytes: int  # most bytes alive at once during forward + backward, above inputs and upstream grads


def _random_block_inputs(transformer: torch.nn.Module, seed: int):
    """(device, inner width, rand(*shape)): random block inputs on the transformer's device in its compute dtype (the
    first floating parameter wider than float8), drawn from a generator seeded with `seed`."""
    param = next(p for p in transformer.parameters() if p.is_floating_point() and p.dtype.itemsize > 1)
    device, dtype = param.device, param.dtype
    dim = transformer.config.num_attention_heads * transformer.config.attention_head_dim
    g = torch.Generator().manual_seed(seed)
    return device, dim, lambda *shape: torch.randn(*shape, generator=g).to(device, dtype)


def probe_block(transformer: torch.nn.Module, batch: int, grid: tuple[int, int], text_tokens: int,
                checkpointing: bool, block_index: int = 0, seed: int = 0) -> BlockProbe:
    """Run one block of `transformer` forward and backward on random inputs and measure its memory.

    The inputs require grad, as for every block after the first. Image tokens: grid[0] x grid[1]
    (packed latent rows x columns). Tensors that exist before the block runs (parameters, inputs, RoPE
    factors, the gradients arriving from the next block) are not counted.
    """
    block = transformer.transformer_blocks[block_index]
    device, dim, rand = _random_block_inputs(transformer, seed)
    n_img = grid[0] * grid[1]
    hidden = rand(batch, n_img, dim).requires_grad_(True)  # (B, N_img, D)
    text = rand(batch, text_tokens, dim).requires_grad_(True)  # (B, N_txt, D)
    temb = rand(batch, dim)  # (B, D)
    rope = transformer.pos_embed([(1, *grid)] * batch, max_txt_seq_len=text_tokens, device=device)
    upstream = (rand(batch, text_tokens, dim), rand(batch, n_img, dim))  # grads of (text, image) outputs
    excluded = [*transformer.parameters(), *rope]

    with SavedTensors(exclude=excluded) as saved:
        outputs = block(hidden, text, None, temb, rope)
    del outputs
    with LiveBytes() as live:
        if checkpointing:
            outputs = torch.utils.checkpoint.checkpoint(block, hidden, text, None, temb, rope, use_reentrant=False)
        else:
            outputs = block(hidden, text, None, temb, rope)
        torch.autograd.backward(outputs, upstream)
        del outputs
    for p in transformer.parameters():
        p.grad = None
    return BlockProbe(saved_bytes=saved.bytes, peak_bytes=live.peak)


def block21_inputs(transformer: torch.nn.Module, batch: int, grid: tuple[int, int], text_tokens: int, seed: int = 0):
    """(joint hidden states, the block's other arguments) of a Qwen-Image 2.1 block for a text-to-image step: the
    prompt's `text_tokens` rows then grid[0] x grid[1] target rows, as the transformer's forward builds them
    (modulation with its t = 0 row, the target mask, RoPE factors, the prefix's one text segment)."""
    from diffusers.models.transformers.transformer_qwenimage21 import _qwenimage21_prefix_segments

    device, dim, rand = _random_block_inputs(transformer, seed)
    n_img = grid[0] * grid[1]
    hidden = rand(batch, text_tokens + n_img, dim).requires_grad_(True)  # (B, L + N, D)
    modulation = rand(batch + 1, 4 * dim)  # (B + 1, 4 D): the sampled timesteps' rows and the t = 0 row
    image = torch.cat([torch.zeros(text_tokens, dtype=torch.bool), torch.ones(n_img, dtype=torch.bool)]).to(device)
    rope = transformer.pos_embed([(1, *grid)], image, device=device)
    image_ids, target = transformer.build_token_metadata(image, [(1, *grid)])
    segments = _qwenimage21_prefix_segments(image_ids, text_tokens)
    return hidden, (modulation, rope, None, target, None, None, None, segments, None)


def probe_block21(transformer: torch.nn.Module, batch: int, grid: tuple[int, int], text_tokens: int,
                  checkpointing: bool, block_index: int = 0, seed: int = 0) -> BlockProbe:
    """`probe_block` for a Qwen-Image 2.1 (single-stream) block: its one input, the joint sequence, requires grad."""
    block = transformer.transformer_blocks[block_index]
    hidden, rest = block21_inputs(transformer, batch, grid, text_tokens, seed)
    upstream = torch.randn(hidden.shape, generator=torch.Generator().manual_seed(seed + 1)).to(hidden)
    excluded = [*transformer.parameters(), rest[0], rest[1]]
    with SavedTensors(exclude=excluded) as saved:
        output = block(hidden, *rest)
    del output
    with LiveBytes() as live:
        if checkpointing:
            output = torch.utils.checkpoint.checkpoint(block, hidden, *rest, use_reentrant=False)
        else:
            output = block(hidden, *rest)
        torch.autograd.backward(output, upstream)
        del output
    for p in transformer.parameters():
        p.grad = None
    return BlockProbe(saved_bytes=saved.bytes, peak_bytes=live.peak)
