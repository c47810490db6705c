"""The example workflows match the node definitions: types exist, values fit, links connect like types."""

import json
import sys

import pytest

from conftest import REPO, WORKFLOW_STEMS, api_workflow, ui_workflow

UI_WORKFLOWS = sorted((REPO / "example_workflows").glob("*.json"))
API_WORKFLOWS = sorted((REPO / "example_workflows" / "api").glob("*.api.json"))

# ComfyUI core nodes the workflows use, as ComfyUI declares them.
CORE = {
    "SaveImage": {"required": {"images": ("IMAGE",), "filename_prefix": ("STRING", {"default": "ComfyUI"})}},
    "PreviewImage": {"required": {"images": ("IMAGE",)}},
    "PreviewAny": {"required": {"source": ("*", {})}},  # ComfyUI's IO.ANY: takes any type
    "ImageScaleBy": {"required": {"image": ("IMAGE",),  # "Upscale Image By" (0.3.64 and 0.33.0 alike)
                                  "upscale_method": (["nearest-exact", "bilinear", "area", "bicubic", "lanczos"],),
                                  "scale_by": ("FLOAT", {"default": 1.0, "min": 0.01, "max": 8.0, "step": 0.01})}},
    # "Load Image": the input folder's files (ComfyUI ships input/example.png) and an upload button (nodes.py)
    "LoadImage": {"required": {"image": (["example.png"], {"image_upload": True})}},
    "ImageCrop": {"required": {"image": ("IMAGE",),  # comfy_extras/nodes_images.py (0.3.64 and 0.33.0 alike)
                               "width": ("INT", {"default": 512, "min": 1, "max": 16384, "step": 1}),
                               "height": ("INT", {"default": 512, "min": 1, "max": 16384, "step": 1}),
                               "x": ("INT", {"default": 0, "min": 0, "max": 16384, "step": 1}),
                               "y": ("INT", {"default": 0, "min": 0, "max": 16384, "step": 1})}},
}
CORE_OUTPUTS = {"SaveImage": (), "PreviewImage": (), "PreviewAny": (), "ImageScaleBy": ("IMAGE",),
                "LoadImage": ("IMAGE", "MASK"), "ImageCrop": ("IMAGE",)}
WIDGET_TYPES = ("INT", "FLOAT", "STRING", "BOOLEAN")
# Frontend-only (virtual) nodes: the canvas keeps them in the UI workflow and leaves them out of the prompt.
FRONTEND_ONLY = {"Note", "MarkdownNote"}
STAGES = ("models", "data and cache", "lora and optimizer", "training", "looking and saving")
TITLE_H = 30  # LiteGraph draws a node's title bar above its `pos`


# The example workflows name the files ComfyUI's own templates download (families/comfyui_files.py); a user has them
# in the model folders, which the loader lists. Validate as that user: the files exist (as empty stand-ins).
@pytest.fixture(autouse=True)
def user_model_folders(tmp_path, monkeypatch):
    from trainer_core.families.comfyui_files import MODEL_FILES

    for file in MODEL_FILES:
        (tmp_path / file.folder).mkdir(exist_ok=True)
        (tmp_path / file.folder / file.name).write_bytes(b"")
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
        cls = pack.NODE_CLASS_MAPPINGS.get(node["class_type"])
        open_sockets = {n for n, spec in (cls.INPUT_TYPES().get("optional", {}) if cls else {}).items()
                        if not is_widget(spec)}  # optional sockets may be left unconnected
        assert set(node["inputs"]) <= set(inputs) and set(inputs) - set(node["inputs"]) <= open_sockets, \
            f"node {node_id}: inputs differ from the definition"
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
        if node["type"] in FRONTEND_ONLY:
            assert not node["inputs"] and not node["outputs"] and node["widgets_values"], f"node {node['id']}"
            continue
        assert node["type"] in defs, f"node {node['id']}: unknown type {node['type']}"
        inputs, outputs = defs[node["type"]]
        widget_specs = [(name, spec) for name, spec in inputs.items() if is_widget(spec)]
        values = list(node["widgets_values"])
        for name, spec in widget_specs:
            value = values.pop(0)
            check_value(f"node {node['id']} ({node['type']}).{name}", spec, value)
            if spec[0] == "INT" and name in ("seed", "noise_seed"):
                values.pop(0)  # the canvas adds a control_after_generate value after these
            if len(spec) > 1 and spec[1].get("image_upload"):
                assert values.pop(0) == "image"  # Load Image's upload button stores its value after the file's
        assert values == [], f"node {node['id']}: extra widget values {values}"
        sockets = [name for name, spec in inputs.items() if not is_widget(spec)]
        assert [i["name"] for i in node["inputs"] if "widget" not in i] == sockets
        # a widget fed by a link (the Dataset's folder from Caption Dataset) is an input naming its widget
        wired = [i for i in node["inputs"] if "widget" in i]
        assert all(i["widget"]["name"] == i["name"] and is_widget(inputs[i["name"]]) for i in wired), node["id"]
        assert [o["type"] for o in node["outputs"]] == list(outputs)
    for link_id, src, src_slot, dst, dst_slot, kind in wf["links"]:
        out = nodes[src]["outputs"][src_slot]
        inp = nodes[dst]["inputs"][dst_slot]
        assert out["type"] == kind and inp["type"] in (kind, "*"), f"link {link_id}: {out['type']} -> {inp['type']}"
        assert link_id in out["links"] and inp["link"] == link_id


