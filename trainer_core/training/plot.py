"""Loss curve as an image (PIL only): raw loss per step in grey, its moving average in blue, and the
validation loss (when measured) in orange, with a legend; with several datasets, each one's mean loss; with live
previews, how far each moved from the untrained one (purple) and from the previous one (green), on a second axis at
the right (0 to the largest, on the 0-1 scale of `live.image_difference`)."""

from __future__ import annotations

import math

from PIL import Image, ImageDraw

RAW, SMOOTH, VALIDATION = (180, 180, 180), (30, 90, 200), (230, 120, 20)
FROM_UNTRAINED, FROM_PREVIOUS = (150, 60, 190), (40, 160, 70)  # the previews' movement (second axis)


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
              datasets: list[tuple[int, dict[str, float]]] = (),
              previews: list[tuple[int, float | None, float | None]] = ()) -> Image.Image:
    """Plot (step, loss) pairs and, on the same axes, (step, validation loss) pairs; non-finite values are
    skipped. `datasets`: (step, {dataset: its mean loss}) pairs (the trainer's dataset_loss_history): each
    dataset's mean over the steps shown is written under the heading. `previews`: (step, moved from the untrained
    preview, moved from the previous one) (the trainer's preview_history), on the right axis. Returns an RGB image."""
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
    moved = [(s, a, b) for s, a, b in previews if s >= steps[0]]
    s0, s1 = steps[0], max(steps[-1], steps[0] + 1, *(s for s, _ in checks), *(s for s, _, _ in moved))

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
    legend_moved = _draw_movement(draw, moved, s0, s1, (left, right, top, bottom))
    heading = f"{title}   last {values[-1]:.4f}   min {min(values):.4f}   steps {s0}-{steps[-1]}"
    if checks:
        heading += f"   validation {checks[-1][1]:.4f}"
    draw.text((left, 8), heading, fill="black")
    means = dataset_means(datasets, s0)
    if means:
        draw.text((left + 6, top + 4), "per dataset: " + ", ".join(f"{k} {v:.4f}" for k, v in means.items()),
                  fill="black")
    legend = [("training loss", RAW), ("smoothed", SMOOTH)] + ([("validation loss", VALIDATION)] if checks else [])
    for row, entries in enumerate((legend, legend_moved)):  # top right, inside the plot; the previews' a row below
        x, y = right - 8 - 130 * len(entries), top + 2 + 22 * row
        if entries:
            draw.rectangle((x - 4, y, right - 2, y + 20), fill="white")  # over the curves it may cover
        for label, colour in entries:
            draw.line((x, y + 10, x + 16, y + 10), fill=colour, width=3)
            draw.text((x + 20, y + 4), label, fill="black")
            x += 130
    for value in (lo, (lo + hi) / 2, hi):
        draw.text((4, xy(s0, value)[1] - 6), f"{value:.3g}", fill="black")
    draw.text((left, bottom + 8), f"step {s0}", fill="black")
    draw.text((right - 80, bottom + 8), f"step {steps[-1]}", fill="black")
    return img


def _draw_movement(draw: ImageDraw.ImageDraw, moved: list[tuple[int, float | None, float | None]], s0: int, s1: int,
                   box: tuple[int, int, int, int]) -> list[tuple[str, tuple[int, int, int]]]:
    """The previews' movement on a right-hand axis from 0 to its largest value, each preview a marked point; returns
    the legend entries of what was drawn."""
    left, right, top, bottom = box
    series = [(label, colour, [(s, v[i]) for s, *v in moved if v[i] is not None and math.isfinite(v[i])])
              for i, (label, colour) in enumerate((("moved vs untrained", FROM_UNTRAINED),
                                                   ("moved vs previous", FROM_PREVIOUS)))]
    series = [(label, colour, points) for label, colour, points in series if points]
    if not series:
        return []
    hi = max(v for _, _, points in series for _, v in points) or 1.0

    def xy(step: float, value: float) -> tuple[float, float]:
        return left + (step - s0) / (s1 - s0) * (right - left), bottom - value / hi * (bottom - top)

    for _, colour, points in series:
        coords = [xy(s, v) for s, v in points]
        if len(coords) > 1:
            draw.line(coords, fill=colour, width=2)
        for x, y in coords:
            draw.ellipse((x - 3, y - 3, x + 3, y + 3), fill=colour)
    for value in (0.0, hi / 2, hi):
        draw.text((right + 2 - 40, xy(s0, value)[1] - 6), f"{value:.2f}", fill=FROM_UNTRAINED)
    return [(label, colour) for label, colour, _ in series]


def dataset_means(datasets: list[tuple[int, dict[str, float]]], first_step: int = 0) -> dict[str, float]:
    """Each dataset's mean loss over the steps from `first_step` on (finite values only)."""
    sums: dict[str, list[float]] = {}
    for step, losses in datasets:
        for label, value in losses.items():
            if step >= first_step and math.isfinite(value):
                sums.setdefault(label, []).append(value)
    return {label: sum(v) / len(v) for label, v in sums.items()}
