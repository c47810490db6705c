"""Writes docs/icon.png, the pack's icon in the Comfy registry (pyproject.toml's [tool.comfy] Icon points at it):
the first-run workflow's star as the shapes model's pictures draw it (trainer_core/devtools/shapes.py), 400x400,
a 16-colour palette PNG (a few KB).

    .venv/bin/python tools/make_icon.py
"""

import sys
from pathlib import Path

from PIL import Image

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from trainer_core.devtools.shapes import Scene, draw  # noqa: E402

SIDE = 400
OUT = REPO / "docs" / "icon.png"


def main() -> None:
    star = draw(Scene("purple", "star", "in the centre", "white", radius=0.44 * SIDE, dy=0.03 * SIDE), SIDE)
    star.quantize(16, method=Image.Quantize.MEDIANCUT).save(OUT, optimize=True)
    print(f"{OUT.relative_to(REPO)}: {OUT.stat().st_size} bytes")


if __name__ == "__main__":
    main()