@pytest.mark.parametrize("ui_path", UI_WORKFLOWS, ids=lambda p: p.name)
def test_ui_and_api_twins_agree(pack, ui_path):
    ui = json.loads(ui_path.read_text())
    api = json.loads((REPO / "example_workflows" / "api" / f"{ui_path.stem}.api.json").read_text())
    executed = [n for n in ui["nodes"] if n["type"] not in FRONTEND_ONLY]
    assert {str(n["id"]): n["type"] for n in executed} == {k: v["class_type"] for k, v in api.items()}
    defs = definitions(pack)
    for node in executed:
        inputs, _ = defs[node["type"]]
        widget_names = [name for name, spec in inputs.items() if is_widget(spec)]
        wired = {i["name"]: i["link"] for i in node["inputs"] if "widget" in i}
        api_inputs = api[str(node["id"])]["inputs"]
        links = {link[0]: [str(link[1]), link[2]] for link in ui["links"]}
        for name, link in wired.items():  # the API twin takes a wired widget's value from the link's source
            assert api_inputs[name] == links[link], f"node {node['id']}.{name}"
        values = [v for name, v in zip(widget_names, node["widgets_values"]) if name not in wired]
        assert values == [api_inputs[name] for name in widget_names if name not in wired], f"node {node['id']}"


def box(node):
    """A node's box on the canvas, title bar included: (x0, y0, x1, y1)."""
    (x, y), (w, h) = node["pos"], node["size"]
    return x, y - TITLE_H, x + w, y + h


def overlap(a, b):
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def inside(inner, outer):
    return outer[0] <= inner[0] and outer[1] <= inner[1] and inner[2] <= outer[2] and inner[3] <= outer[3]


@pytest.mark.parametrize("path", UI_WORKFLOWS, ids=lambda p: p.name)
def test_no_two_nodes_overlap(path):
    nodes = json.loads(path.read_text())["nodes"]
    for i, a in enumerate(nodes):
        for b in nodes[i + 1:]:
            assert not overlap(box(a), box(b)), f"nodes {a['id']} ({a['type']}) and {b['id']} ({b['type']}) overlap"


def least_size(node, spec_inputs, outputs):
    """The smallest body the canvas (LiteGraph, frontend 1.49) gives a node: a 20 px row per socket row,
    each widget 20 px + 4 (a text box at least 50 + 4), 8 px after the widgets, 6 px at the bottom; at
    least 1.5 x 140 px wide with widgets."""
    sockets = [n for n, s in spec_inputs.items() if not is_widget(s)]
    widgets = [s for s in spec_inputs.values() if is_widget(s)]
    heights = [50 if s[0] == "STRING" and len(s) > 1 and s[1].get("multiline") else 20 for s in widgets]
    if node["type"] in FRONTEND_ONLY:
        heights.append(50)  # the Note's text box
    if node["type"] == "PreviewAny":
        heights += [60, 20]  # the box it shows its value in, its markdown toggle (as frontend 1.49 sizes them)
    rows = max(len(sockets), len(outputs), 1)
    height = rows * 20 + (sum(h + 4 for h in heights) + 8 if heights else 0) + 6
    return (210 if heights else 140), height


