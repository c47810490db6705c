"""The start of a process that trains: the engine's imports without garbage collections in between (`load_engine`).

The command line calls it before `demo`, and in `train` once the run's processes agree on their settings
(runs/cli.py); a script that trains in a process of its own can call it first too.
"""

from __future__ import annotations


def load_engine() -> None:
    """Import the engine and the libraries it trains with, the garbage collector off meanwhile, then move every
    object alive to the collector's permanent generation (gc.freeze).

    The imports create ~500k objects (torch, its compiler, diffusers, transformers, peft), and collections
    during them walk all of those again and again. Frozen, these objects (modules, functions, classes: never freed
    anyway) are skipped by every later full collection, and the engine collects whenever it releases a model
    (core/host_memory.give_back_freed_memory): ~0.5 s each unfrozen. What training creates is still collected.
    Measured (benchmarks/README.md): a whole `demo --model qwen-image --steps 4` process takes 0.56 to 0.66 x the time."""
    import gc

    gc.disable()
    try:
        import diffusers.models.autoencoders  # noqa: F401  (imports every autoencoder, the Qwen-Image VAE among them)
        import peft  # noqa: F401
        import transformers  # noqa: F401
        from diffusers import QwenImageTransformer2DModel  # noqa: F401
        from transformers import Qwen2_5_VLForConditionalGeneration  # noqa: F401

        from .. import training  # noqa: F401
        from . import headless  # noqa: F401
    finally:
        gc.enable()
    gc.collect()
    gc.freeze()
