"""The demo model's world: colours, shapes, positions, captions and the image renderer (numpy only).

Every image is 64x64 RGB: one shape (circle, square, triangle, star, ring or stripes) in a named colour,
on a plain background of another named colour, centred in one of the nine cells of a 3x3 grid
("top left" ... "bottom right", "center"), small or large. The renderer supersamples 4x so edges are
anti-aliased. Nothing here is random unless a ``numpy.random.Generator`` is passed in.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SIZE = 64
SUPERSAMPLE = 4

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "orange": (245, 140, 20),
    "yellow": (240, 220, 40),
    "green": (40, 170, 60),
    "blue": (40, 80, 220),
    "purple": (140, 60, 190),
    "white": (240, 240, 240),
    "black": (20, 20, 20),
}
SHAPES = ("circle", "square", "triangle", "star", "ring", "stripes")
#: position phrase -> (column, row) in the 3x3 grid
POSITIONS: dict[str, tuple[int, int]] = {
    "top left": (0, 0), "top": (1, 0), "top right": (2, 0),
    "left": (0, 1), "center": (1, 1), "right": (2, 1),
    "bottom left": (0, 2), "bottom": (1, 2), "bottom right": (2, 2),
}
CELL_CENTRES = (14.0, 32.0, 50.0)
RADII = {"small": 8.0, "large": 11.0}
#: words of every caption, for the tokenizer's vocabulary subset
CAPTION_WORDS = sorted({*COLOURS, *SHAPES, *(w for p in POSITIONS for w in p.split()), *RADII,
                        "a", "an", "on", "background", ","})
HELD_OUT = 40


@dataclass(frozen=True)
class Scene:
    colour: str
    shape: str
    background: str
    position: str

    def caption(self, size: str | None = None, template: int = 0) -> str:
        """The caption; template 0 is the canonical one the tests use."""
        words = f"{size} {self.colour}" if size else self.colour
        article = "an" if words[0] in "aeiou" else "a"
        subject = f"{words} stripes" if self.shape == "stripes" else f"{article} {words} {self.shape}"
        if template == 0:
            return f"{subject} on a {self.background} background, {self.position}"
        if template == 1:
            return f"{subject} on {self.background}, {self.position}"
        if template == 2:
            return f"{subject} on a {self.background} background"
        return f"{subject} on {self.background}"


def all_scenes() -> list[Scene]:
    return [Scene(c, s, b, p) for c in COLOURS for b in COLOURS if b != c for s in SHAPES for p in POSITIONS]


def split_scenes(seed: int = 15) -> tuple[list[Scene], list[Scene]]:
    """(train, held-out): HELD_OUT combinations never shown in training, spread over shapes and positions."""
    scenes = all_scenes()
    rng = np.random.default_rng(seed)
    held: list[Scene] = []
    order = rng.permutation(len(scenes))
    used_shape_pos: dict[tuple[str, str], int] = {}
    for i in order:
        s = scenes[i]
        key = (s.shape, s.position)
        if used_shape_pos.get(key, 0) >= 1:
            continue
        used_shape_pos[key] = used_shape_pos.get(key, 0) + 1
        held.append(s)
        if len(held) == HELD_OUT:
            break
    held_set = set(held)
    return [s for s in scenes if s not in held_set], held


def _grid() -> tuple[np.ndarray, np.ndarray]:
    n = SIZE * SUPERSAMPLE
    c = (np.arange(n, dtype=np.float32) + 0.5) / SUPERSAMPLE
    return np.meshgrid(c, c)  # xx, yy in pixel units


_XX, _YY = _grid()


def shape_mask(shape: str, cx: float, cy: float, r: float) -> np.ndarray:
    """Boolean supersampled mask of one shape."""
    dx, dy = _XX - cx, _YY - cy
    if shape == "circle":
        return dx * dx + dy * dy <= r * r
    if shape == "ring":
        d2 = dx * dx + dy * dy
        return (d2 <= r * r) & (d2 >= (0.55 * r) ** 2)
    if shape == "square":
        h = 0.85 * r
        return (np.abs(dx) <= h) & (np.abs(dy) <= h)
    if shape == "triangle":  # apex up, base at +0.8r
        inside_base = dy <= 0.8 * r
        slope = np.abs(dx) <= (dy + r) * (1.0 / 1.8)
        return inside_base & slope & (dy >= -r)
    if shape == "star":  # five points, inner radius 0.45 r
        ri = 0.45 * r
        theta = np.arctan2(dx, -dy)
        phi = np.mod(theta, 2 * np.pi / 5)
        phi = np.where(phi > np.pi / 5, 2 * np.pi / 5 - phi, phi)
        s36 = np.sin(np.pi / 5)
        rb = r * ri * s36 / (r * np.sin(phi) + ri * np.sin(np.pi / 5 - phi))
        return np.sqrt(dx * dx + dy * dy) <= rb
    if shape == "stripes":  # three horizontal bars filling a square patch
        inside = (np.abs(dx) <= r) & (np.abs(dy) <= r)
        band = np.floor((dy + r) / (2 * r / 5)).astype(np.int64)
        return inside & (band % 2 == 0)
    raise ValueError(f"unknown shape {shape!r}")


def render(scene: Scene, size: str = "large", jitter: tuple[float, float] = (0.0, 0.0)) -> np.ndarray:
    """64x64x3 uint8 image of a scene."""
    col, row = POSITIONS[scene.position]
    cx, cy = CELL_CENTRES[col] + jitter[0], CELL_CENTRES[row] + jitter[1]
    mask = shape_mask(scene.shape, cx, cy, RADII[size]).astype(np.float32)
    cover = mask.reshape(SIZE, SUPERSAMPLE, SIZE, SUPERSAMPLE).mean(axis=(1, 3))[..., None]
    fg = np.array(COLOURS[scene.colour], np.float32)
    bg = np.array(COLOURS[scene.background], np.float32)
    return np.rint(cover * fg + (1 - cover) * bg).astype(np.uint8)


def random_render(scene: Scene, rng: np.random.Generator) -> tuple[np.ndarray, str]:
    """A random size and jitter of a scene, and the size word."""
    size = "small" if rng.random() < 0.5 else "large"
    jitter = (float(rng.uniform(-3, 3)), float(rng.uniform(-3, 3)))
    return render(scene, size, jitter), size


#: how often each caption template is drawn: the position is named in 85% of the captions (templates 0, 1)
TEMPLATE_P = (0.45, 0.4, 0.075, 0.075)


def random_caption(scene: Scene, size: str, rng: np.random.Generator) -> str:
    """One of four caption templates (TEMPLATE_P), the size word in 30% of them."""
    template = int(rng.choice(4, p=TEMPLATE_P))
    return scene.caption(size if rng.random() < 0.3 else None, template)