@pytest.mark.parametrize("path", UI_WORKFLOWS, ids=lambda p: p.name)
def test_node_sizes_fit_their_sockets_and_widgets(pack, path):
    defs = definitions(pack)
    for node in json.loads(path.read_text())["nodes"]:
        spec_inputs, outputs = defs.get(node["type"], ({}, ()))
        width, height = least_size(node, spec_inputs, outputs)
        assert node["size"][0] >= width and node["size"][1] >= height, \
            f"node {node['id']} ({node['type']}): {node['size']} is smaller than {[width, height]}"
        if node["type"] in ("SaveImage", "PreviewImage", "QwenLoRATrain"):  # room for the image shown on it
            assert node["size"][1] >= height + 220, f"node {node['id']} ({node['type']}) has no room for its image"


@pytest.mark.parametrize("path", UI_WORKFLOWS, ids=lambda p: p.name)
def test_groups_are_the_stages_and_hold_their_nodes(path):
    wf = json.loads(path.read_text())
    groups = wf["groups"]
    titles = [g["title"].lower() for g in groups]
    for stage in STAGES:
        assert sum(stage in t for t in titles) == 1, f"no single group titled {stage!r}: {titles}"
    boxes = [(g["bounding"][0], g["bounding"][1] + 36, g["bounding"][0] + g["bounding"][2],
              g["bounding"][1] + g["bounding"][3]) for g in groups]  # below the group's title bar
    for i, a in enumerate(groups):
        for b in groups[i + 1:]:
            assert not overlap(boxes[groups.index(a)], boxes[groups.index(b)]), f"{a['title']} / {b['title']}"
    for node in wf["nodes"]:
        if node["type"] in FRONTEND_ONLY:
            continue
        holders = [g["title"] for g, b in zip(groups, boxes) if inside(box(node), b)]
        assert len(holders) == 1, f"node {node['id']} ({node['type']}) is in groups {holders}"
    stage_of = {n["type"]: next(g["title"].lower() for g, b in zip(groups, boxes) if inside(box(n), b))
                for n in wf["nodes"] if n["type"] not in FRONTEND_ONLY}
    loader = stage_of.get("QwenLoRALoadModels") or stage_of["QwenLoRALoadEditModels"]  # Edit: its own loader
    assert "models" in loader and "data" in stage_of["QwenLoRACache"]
    assert "lora and optimizer" in stage_of["QwenLoRAOptimizer"] and "training" in stage_of["QwenLoRATrain"]
    assert "saving" in stage_of["QwenLoRASave"]


@pytest.mark.parametrize("path", UI_WORKFLOWS, ids=lambda p: p.name)
def test_a_note_says_how_to_use_the_workflow_and_stays_out_of_the_prompt(path):
    wf = json.loads(path.read_text())
    notes = [n for n in wf["nodes"] if n["type"] == "Note"]
    assert len(notes) == 1
    (text,) = notes[0]["widgets_values"]
    assert "queue" in text.lower() and len(text.splitlines()) <= 10
    assert notes[0]["mode"] == 0 and "text" in notes[0]["properties"]
    api = json.loads((REPO / "example_workflows" / "api" / f"{path.stem}.api.json").read_text())
    assert str(notes[0]["id"]) not in api
    assert wf["last_node_id"] >= max(n["id"] for n in wf["nodes"])


