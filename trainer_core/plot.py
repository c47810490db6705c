"""Loss curve as an image (PIL only): raw loss per step in grey, its moving average in blue."""

from __future__ import annotations

import math

from PIL import Image, ImageDraw


def moving_average(values: list[float], window: int) -> list[float]:
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def loss_plot(history: list[tuple[int, float]], width: int = 768, height: int = 384, title: str = "loss") -> Image.Image:
    """Plot (step, loss) pairs; non-finite losses are skipped. Returns an RGB image."""
    img = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(img)
    points = [(s, v) for s, v in history if math.isfinite(v)]
    left, right, top, bottom = 64, width - 16, 28, height - 36
    draw.rectangle((left, top, right, bottom), outline=(160, 160, 160))
    if not points:
        draw.text((left + 8, top + 8), f"{title}: no steps yet", fill="black")
        return img
    steps = [s for s, _ in points]
    values = [v for _, v in points]
    lo, hi = min(values), max(values)
    if hi - lo < 1e-12:
        lo, hi = lo - 0.5, hi + 0.5
    s0, s1 = steps[0], max(steps[-1], steps[0] + 1)

    def xy(step: float, value: float) -> tuple[float, float]:
        return (left + (step - s0) / (s1 - s0) * (right - left), bottom - (value - lo) / (hi - lo) * (bottom - top))

    for series, colour, line_width in ((values, (180, 180, 180), 1),
                                       (moving_average(values, max(1, len(values) // 20)), (30, 90, 200), 2)):
        coords = [xy(s, v) for s, v in zip(steps, series)]
        if len(coords) == 1:
            x, y = coords[0]
            draw.ellipse((x - 2, y - 2, x + 2, y + 2), fill=colour)
        else:
            draw.line(coords, fill=colour, width=line_width)
    draw.text((left, 8), f"{title}   last {values[-1]:.4f}   min {min(values):.4f}   steps {s0}-{steps[-1]}", fill="black")
    for value in (lo, (lo + hi) / 2, hi):
        draw.text((4, xy(s0, value)[1] - 6), f"{value:.3g}", fill="black")
    draw.text((left, bottom + 8), f"step {s0}", fill="black")
    draw.text((right - 80, bottom + 8), f"step {steps[-1]}", fill="black")
    return img
