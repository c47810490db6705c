"""Our errors show a short type name in ComfyUI and still pickle and match by class."""

import pickle
import re
from pathlib import Path

import pytest

from conftest import pack_module

COMFY_VERSIONS = ("/work/comfyui-0.3.64", "/work/comfyui-0.33.0")


def full_type_name(klass):
    """ComfyUI's rule (execution.py of 0.3.64 and 0.33.0): how the error's type is shown."""
    module = klass.__module__
    if module == "builtins":
        return klass.__qualname__
    return module + "." + klass.__qualname__


@pytest.mark.parametrize("root", COMFY_VERSIONS)
def test_the_rule_is_comfyuis(root):
    source = Path(root, "execution.py")
    if not source.is_file():
        pytest.skip(f"{root} is not here")
    text = source.read_text()
    body = re.search(r"def full_type_name\(klass\):\n((?:    .*\n)+)", text)[1]
    assert body.split() == ("module = klass.__module__ if module == 'builtins': return klass.__qualname__ "
                            "return module + '.' + klass.__qualname__").split()
    assert "exception_type = full_type_name(typ)" in text


@pytest.mark.parametrize("name", ["UserInputError", "TrainingStopped", "RunFolderLost"])
def test_errors_of_the_pack_as_comfyui_loads_it_have_short_names(pack, name):
    errors = pack_module(pack, "trainer_core.core.errors")
    cls = getattr(errors, name)
    assert full_type_name(cls) == f"qwen_lora.{name}"
    error = cls("dataset folder '/x' does not exist.")
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is cls and copy.args == error.args and str(copy) == str(error)
    assert isinstance(copy, errors.UserInputError if name != "TrainingStopped" else RuntimeError)
    try:
        raise error
    except ValueError if name != "TrainingStopped" else RuntimeError as caught:
        assert caught is error


def test_extra_attributes_survive_pickling():
    from trainer_core.core.errors import UserInputError

    error = UserInputError("bad")
    error.detail = 3
    copy = pickle.loads(pickle.dumps(error))
    assert copy.detail == 3 and copy.args == ("bad",)
