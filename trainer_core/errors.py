"""Errors a user can act on.

Every error raised for bad input is a `UserInputError`: its message names the input that is wrong and
says what to do about it. Nodes let these propagate so ComfyUI shows the message on the node.
"""


class UserInputError(ValueError):
    """Bad input from the user: the message names the input and the fix."""


class TrainingStopped(RuntimeError):
    """Training stopped on purpose (for example repeated non-finite losses); the state was kept."""


class RunFolderLost(UserInputError):
    """The run folder's lock was removed or taken over: this trainer must not write there any more."""
