"""Coloured shapes on plain backgrounds: the pictures the shipped small model was trained on, the demo's new
concept (a star, which that model never saw), and a measurement that says what a generated picture shows.

A picture is 64x64 px: one shape (circle, square, triangle; star for the demo) of one colour, at one of five
places, on a white or black background. Its caption names all four, e.g.
"a red circle at the top left on a white background".

`measure` reads a picture back without any learned part, from plain shape statistics of the foreground
(the largest 8-connected blob of pixels far from the background colour: specks a sampler leaves elsewhere
would otherwise read as a star's spikes):
- solidity = foreground area / area of its convex hull: ~1 for the convex shapes, ~0.56 for a five-point
  star (inner radius 0.45 of the outer one), so a star is told apart from every trained shape;
- star fit = overlap (intersection over union) of the foreground, holes filled, with the five-point star that
  fits it best (centred on its centroid, any rotation, about its area): 0.93-0.98 for drawn stars, at most 0.70
  for the convex shapes. A concave foreground is a star only where it fits one (STAR_FIT), else a "blob": low
  solidity alone counted irregular blobs with a notch or a spike as stars, which no eye names so
  (benchmarks/README.md);
- extent = foreground area / bounding box area: square 1, circle pi/4 = 0.79, triangle 0.5;
- colour: the palette colour nearest the foreground's mean; place: where the foreground's centroid lies.
The benchmark (benchmarks/shape_concept.py) and the tests count how often a prompt gets what it names.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

SIZE = 64
COLOURS = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 70, 220), "yellow": (235, 200, 30),
           "purple": (150, 60, 200)}
BACKGROUNDS = {"white": (255, 255, 255), "black": (0, 0, 0)}
TRAINED_SHAPES = ("circle", "square", "triangle")
NEW_SHAPE = "star"  # never in the small model's training set: what the demo LoRA teaches
BLOB = "blob"  # what `measure` calls a concave foreground that fits no star
# Place name -> centre as a fraction of the side (x, y).
PLACES = {"in the centre": (0.5, 0.5), "at the top left": (0.28, 0.28), "at the top right": (0.72, 0.28),
          "at the bottom left": (0.28, 0.72), "at the bottom right": (0.72, 0.72)}
STAR_INNER = 0.45  # inner / outer radius of the five-point star


def caption(colour: str, shape: str, place: str, background: str) -> str:
    return f"a {colour} {shape} {place} on a {background} background"


@dataclass(frozen=True)
class Scene:
    colour: str
    shape: str
    place: str
    background: str
    radius: float = 12.0  # half the shape's width, px at SIZE
    dx: float = 0.0  # jitter of the centre, px
    dy: float = 0.0

    @property
    def caption(self) -> str:
        return caption(self.colour, self.shape, self.place, self.background)


def shape_outline(shape: str, cx: float, cy: float, r: float) -> list[tuple[float, float]] | None:
    """Polygon points of `shape` centred at (cx, cy) with half-width r (None for a circle)."""
    if shape == "square":
        return [(cx - r, cy - r), (cx + r, cy - r), (cx + r, cy + r), (cx - r, cy + r)]
    if shape == "triangle":  # pointing up, its base as wide as it is tall
        return [(cx, cy - r), (cx + r, cy + r), (cx - r, cy + r)]
    if shape == "star":
        points = []
        for k in range(10):
            radius = r if k % 2 == 0 else r * STAR_INNER
            angle = -math.pi / 2 + k * math.pi / 5
            points.append((cx + radius * math.cos(angle), cy + radius * math.sin(angle)))
        return points
    if shape == "circle":
        return None
    raise ValueError(f"unknown shape {shape!r}")


def draw(scene: Scene, size: int = SIZE) -> Image.Image:
    """The scene as an RGB picture, drawn at 4x and reduced (smooth edges, as a real photo's)."""
    scale = 4
    big = Image.new("RGB", (size * scale, size * scale), BACKGROUNDS[scene.background])
    pen = ImageDraw.Draw(big)
    fx, fy = PLACES[scene.place]
    cx, cy, r = (fx * size + scene.dx) * scale, (fy * size + scene.dy) * scale, scene.radius * scale
    outline = shape_outline(scene.shape, cx, cy, r)
    if outline is None:
        pen.ellipse((cx - r, cy - r, cx + r, cy + r), fill=COLOURS[scene.colour])
    else:
        pen.polygon(outline, fill=COLOURS[scene.colour])
    return big.resize((size, size), Image.Resampling.BOX)


def random_scene(rng: random.Random, shapes=TRAINED_SHAPES) -> Scene:
    return Scene(colour=rng.choice(list(COLOURS)), shape=rng.choice(list(shapes)), place=rng.choice(list(PLACES)),
                 background=rng.choice(list(BACKGROUNDS)), radius=rng.uniform(10.0, 14.0),
                 dx=rng.uniform(-2.0, 2.0), dy=rng.uniform(-2.0, 2.0))


def all_captions(shapes=TRAINED_SHAPES) -> list[str]:
    return [caption(c, s, p, b) for s in shapes for c in COLOURS for p in PLACES for b in BACKGROUNDS]


# The demo LoRA's dataset: 8 large stars in the centre, every colour, both backgrounds (fixed, so the files never
# change). Large (a radius of 19-21 px, the trained shapes' 10-14): at the trained size and at every place, 200
# steps taught a blob of the right colour and place with hardly a spike; large and centred, a star shows.
STAR_RADIUS = 20.0
STAR_SCENES = (
    Scene("red", "star", "in the centre", "white", 20.0),
    Scene("blue", "star", "in the centre", "white", 19.0),
    Scene("green", "star", "in the centre", "black", 20.0, dx=1.0),
    Scene("yellow", "star", "in the centre", "black", 21.0),
    Scene("purple", "star", "in the centre", "white", 20.0, dy=1.0),
    Scene("red", "star", "in the centre", "black", 19.0, dx=-1.0),
    Scene("blue", "star", "in the centre", "black", 21.0),
    Scene("green", "star", "in the centre", "white", 20.0, dy=-1.0),
)


def regularization_scenes(count: int = 24) -> list[Scene]:
    """Pictures of the shapes the model knows (every shape, colour, place and background in turn, sizes and jitters
    from a fixed seed): a regularisation set for the star LoRA (example_dataset/shapes_regularization)."""
    rng = random.Random(7)
    combos = [(s, c, p, b) for s in TRAINED_SHAPES for c in COLOURS for p in PLACES for b in BACKGROUNDS]
    rng.shuffle(combos)
    return [Scene(c, s, p, b, radius=rng.uniform(10.0, 14.0), dx=rng.uniform(-2.0, 2.0), dy=rng.uniform(-2.0, 2.0))
            for s, c, p, b in combos[:count]]


def write_pictures(scenes, folder: str | Path) -> Path:
    """`scenes` as NN_colour_shape.png with same-name .txt captions in `folder`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for n, scene in enumerate(scenes):
        stem = f"{n:02d}_{scene.colour}_{scene.shape}"
        draw(scene).save(folder / f"{stem}.png")
        (folder / f"{stem}.txt").write_text(scene.caption + "\n")
    return folder


def write_star_dataset(folder: str | Path) -> Path:
    """The demo's 8 star pictures with same-name .txt captions in `folder` (example_dataset/stars holds them too)."""
    return write_pictures(STAR_SCENES, folder)


# The masked-loss demo (example_dataset/stars_on_floor): the demo's stars standing on a yellow floor band that the
# captions never name, as a subject photographed in a cluttered room. Each picture's mask (name_mask.png) is black
# on the floor band and white elsewhere: with masks the LoRA learns the star and the plain background and leaves the
# floor out; without them it learns the floor with them. (A mask white on the star only, grown by FLOOR_MASK_GROW px
# so its anti-aliased edge trains too, was measured as well: it leaves the background untrained.) The floor is the
# palette's yellow: the shapes model's VAE was trained on the palette, and gives a grey band back blue-purple
# (measured: at most 1% of a grey band's pixels within 50 of grey after encoding and decoding, 94-96% of a yellow
# one's within 50 of yellow). The band starts below the largest star (radius 21 + 1 px of jitter ends at row 50).
FLOOR_TOP = 54  # px: the band covers rows 54..63 (at the VAE's 4x: latent rows 13.5..15)
FLOOR_COLOUR = COLOURS["yellow"]
FLOOR_MASK_GROW = 2.0


def draw_on_floor(scene: Scene, size: int = SIZE) -> Image.Image:
    picture = draw(scene, size)
    ImageDraw.Draw(picture).rectangle((0, FLOOR_TOP, size - 1, size - 1), fill=FLOOR_COLOUR)
    return picture


def subject_mask(scene: Scene, size: int = SIZE, grow: float = FLOOR_MASK_GROW) -> Image.Image:
    """A grey ("L") mask of the scene's shape grown by `grow` px: drawn at 4x and reduced, so its edge is grey."""
    scale = 4
    big = Image.new("L", (size * scale, size * scale), 0)
    fx, fy = PLACES[scene.place]
    cx, cy, r = (fx * size + scene.dx) * scale, (fy * size + scene.dy) * scale, (scene.radius + grow) * scale
    outline = shape_outline(scene.shape, cx, cy, r)
    pen = ImageDraw.Draw(big)
    if outline is None:
        pen.ellipse((cx - r, cy - r, cx + r, cy + r), fill=255)
    else:
        pen.polygon(outline, fill=255)
    return big.resize((size, size), Image.Resampling.BOX)


def floor_mask(size: int = SIZE) -> Image.Image:
    """White everywhere but the floor band, black there: the star and its plain background train, the floor not."""
    mask = Image.new("L", (size, size), 255)
    ImageDraw.Draw(mask).rectangle((0, FLOOR_TOP, size - 1, size - 1), fill=0)
    return mask


def write_floor_star_dataset(folder: str | Path, masks: str = "floor") -> Path:
    """The 8 demo stars on the floor band, with captions (the floor unnamed) and masks (NN_colour_star_mask.png), in
    `folder` (example_dataset/stars_on_floor holds them). masks "floor": black on the floor band only (the shipped
    ones); "subject": white on the star only (`subject_mask`; measured too, benchmarks/README.md)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for n, scene in enumerate(STAR_SCENES):
        stem = f"{n:02d}_{scene.colour}_{scene.shape}"
        draw_on_floor(scene).save(folder / f"{stem}.png")
        (floor_mask() if masks == "floor" else subject_mask(scene)).save(folder / f"{stem}_mask.png")
        (folder / f"{stem}.txt").write_text(scene.caption + "\n")
    return folder


def floor_coverage(image: Image.Image) -> float:
    """Share of the floor band's pixels (rows FLOOR_TOP..) that are the floor's yellow (within 50 of it; the other
    palette colours and both backgrounds are over 100 away): ~1 when a picture draws the floor, ~0 where it does
    not."""
    rgb = np.asarray(image.convert("RGB").resize((SIZE, SIZE), Image.Resampling.BOX), dtype=np.float32)[FLOOR_TOP:]
    distance = np.linalg.norm(rgb - np.array(FLOOR_COLOUR, dtype=np.float32), axis=2)  # (H', W)
    return float((distance < 50.0).mean())


def background_share(image: Image.Image, background: str) -> float:
    """Share of the pixels above the floor band and outside the largest demo star (radius 21 + 1 px of jitter,
    grown by 3 px, in the centre) that are the named background (within 100 of it, `measure`'s foreground
    threshold): how much of the plain background a picture of a centred star kept."""
    rgb = np.asarray(image.convert("RGB").resize((SIZE, SIZE), Image.Resampling.BOX), dtype=np.float32)
    star = np.asarray(subject_mask(Scene("red", NEW_SHAPE, "in the centre", background, 22.0), grow=3.0)) > 0
    outside = ~star
    outside[FLOOR_TOP:] = False
    distance = np.linalg.norm(rgb - np.array(BACKGROUNDS[background], dtype=np.float32), axis=2)  # (H, W)
    return float((distance[outside] <= 100.0).mean())


def above_floor(image: Image.Image, background: str) -> Image.Image:
    """`image` with the floor band painted the background: what `measure` reads the subject from."""
    picture = image.convert("RGB").resize((SIZE, SIZE), Image.Resampling.BOX)
    ImageDraw.Draw(picture).rectangle((0, FLOOR_TOP, SIZE - 1, SIZE - 1), fill=BACKGROUNDS[background])
    return picture


# ---------------------------------------------------------------------------------------------------
# measuring a picture


@dataclass(frozen=True)
class Measured:
    shape: str | None  # None: no foreground found
    colour: str | None
    place: str | None
    solidity: float
    extent: float
    star_fit: float = 0.0  # overlap with the best-fitting star (0 where the foreground is convex: not fitted)


def _hull(points: np.ndarray) -> list[tuple[float, float]]:
    """Convex hull (monotone chain) of (N, 2) points, counter-clockwise."""
    pts = sorted(set(map(tuple, points.tolist())))
    if len(pts) < 3:
        return pts

    def half(seq):
        out = []
        for p in seq:
            while len(out) >= 2 and ((out[-1][0] - out[-2][0]) * (p[1] - out[-2][1])
                                     - (out[-1][1] - out[-2][1]) * (p[0] - out[-2][0])) <= 0:
                out.pop()
            out.append(p)
        return out

    lower, upper = half(pts), half(reversed(pts))
    return lower[:-1] + upper[:-1]


def _area(polygon: list[tuple[float, float]]) -> float:
    x = np.array([p[0] for p in polygon])
    y = np.array([p[1] for p in polygon])
    return 0.5 * abs(float(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1))))


def _largest_blob(mask: np.ndarray) -> np.ndarray:
    """The largest 8-connected component of a boolean (H, W) mask; of equal ones, the one that starts first in
    row-major order. Every pixel of the mask starts with its own row-major index as a label, then takes the smallest
    label among its 8 neighbours in the mask, and then the label of the pixel its label names (a jump along the
    chain), until nothing changes: each component ends labelled with the index of its first pixel (a few array
    passes on a 64x64 picture, where a flood fill visits the pixels one by one in Python)."""
    height, width = mask.shape
    none = height * width  # the label of pixels outside the mask, above every index
    labels = np.where(mask, np.arange(none).reshape(height, width), none)  # (H, W)
    padded = np.full((height + 2, width + 2), none)
    while True:
        padded[1:-1, 1:-1] = labels
        smallest = np.minimum.reduce([padded[dy:dy + height, dx:dx + width] for dy in range(3) for dx in range(3)])
        spread = np.where(mask, smallest, none)
        spread = np.append(spread.ravel(), none)[spread]  # a label is a pixel of the same component, of label <= it
        if np.array_equal(spread, labels):
            break
        labels = spread
    ids, counts = np.unique(labels[mask], return_counts=True)  # ids ascending: argmax takes the first of ties
    if not len(ids):
        return np.zeros_like(mask)
    return labels == ids[np.argmax(counts)]


SOLIDITY_CONCAVE = 0.78  # below it a foreground is concave: a star or a blob (the convex shapes measure ~0.9-1)
# The least star fit of a star: drawn stars fit 0.93-0.98, the convex shapes at most 0.70; generated pictures that the
# eye names a star fit 0.75-0.91, irregular blobs with spikes or notches 0.32-0.74 (benchmarks/README.md).
STAR_FIT = 0.75
_FIT_ROTATIONS = 18  # 4 degree steps over the star's 72 degrees of symmetry
_FIT_SCALES = (0.85, 0.9, 0.95, 1.0, 1.05, 1.1, 1.15)  # outer radius x the radius of a star of the foreground's area


def _fill_holes(mask: np.ndarray) -> np.ndarray:
    """`mask` with every background pixel that no 4-connected path links to the picture's border added to it."""
    outside = ~mask
    reach = np.zeros_like(mask)
    for edge in (np.s_[0, :], np.s_[-1, :], np.s_[:, 0], np.s_[:, -1]):
        reach[edge] = outside[edge]
    while True:
        grown = reach.copy()
        grown[1:] |= reach[:-1]
        grown[:-1] |= reach[1:]
        grown[:, 1:] |= reach[:, :-1]
        grown[:, :-1] |= reach[:, 1:]
        grown &= outside
        if np.array_equal(grown, reach):
            return ~reach
        reach = grown


def star_fit(mask: np.ndarray) -> float:
    """Intersection over union of a boolean (H, W) foreground, holes filled (a star drawn with a dark patch inside is
    still a star), with the five-point star (inner radius STAR_INNER of the outer) that overlaps it most: centred on
    the foreground's centroid, turned in 4 degree steps, its outer radius within 15% of a star of the same area.
    Each star is drawn at 4x and reduced, as `draw` draws one, and read at half coverage."""
    mask = _fill_holes(mask)
    height, width = mask.shape
    ys, xs = np.nonzero(mask)
    if not len(xs):
        return 0.0
    cx, cy = xs.mean() + 0.5, ys.mean() + 0.5  # pixel centres
    unit_area = 5 * STAR_INNER * math.sin(math.pi / 5)  # a star of outer radius 1: ten triangles
    radius = math.sqrt(len(xs) / unit_area)
    best, scale = 0.0, 4
    for factor in _FIT_SCALES:
        for turn in range(_FIT_ROTATIONS):
            big = Image.new("L", (width * scale, height * scale), 0)
            points = shape_outline(NEW_SHAPE, cx * scale, cy * scale, radius * factor * scale)
            angle = math.radians(turn * 72.0 / _FIT_ROTATIONS)
            cos, sin = math.cos(angle), math.sin(angle)
            points = [(cx * scale + (x - cx * scale) * cos - (y - cy * scale) * sin,
                       cy * scale + (x - cx * scale) * sin + (y - cy * scale) * cos) for x, y in points]
            ImageDraw.Draw(big).polygon(points, fill=255)
            star = np.asarray(big.resize((width, height), Image.Resampling.BOX)) >= 128
            best = max(best, float((star & mask).sum() / max((star | mask).sum(), 1)))
    return best


def measure(image: Image.Image, background: str) -> Measured:
    """What `image` shows on the named `background` (see the module docstring)."""
    rgb = np.asarray(image.convert("RGB").resize((SIZE, SIZE), Image.Resampling.BOX), dtype=np.float32)  # (H, W, 3)
    distance = np.linalg.norm(rgb - np.array(BACKGROUNDS[background], dtype=np.float32), axis=2)  # (H, W)
    mask = _largest_blob(distance > 100.0)  # every palette colour is > 180 away from both backgrounds
    area = int(mask.sum())
    if area < 12:
        return Measured(None, None, None, 0.0, 0.0)
    ys, xs = np.nonzero(mask)
    # Each foreground pixel is a unit square: its four corners span the hull and the bounding box. Only each row's
    # leftmost and rightmost pixels can give a hull corner (the rest lie between them), so the hull takes those.
    rows = np.unique(ys)
    left = np.array([xs[ys == y].min() for y in rows])
    right = np.array([xs[ys == y].max() for y in rows]) + 1
    corners = np.concatenate([np.stack([x, rows + b], 1) for x in (left, right) for b in (0, 1)])
    solidity = area / max(_area(_hull(corners)), 1.0)
    extent = area / float((xs.max() + 1 - xs.min()) * (ys.max() + 1 - ys.min()))
    fit = 0.0
    if solidity < SOLIDITY_CONCAVE:
        fit = star_fit(mask)
        shape = NEW_SHAPE if fit >= STAR_FIT else BLOB
    elif extent >= 0.9:
        shape = "square"
    elif extent >= 0.66:
        shape = "circle"
    else:
        shape = "triangle"
    mean = rgb[mask].mean(0)
    colour = min(COLOURS, key=lambda c: float(np.sum((mean - np.array(COLOURS[c])) ** 2)))
    cx, cy = xs.mean() / SIZE, ys.mean() / SIZE
    place = min(PLACES, key=lambda p: (PLACES[p][0] - cx) ** 2 + (PLACES[p][1] - cy) ** 2)
    return Measured(shape, colour, place, float(solidity), float(extent), float(fit))