def test_the_workflow_files_are_what_the_build_script_writes(pack):
    """The committed workflows match tools/build_workflows.py (run it after changing a node)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("build_workflows", REPO / "tools" / "build_workflows.py")
    build = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("build_workflows", build)  # its dataclass looks its module up there
    spec.loader.exec_module(sys.modules["build_workflows"])
    build = sys.modules["build_workflows"]
    assert {f"{stem}.json" for stem in build.WORKFLOWS} == {p.name for p in UI_WORKFLOWS}
    assert set(WORKFLOW_STEMS.values()) == set(build.WORKFLOWS)  # the tests' names for them (conftest.py)
    for stem, workflow in build.WORKFLOWS.items():
        ui, api = build.build(pack.NODE_CLASS_MAPPINGS, pack.NODE_DISPLAY_NAME_MAPPINGS, workflow)
        assert json.loads((REPO / "example_workflows" / f"{stem}.json").read_text()) == ui, stem
        assert json.loads((REPO / "example_workflows" / "api" / f"{stem}.api.json").read_text()) == api, stem


def test_the_tiny_workflow_validates_without_any_model_file(pack, tmp_path, monkeypatch):
    """The first-run workflow needs nothing downloaded: its values are valid in a ComfyUI whose model
    folders are empty, its model is the shapes model in the pack's own pretrained/ folder, and its dataset is
    the example shipped with the pack (the 8 stars that model never saw)."""
    monkeypatch.setenv("QWEN_LORA_MODELS", str(tmp_path / "empty"))
    prompt = json.loads((api_workflow("first_run")).read_text())
    defs = definitions(pack)
    for node_id, node in prompt.items():
        inputs, _ = defs[node["class_type"]]
        for name, value in node["inputs"].items():
            if not isinstance(value, list):
                check_value(f"node {node_id}.{name}", inputs[name], value)
    assert prompt["1"]["inputs"]["source"] == "shapes model (small, pretrained, ships with the pack)"
    from importlib import import_module

    data_nodes = import_module(f"{pack.__name__}.nodes.data_nodes")
    folder = data_nodes.dataset_folder(prompt["2"]["inputs"]["folder"])
    stars = sorted(__import__("pathlib").Path(folder).glob("*.png"))
    assert len(stars) == 8 and all("star" in p.name for p in stars)


def test_no_folder_hides_the_workflows_from_comfyuis_template_browser():
    """ComfyUI (app/custom_node_manager.py, 0.3.64 and 0.33.0) lists the `*.json` of every folder of these names as a
    pack's templates but serves only the first existing one under /api/workflow_templates/<pack>/: a second folder's
    files would be listed and not load (a headless `examples/` folder once hid `workflows/`). `example_workflows/`,
    the name ComfyUI asks for, is the only one; its listing is not recursive (`*/example_workflows/*.json`), so the
    API twins in `example_workflows/api/` are served but never listed as templates."""
    for name in ("example", "examples", "workflow", "workflows"):
        assert not (REPO / name).exists(), name
    assert (REPO / "example_workflows").is_dir()
    assert not list((REPO / "example_workflows").glob("*.api.json"))  # the twins stay one level down


@pytest.mark.parametrize("path", UI_WORKFLOWS, ids=lambda p: p.name)
def test_the_note_has_no_hard_wraps_and_its_box_shows_every_line(path):
    """One line per paragraph (the canvas wraps them to the box; hard-wrapped lines were wrapped again), and a box
    tall enough for every line as a 10 px monospace text box wraps them (6.1 px a character, 12 px a line, the
    frontends' text box 20 px narrower and 22 px lower than the node: measured in the browser, README's Screenshots)."""
    import textwrap

    (note,) = [n for n in json.loads(path.read_text())["nodes"] if n["type"] == "Note"]
    (text,) = note["widgets_values"]
    paragraphs = text.split("\n")
    assert all(p and not p.startswith(" ") for p in paragraphs), paragraphs  # no continuation lines
    width, height = note["size"]
    columns = int((width - 20 - 4 - 15) // 6.1)
    lines = sum(len(textwrap.wrap(p, columns)) for p in paragraphs)
    assert height - 22 - 4 >= (lines + 1) * 12, (path.name, lines, note["size"])


@pytest.mark.parametrize("path", UI_WORKFLOWS, ids=lambda p: p.name)
def test_every_node_says_what_it_does_here_and_its_title_fits(pack, path):
    """ComfyUI's general nodes (Preview as Text, Preview Image, Save Image, Upscale Image By) are titled by their role
    in this workflow; every title fits its node at the canvas' 14 px title font (~8 px a character, within the
    node's width less two title-bar heights) and every group's title at 24 px within its group."""
    wf = json.loads(path.read_text())
    for node in wf["nodes"]:
        title = node.get("title") or pack.NODE_DISPLAY_NAME_MAPPINGS.get(node["type"], node["type"])
        if node["type"] in CORE:
            assert node.get("title"), f"node {node['id']} ({node['type']}) has no title saying its role"
        assert len(title) * 8.6 <= node["size"][0] - 60, (node["id"], title, node["size"])
    for group in wf["groups"]:
        assert len(group["title"]) * 14 <= group["bounding"][2], group


@pytest.mark.parametrize("path", UI_WORKFLOWS, ids=lambda p: p.name)
def test_the_first_node_of_each_group_leaves_room_for_the_source_badge_under_the_group_title(path):
    """The frontend draws each custom node's source badge in a row just above its title bar (about 22 px): below the
    group's 40 px title bar, not over the title."""
    wf = json.loads(path.read_text())
    for group in wf["groups"]:
        x, y, w, h = group["bounding"]
        members = [n for n in wf["nodes"] if x <= n["pos"][0] < x + w and y <= n["pos"][1] < y + h]
        assert members and min(n["pos"][1] - TITLE_H for n in members) >= y + 40 + 24, group["title"]


