"""Every phase of a 1024 x 1024, rank 32 run, per member and GPU budget (24 / 16 / 12 / 8 GiB, 32 GB of host RAM), as
the memory plan sees it with the files ComfyUI's templates download: does each phase fit, and where one does not, the
smallest change the plan lists. The tables of README.md's memory section.

    .venv/bin/python benchmarks/plan_tables.py        (~1 min)

Members: Qwen-Image (and 2512: the same transformer; qwen_image_fp8_e4m3fn, qwen_2.5_vl_7b_fp8_scaled); Edit-2511 (the
same transformer with one 1024 x 1024 control: its latent rows lengthen the sequence, its text encoder keeps the vision
tower, which sees the control at the Edit-Plus encoder's 384 x 384; the fp8mixed file, planned as float8); Layered (a
1024 x 1024 composite and 4 layers: 6 images' rows, planned_image_size's rule; the bf16 file stored in float8; and at
640 x 640, its workflow's size);
Qwen-Image 2.1 from its int8 ConvRot files, text-to-image and with one and three 1024 x 1024 references.
"""

import dataclasses

import common  # noqa: F401  (puts the repository on sys.path)

from trainer_core.planner import GIB, PlanInputs, auto_blocks_to_swap
from trainer_core.families.qwen_image21.plan import real_arch21, real_parts21
from trainer_core.planner.arch import real_arch
from trainer_core.planner.inference import real_parts, vision_fields
from trainer_core.planner.phases import PHASES, plan_phases
from trainer_core.planner.references import with_references

BUDGETS = (24, 16, 12, 8)
RAM = 32 * GIB


def edit_parts():
    """Qwen-Image's parts with Qwen2.5-VL-7B's vision tower kept (the Edit loader's `vision=True`)."""
    import torch
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    from trainer_core.models.qwen_arch import QWEN25_VL_7B_CONFIG

    with torch.device("meta"):
        encoder = Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(**QWEN25_VL_7B_CONFIG))
    fields = vision_fields(encoder)
    parts = real_parts()
    return dataclasses.replace(parts, text_encoder_params=parts.text_encoder_params + fields["vision_params"], **fields)


def members():
    base = PlanInputs(width=1024, height=1024, rank=32, text_encoder_streamed=None)
    yield "Qwen-Image", real_arch(), real_parts(), base
    yield ("Edit-2511, one control", real_arch(), edit_parts(),
           dataclasses.replace(base, height=2048, vision_sizes=((392, 392),), vae_image=(1024, 1024)))
    yield ("Layered, 4 layers", real_arch(), real_parts(),
           dataclasses.replace(base, height=1024 * 6, vae_image=(1024, 1024)))
    yield ("Layered, 4 layers at 640 x 640", real_arch(), real_parts(),  # its workflow's (and diffusers' example) size
           dataclasses.replace(base, width=640, height=640 * 6, vae_image=(640, 640), preview_width=640,
                               preview_height=640))
    parts21 = real_parts21(lm_head=False)
    base21 = dataclasses.replace(base, storage="int8")
    yield "2.1", real_arch21(), parts21, base21
    yield "2.1, one reference", real_arch21(), parts21, with_references(base21, 1)
    yield "2.1, three references", real_arch21(), parts21, with_references(base21, 3)


def row(name: str, arch, parts, inputs: PlanInputs, gib: int) -> str:
    budget = gib * GIB
    choice = auto_blocks_to_swap(inputs, budget, arch, parts)
    k = choice.blocks_to_swap if choice.fits else arch.num_blocks - 1
    plan = plan_phases(dataclasses.replace(inputs, blocks_to_swap=k), arch, RAM, budget, parts)
    cells = []
    for phase in PHASES[1:]:
        p = plan.phases[phase]
        over = any(s.phase == phase and s.resource == "GPU" for s in plan.shortfalls())
        mark = " (tiles)" if phase == "preview" and "tiles" in p.note else ""
        cells.append(f"{'**' if over else ''}{p.gpu_bytes / GIB:.2f}{'**' if over else ''}{mark}")
    i = plan.inputs
    encoder = "bf16" if i.text_encoder_storage == "bfloat16" else "1 byte"
    encoder += f", {i.text_encoder_streamed} streamed" if i.text_encoder_streamed else ""
    verdict = "every phase fits" if plan.fits else ("does not fit: " + (plan.suggestions[0] if plan.suggestions
                                                                        else "no single change fits"))
    return (f"| {name} | {gib} | {k if choice.fits else 'none fits'} | {encoder} | " + " | ".join(cells)
            + f" | {verdict} |")


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="the first row only (benchmarks/smoke.py: that it runs)")
    smoke = parser.parse_args().smoke
    print("| member | GiB | blocks swapped | text encoder while caching | cache | init | train | preview | save | verdict |")
    print("|---|---:|---:|---|---:|---:|---:|---:|---:|---|")
    for name, arch, parts, inputs in members():
        for gib in BUDGETS[:1] if smoke else BUDGETS:
            print(row(name, arch, parts, inputs, gib))
        if smoke:
            return


if __name__ == "__main__":
    main()
