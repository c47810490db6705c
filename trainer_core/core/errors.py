"""Errors a user can act on.

Every error raised for bad input is a `UserInputError`: its message names the input that is wrong and
says what to do about it. Nodes let these propagate so ComfyUI shows the message on the node.

ComfyUI names an error's type `klass.__module__ + "." + klass.__qualname__` (`full_type_name` in its
execution.py, 0.3.64 and 0.33.0 alike). A custom node's modules are imported under their file path, so the
real module name would show as `...custom_nodes.qwen_image_lora_trainer.trainer_core.core.errors.UserInputError`.
Our error classes therefore carry the short module name `qwen_lora` (shown as `qwen_lora.UserInputError`),
and pickle through `_rebuild`, a function of this module, since `qwen_lora` is no importable module.
"""

SHORT_MODULE = "qwen_lora"


def _rebuild(class_name: str, args: tuple, state: dict | None):
    """Unpickle one of this module's errors (see `_ShortName.__reduce__`)."""
    error = globals()[class_name](*args)
    if state:
        error.__dict__.update(state)
    return error


class _ShortName:
    """Mixin: pickles by this module's real name, whatever `__module__` says."""

    def __reduce__(self):
        return _rebuild, (type(self).__name__, self.args, self.__dict__ or None)


class UserInputError(_ShortName, ValueError):
    """Bad input from the user: the message names the input and the fix."""


class TrainingStopped(_ShortName, RuntimeError):
    """Training stopped on purpose (for example repeated non-finite losses); the state was kept."""


class RunFolderLost(UserInputError):
    """The run folder's lock was removed or taken over: this trainer must not write there any more."""


class MissingPath(UserInputError):
    """A file or folder that the settings name is not on this machine (a run file prepared for another may be fine)."""


for _cls in (UserInputError, TrainingStopped, RunFolderLost, MissingPath):
    _cls.__module__ = SHORT_MODULE
del _cls
