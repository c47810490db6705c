"""Loss curve as an image (PIL only): raw loss per step in grey, its moving average in blue, and the
validation loss (when measured) in orange, with a legend; with several datasets, each one's mean loss."""

from __future__ import annotations

import math

from PIL import Image, ImageDraw

RAW, SMOOTH, VALIDATION = (180, 180, 180), (30, 90, 200), (230, 120, 20)


def moving_average(values: list[float], window: int) -> list[float]:
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def loss_plot(history: list[tuple[int, float]], width: int = 768, height: int = 384, title: str = "loss",
              validation: list[tuple[int, float]] = (),
              datasets: list[tuple[int, dict[str, float]]] = ()) -> Image.Image:
    """Plot (step, loss) pairs and, on the same axes, (step, validation loss) pairs; non-finite values are
    skipped. `datasets`: (step, {dataset: its mean loss}) pairs (the trainer's dataset_loss_history): each
    dataset's mean over the steps shown is written under the heading. Returns an RGB image."""
    img = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(img)
    points = [(s, v) for s, v in history if math.isfinite(v)]
    checks = [(s, v) for s, v in validation if math.isfinite(v)]
    left, right, top, bottom = 64, width - 16, 28, height - 36
    draw.rectangle((left, top, right, bottom), outline=(160, 160, 160))
    if not points:
        draw.text((left + 8, top + 8), f"{title}: no steps yet", fill="black")
        return img
    steps = [s for s, _ in points]
    values = [v for _, v in points]
    lo, hi = min(values + [v for _, v in checks]), max(values + [v for _, v in checks])
    if hi - lo < 1e-12:
        lo, hi = lo - 0.5, hi + 0.5
    s0, s1 = steps[0], max(steps[-1], steps[0] + 1, *(s for s, _ in checks))

    def xy(step: float, value: float) -> tuple[float, float]:
        return (left + (step - s0) / (s1 - s0) * (right - left), bottom - (value - lo) / (hi - lo) * (bottom - top))

    series = [(steps, values, RAW, 1),
              (steps, moving_average(values, max(1, len(values) // 20)), SMOOTH, 2)]
    if checks:
        series.append(([s for s, _ in checks], [v for _, v in checks], VALIDATION, 2))
    for xs, ys, colour, line_width in series:
        coords = [xy(s, v) for s, v in zip(xs, ys)]
        if len(coords) == 1:
            x, y = coords[0]
            draw.ellipse((x - 2, y - 2, x + 2, y + 2), fill=colour)
        else:
            draw.line(coords, fill=colour, width=line_width)
        if colour == VALIDATION:
            for x, y in coords:  # each measurement is a point: mark it
                draw.ellipse((x - 2, y - 2, x + 2, y + 2), fill=colour)
    heading = f"{title}   last {values[-1]:.4f}   min {min(values):.4f}   steps {s0}-{steps[-1]}"
    if checks:
        heading += f"   validation {checks[-1][1]:.4f}"
    draw.text((left, 8), heading, fill="black")
    means = dataset_means(datasets, s0)
    if means:
        draw.text((left + 6, top + 4), "per dataset: " + ", ".join(f"{k} {v:.4f}" for k, v in means.items()),
                  fill="black")
    legend = [("training loss", RAW), ("smoothed", SMOOTH)] + ([("validation loss", VALIDATION)] if checks else [])
    x = right - 8 - 110 * len(legend)
    draw.rectangle((x - 4, top + 2, right - 2, top + 22), fill="white")  # over the curves it may cover
    for label, colour in legend:  # top right, inside the plot
        draw.line((x, top + 12, x + 16, top + 12), fill=colour, width=3)
        draw.text((x + 20, top + 6), label, fill="black")
        x += 110
    for value in (lo, (lo + hi) / 2, hi):
        draw.text((4, xy(s0, value)[1] - 6), f"{value:.3g}", fill="black")
    draw.text((left, bottom + 8), f"step {s0}", fill="black")
    draw.text((right - 80, bottom + 8), f"step {steps[-1]}", fill="black")
    return img


def dataset_means(datasets: list[tuple[int, dict[str, float]]], first_step: int = 0) -> dict[str, float]:
    """Each dataset's mean loss over the steps from `first_step` on (finite values only)."""
    sums: dict[str, list[float]] = {}
    for step, losses in datasets:
        for label, value in losses.items():
            if step >= first_step and math.isfinite(value):
                sums.setdefault(label, []).append(value)
    return {label: sum(v) / len(v) for label, v in sums.items()}
