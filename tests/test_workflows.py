"""The example workflows match the node definitions: types exist, values fit, links connect like types."""

import json

import pytest

from conftest import REPO

UI_WORKFLOWS = sorted((REPO / "workflows").glob("*.json"))
API_WORKFLOWS = sorted((REPO / "workflows" / "api").glob("*.api.json"))

# ComfyUI core nodes the workflows use, as ComfyUI declares them.
CORE = {
    "SaveImage": {"required": {"images": ("IMAGE",), "filename_prefix": ("STRING", {"default": "ComfyUI"})}},
    "PreviewImage": {"required": {"images": ("IMAGE",)}},
    "PreviewAny": {"required": {"source": ("*", {})}},  # ComfyUI's IO.ANY: takes any type
}
CORE_OUTPUTS = {"SaveImage": (), "PreviewImage": (), "PreviewAny": ()}
WIDGET_TYPES = ("INT", "FLOAT", "STRING", "BOOLEAN")


# The example workflow names ComfyUI's repackaged Qwen-Image files; a user has them in the model
# folders, which the loader lists. Validate as that user: the files exist (as empty stand-ins).
USER_FILES = {"diffusion_models": "qwen_image_fp8_e4m3fn.safetensors",
              "text_encoders": "qwen_2.5_vl_7b_fp8_scaled.safetensors", "vae": "qwen_image_vae.safetensors"}


@pytest.fixture(autouse=True)
def user_model_folders(tmp_path, monkeypatch):
    for kind, name in USER_FILES.items():
        (tmp_path / kind).mkdir()
        (tmp_path / kind / name).write_bytes(b"")
    monkeypatch.setenv("QWEN_LORA_MODELS", str(tmp_path))


def definitions(pack):
    defs = {}
    for name, cls in pack.NODE_CLASS_MAPPINGS.items():
        spec = cls.INPUT_TYPES()
        defs[name] = ({**spec.get("required", {}), **spec.get("optional", {})}, cls.RETURN_TYPES)
    for name, spec in CORE.items():
        defs[name] = (spec["required"], CORE_OUTPUTS[name])
    return defs


def is_widget(spec):
    return isinstance(spec[0], list) or spec[0] in WIDGET_TYPES


def check_value(where, spec, value):
    kind, options = spec[0], (spec[1] if len(spec) > 1 else {})
    if isinstance(kind, list):
        assert value in kind, f"{where}: {value!r} is not one of {kind}"
        return
    expected = {"INT": int, "FLOAT": (int, float), "STRING": str, "BOOLEAN": bool}[kind]
    assert isinstance(value, expected) and not (kind != "BOOLEAN" and isinstance(value, bool)), f"{where}: {value!r}"
    if kind in ("INT", "FLOAT"):
        assert options.get("min", value) <= value <= options.get("max", value), f"{where}: {value} out of range"


def test_there_is_a_ui_workflow_and_its_api_twin():
    assert [p.stem for p in UI_WORKFLOWS] == [p.name.removesuffix(".api.json") for p in API_WORKFLOWS]
    assert UI_WORKFLOWS


@pytest.mark.parametrize("path", API_WORKFLOWS, ids=lambda p: p.name)
def test_api_workflow_fits_the_node_definitions(pack, path):
    defs = definitions(pack)
    prompt = json.loads(path.read_text())
    for node_id, node in prompt.items():
        assert node["class_type"] in defs, f"node {node_id}: unknown type {node['class_type']}"
        inputs, _ = defs[node["class_type"]]
        assert set(node["inputs"]) == set(inputs), f"node {node_id}: inputs differ from the definition"
        for name, value in node["inputs"].items():
            where = f"node {node_id} ({node['class_type']}).{name}"
            if isinstance(value, list):
                src_id, slot = value
                src_outputs = defs[prompt[src_id]["class_type"]][1]
                assert inputs[name][0] in (src_outputs[slot], "*"), f"{where}: link type {src_outputs[slot]}"
            else:
                assert is_widget(inputs[name]), f"{where}: a socket given a value"
                check_value(where, inputs[name], value)


@pytest.mark.parametrize("path", UI_WORKFLOWS, ids=lambda p: p.name)
def test_ui_workflow_fits_the_node_definitions(pack, path):
    defs = definitions(pack)
    wf = json.loads(path.read_text())
    nodes = {n["id"]: n for n in wf["nodes"]}
    for node in wf["nodes"]:
        assert node["type"] in defs, f"node {node['id']}: unknown type {node['type']}"
        inputs, outputs = defs[node["type"]]
        widget_specs = [(name, spec) for name, spec in inputs.items() if is_widget(spec)]
        values = list(node["widgets_values"])
        for name, spec in widget_specs:
            value = values.pop(0)
            check_value(f"node {node['id']} ({node['type']}).{name}", spec, value)
            if spec[0] == "INT" and name in ("seed", "noise_seed"):
                values.pop(0)  # the canvas adds a control_after_generate value after these
        assert values == [], f"node {node['id']}: extra widget values {values}"
        sockets = [name for name, spec in inputs.items() if not is_widget(spec)]
        assert [i["name"] for i in node["inputs"]] == sockets
        assert [o["type"] for o in node["outputs"]] == list(outputs)
    for link_id, src, src_slot, dst, dst_slot, kind in wf["links"]:
        out = nodes[src]["outputs"][src_slot]
        inp = nodes[dst]["inputs"][dst_slot]
        assert out["type"] == kind and inp["type"] in (kind, "*"), f"link {link_id}: {out['type']} -> {inp['type']}"
        assert link_id in out["links"] and inp["link"] == link_id


@pytest.mark.parametrize("ui_path", UI_WORKFLOWS, ids=lambda p: p.name)
def test_ui_and_api_twins_agree(pack, ui_path):
    ui = json.loads(ui_path.read_text())
    api = json.loads((REPO / "workflows" / "api" / f"{ui_path.stem}.api.json").read_text())
    assert {str(n["id"]): n["type"] for n in ui["nodes"]} == {k: v["class_type"] for k, v in api.items()}
    defs = definitions(pack)
    for node in ui["nodes"]:
        inputs, _ = defs[node["type"]]
        widget_names = [name for name, spec in inputs.items() if is_widget(spec)]
        api_values = [api[str(node["id"])]["inputs"][name] for name in widget_names]
        assert node["widgets_values"] == api_values, f"node {node['id']}"