def test_the_real_workflows_loaders_carry_comfyuis_download_addresses(pack):
    """Each real-model workflow's Load node carries `properties.models` as ComfyUI's own templates write them on
    their loaders ({name, url, directory}), one for each file it names, each the catalogue's entry
    (families/comfyui_files.py: the official file names, Comfy-Org's addresses, the models folders): the frontend
    offers the missing ones for download when the workflow loads. The first runs name no file and carry none."""
    from trainer_core.families.comfyui_files import known_file

    for role in ("main", "edit", "qwen21", "layered"):
        wf = json.loads(ui_workflow(role).read_text())
        (load,) = [n for n in wf["nodes"] if n["type"].startswith("QwenLoRALoad")]
        spec = pack.NODE_CLASS_MAPPINGS[load["type"]].INPUT_TYPES()["required"]
        values = dict(zip([name for name, s in spec.items() if is_widget(s)], load["widgets_values"]))
        files = [values[part] for part in ("transformer", "text_encoder", "vae")]
        models = load["properties"]["models"]
        assert [m["name"] for m in models] == files, role
        for model in models:
            entry = known_file(model["name"])
            assert model == {"name": entry.name, "url": entry.url, "directory": entry.folder}, (role, model)
            assert model["url"].startswith("https://huggingface.co/Comfy-Org/") and model["url"].endswith(model["name"])
    for role in ("first_run", "regularized"):
        assert not any(n["properties"].get("models") for n in json.loads(ui_workflow(role).read_text())["nodes"])


def test_the_first_run_comes_first_and_every_name_says_what_it_trains():
    """ComfyUI's template browser shows a pack's workflows by file name (its title there) in the order ComfyUI lists
    them, which nodes/host.py makes the names' order: the first run first, then the real Qwen-Image one; each name
    says what it trains on, short enough for one line of a template card."""
    names = sorted(p.stem for p in UI_WORKFLOWS)
    assert names[0] == WORKFLOW_STEMS["first_run"] and names[1] == WORKFLOW_STEMS["main"]
    assert [n.split(" ", 1)[0] for n in names] == [str(i) for i in range(1, len(names) + 1)]
    assert all(len(n) <= 37 for n in names), names  # what a 1.49 card showed uncut (README, Screenshots)


def test_every_workflow_has_its_template_picture():
    """The template browser shows `<name>.jpg` beside `<name>.json` as the workflow's picture (a screenshot of it after
    a run: tools/screenshots.py --thumbnail); without one it shows a generic picture."""
    from PIL import Image

    for path in UI_WORKFLOWS:
        picture = path.with_suffix(".jpg")
        assert picture.is_file(), picture.name
        with Image.open(picture) as image:
            assert image.format == "JPEG" and image.size == (512, 512), picture.name
