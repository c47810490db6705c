"""ComfyUI entry point of the Qwen-Image LoRA trainer pack."""

# ComfyUI imports this file as a package. pytest also imports a rootdir `__init__.py`, and when the
# checkout's folder name is not a Python identifier (`comfyui-qwen-image-lora-trainer`, a worktree)
# it does so as a bare module, where a relative import cannot work: then there is nothing to register.
if __package__:
    from .nodes import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS
else:
    NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS = {}, {}

# ComfyUI serves this folder at /extensions/<the pack's folder name>/; the frontend's node documentation panel reads
# each node's help page from its docs/<NodeName>.md (written by tools/build_docs.py). It holds no JavaScript.
WEB_DIRECTORY = "./web"

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS", "WEB_DIRECTORY"]
