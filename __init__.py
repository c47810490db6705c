"""ComfyUI entry point of the Qwen-Image LoRA trainer pack."""

# ComfyUI always imports this file as a package. pytest (9.x) also imports it, for the checkout folder's
# package node, and when that folder's name is not a valid identifier (a worktree such as `wt-issue3`)
# it imports it as a top-level module, with no package to import the nodes from: skip them then.
if __package__:
    from .nodes import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS

    __all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS"]
