"""Rendering of the demo clips: the class pairs, the law of a clip (:func:`sample_clip`) and its
frames (:func:`render_clip`); pure numpy, a clip is a pure function of its generator's state.

See :mod:`tsm_ds.data.synthetic` for the design (time-reversal pairs, no label information in a
single frame).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["CLASS_PAIRS", "ALL_CLASSES", "DEFAULT_CLASSES", "sample_clip", "render_clip"]

# pair name -> (forward class, the same clip played backwards)
CLASS_PAIRS: dict[str, tuple[str, str]] = {
    "horizontal": ("moving_right", "moving_left"),
    "vertical": ("moving_down", "moving_up"),
    "scale": ("growing", "shrinking"),
    "rotation": ("rotating_cw", "rotating_ccw"),
    "visibility": ("appearing", "vanishing"),
}
ALL_CLASSES: tuple[str, ...] = tuple(c for pair in CLASS_PAIRS.values() for c in pair)
DEFAULT_CLASSES: tuple[str, ...] = ("moving_left", "moving_right", "moving_up", "moving_down")
_CLASS_TO_PAIR: dict[str, tuple[int, str, bool]] = {
    cls: (i, pair, k == 1)
    for i, (pair, members) in enumerate(CLASS_PAIRS.items()) for k, cls in enumerate(members)
}
_SHAPES = ("square", "circle", "triangle", "diamond", "cross")
_ROTATION_SHAPES = ("square", "triangle", "cross")  # no circle: its rotation is invisible
_FORMAT_VERSION = 2  # 2: colours by brightness contrast + tint (1: any RGB difference)


# --------------------------------------------------------------------------------------------
# rendering


def _sdf(shape: str, u: np.ndarray, v: np.ndarray, r: float) -> np.ndarray:
    """Signed distance in pixels from local coordinates (u, v) to a shape of size r (< 0 inside)."""
    if shape == "circle":
        return np.hypot(u, v) - r
    if shape == "diamond":
        return (np.abs(u) + np.abs(v) - r) / math.sqrt(2.0)
    if shape == "square":
        return _box(u, v, r, r)
    if shape == "cross":
        return np.minimum(_box(u, v, r, r / 3.0), _box(u, v, r / 3.0, r))
    if shape == "triangle":  # equilateral, circumradius-like size r (Quilez's exact SDF)
        k = math.sqrt(3.0)
        px = np.abs(u) - r
        py = v + r / k
        flip = px + k * py > 0
        px, py = np.where(flip, (px - k * py) / 2, px), np.where(flip, (-k * px - py) / 2, py)
        px = px - np.clip(px, -2 * r, 0)
        return -np.hypot(px, py) * np.sign(py)
    raise ValueError(f"unknown shape {shape!r}; expected one of {_SHAPES}")


def _box(u: np.ndarray, v: np.ndarray, hu: float, hv: float) -> np.ndarray:
    qx, qy = np.abs(u) - hu, np.abs(v) - hv
    outside = np.hypot(np.maximum(qx, 0), np.maximum(qy, 0))
    return outside + np.minimum(np.maximum(qx, qy), 0)


def _coverage(shape: str, size: int, cx: float, cy: float, r: float, angle: float) -> np.ndarray:
    """Anti-aliased coverage in [0, 1], float32 (size, size), of a shape centred at (cx, cy) px."""
    grid = np.arange(size, dtype=np.float64) + 0.5  # pixel centres
    dx, dy = grid[None, :] - cx, grid[:, None] - cy
    c, s = math.cos(angle), math.sin(angle)
    u, v = c * dx + s * dy, -s * dx + c * dy
    return np.clip(0.5 - _sdf(shape, u, v, r), 0.0, 1.0).astype(np.float32)


def _tinted(rng: np.random.Generator, luma: float, tint: float) -> np.ndarray:
    """An RGB colour in [0, 1] whose channel mean is ``luma`` plus a zero-mean random tint."""
    chroma = rng.uniform(-tint, tint, 3)
    return np.clip(luma + chroma - chroma.mean(), 0.0, 1.0)


def _object_colour(rng: np.random.Generator, against: np.ndarray, contrast: float,
                   tint: float) -> np.ndarray:
    """A random colour whose brightness (channel mean) differs from ``against``'s by >= ``contrast``.

    Darker or brighter than the background, with probability proportional to the room on each
    side. Why brightness and not any colour difference: with independent random RGB colours an
    object and its background often differ in hue but hardly in brightness; a network trained
    from scratch then first has to discover the colour axes that carry each clip's edges, and
    TSM sat at chance for the whole CPU budget (loss ln 4 over 600 steps). Measured in-process
    (ResNet-18, 64 px, batch 16, AdamW 1e-3): brightness contrast >= 0.4 with tints up to 0.25
    reached 97-100 % validation top-1 within 100-200 steps; the former law (mean absolute RGB
    difference >= 0.3 with a uniformly random background colour) stayed at 25 % after 300.
    """
    luma = float(np.mean(against))
    # room on the two sides: lo + (1 - hi) >= 1 - 2 * contrast > 0 (contrast < 0.5 is checked)
    lo, hi = max(0.0, luma - contrast), min(1.0, luma + contrast)
    target = rng.uniform(0.0, lo) if rng.uniform(0.0, lo + 1.0 - hi) < lo else rng.uniform(hi, 1.0)
    colour = _tinted(rng, target, tint)
    # clipping a tint can pull the brightness back towards the background: keep the contrast
    if abs(float(colour.mean()) - luma) < contrast:
        colour = np.full(3, target)
    return colour


@dataclass(frozen=True)
class _Params:
    size: int
    num_frames: int
    speed: tuple[float, float]
    radius: tuple[float, float]
    noise: tuple[float, float]


def _background_spec(rng: np.random.Generator, clutter: float, tint: float) -> dict:
    c0 = _tinted(rng, rng.uniform(0.1, 0.9), tint)
    c1 = np.clip(c0 + clutter * rng.uniform(-0.3, 0.3, 3), 0.0, 1.0)
    blobs = [[*rng.uniform(0, 1, 2), rng.uniform(0.1, 0.25), *(clutter * rng.uniform(-0.2, 0.2, 3))]
             for _ in range(3)]
    return {"c0": c0.tolist(), "c1": c1.tolist(), "phi": float(rng.uniform(0, 2 * math.pi)),
            "blobs": np.asarray(blobs).tolist(), "texture": float(clutter * rng.uniform(0.0, 0.04)),
            "texture_seed": int(rng.integers(2 ** 63))}


def _render_background(bg: dict, size: int) -> np.ndarray:
    """Static background, float (size, size, 3) in [0, 1]: gradient + soft blobs + fine texture."""
    grid = np.arange(size, dtype=np.float64) + 0.5
    x, y = grid[None, :], grid[:, None]
    c0, c1, phi = np.asarray(bg["c0"]), np.asarray(bg["c1"]), bg["phi"]
    ramp = np.clip(((x - size / 2) * math.cos(phi) + (y - size / 2) * math.sin(phi)) / size + 0.5, 0, 1)
    img = c0 + (c1 - c0) * ramp[..., None]
    for bx, by, sigma, *amp in bg["blobs"]:
        bx, by, sigma = bx * size, by * size, sigma * size
        img = img + np.asarray(amp) * np.exp(-((x - bx) ** 2 + (y - by) ** 2) / (2 * sigma ** 2))[..., None]
    img = img + np.random.default_rng(bg["texture_seed"]).normal(0.0, bg["texture"], (size, size, 3))
    return np.clip(img, 0.0, 1.0)


def _moving_track(rng: np.random.Generator, size: int, num_frames: int,
                  speed: tuple[float, float], r: float) -> tuple[np.ndarray, float, float]:
    """Forward (increasing coordinate) track: (moving coordinate per frame, still coordinate, speed)."""
    T, W = num_frames, size
    t = np.arange(T) - (T - 1) / 2
    v = rng.uniform(*speed)
    half = v * (T - 1) / 2
    mid = rng.uniform(r + half, W - r - half)  # midpoint uniform: the track never leaves the frame
    # the still coordinate has the law of the moving one pooled over frames (an independent track
    # of the same law, seen at a uniformly drawn frame), so that a single frame of a horizontal
    # and of a vertical mover cannot be told apart either
    v2 = rng.uniform(*speed)
    half2 = v2 * (T - 1) / 2
    still = rng.uniform(r + half2, W - r - half2) + v2 * t[rng.integers(T)]
    return mid + v * t, float(still), float(v)


def sample_clip(pair: str, rng: np.random.Generator, *, size: int = 64, num_frames: int = 8,
                speed: tuple[float, float] = (3.0, 5.0), radius: tuple[float, float] = (8.0, 12.0),
                noise: tuple[float, float] = (0.01, 0.05), distractor_prob: float = 0.0, clutter: float = 0.5,
                contrast: float = 0.4, tint: float = 0.25) -> dict:
    """Draw everything about one clip of a class pair, in the pair's forward direction.

    The law is the same for every pair except for what the pair is about (the object's
    trajectory, size, angle or opacity over time); nothing here depends on the class within the
    pair: the second class is the same clip played backwards (``render_clip(spec, reverse=True)``).

    Args:
        pair: a key of ``CLASS_PAIRS`` ("horizontal", "vertical", "scale", "rotation", "visibility").
        rng: the clip's generator; the spec is a pure function of its state.
        size: frame height = width in pixels (even, >= 24).
        num_frames: T, frames in the clip (>= 2).
        speed: (low, high) object speed in pixels per frame for the moving pairs, drawn uniformly.
        radius: (low, high) object size in pixels (half side / radius) for moving, rotating and
            appearing objects and the distractor; growing objects go from radius[0] * U(0.5, 1)
            to radius[1] * U(1, 1.5).
        noise: (low, high) standard deviation of i.i.d. per-pixel, per-frame Gaussian noise, in
            units of the intensity range [0, 1].
        distractor_prob: probability of a second, static shape in the clip.
        clutter: background structure in [0, 1]: 0 is a flat random colour; 1 adds a colour
            gradient (up to +-0.3 per channel), three soft blobs (+-0.2) and static texture noise
            (sigma up to 0.04); in between scales all three.
        contrast: minimum difference in brightness (RGB channel mean, intensity units in [0, 1])
            between the object (and distractor) and the background's mean colour, either sign;
            in [0, 0.5). The background's brightness is uniform in [0.1, 0.9].
        tint: colours are a brightness plus a zero-mean random RGB tint of up to +-``tint`` per
            channel (0: grey levels only), for the background and the objects.

    Returns:
        A JSON-serialisable dict. Per frame, in forward order (lists of length T): ``centre``
        [[x, y]] in pixels (origin at the image's top-left corner, x right, y down),
        ``radius`` in pixels, ``angle`` in degrees (clockwise on screen), ``alpha`` opacity in
        [0, 1]. Per clip: ``pair``, ``shape``, ``colour`` RGB in [0, 1], ``speed`` (px/frame for
        movers, deg/frame for rotation, else 0), ``background`` parameters, ``distractor``
        (None or its shape, colour, centre, radius, angle), ``noise`` sigma and ``noise_seed``,
        ``size``, ``num_frames``.

    Raises:
        ValueError: unknown pair, or sizes/speeds that cannot keep the object inside the frame.
    """
    if pair not in CLASS_PAIRS:
        raise ValueError(f"unknown class pair {pair!r}; expected one of {sorted(CLASS_PAIRS)}")
    _check_params(_Params(size, num_frames, tuple(speed), tuple(radius), tuple(noise)), contrast, tint)
    T, W = num_frames, size
    bg = _background_spec(rng, clutter, tint)
    bg_mean = (np.asarray(bg["c0"]) + np.asarray(bg["c1"])) / 2
    shape = str(rng.choice(_ROTATION_SHAPES if pair == "rotation" else _SHAPES))
    colour = _object_colour(rng, bg_mean, contrast, tint)
    r = float(rng.uniform(*radius))
    alpha = np.ones(T)
    angle = np.full(T, rng.uniform(0, 360.0))
    radii = np.full(T, r)
    rate = 0.0
    if pair in ("horizontal", "vertical"):
        moving, still, rate = _moving_track(rng, W, T, speed, r)
        cx, cy = (moving, np.full(T, still)) if pair == "horizontal" else (np.full(T, still), moving)
    else:
        reach = r
        if pair == "scale":
            r0, r1 = rng.uniform(radius[0] * 0.5, radius[0]), rng.uniform(radius[1], radius[1] * 1.5)
            radii = np.linspace(r0, r1, T)
            reach = r1
        reach *= math.sqrt(2.0)  # a rotated square/cross/triangle stays within r * sqrt(2)
        cx = np.full(T, rng.uniform(reach, W - reach))
        cy = np.full(T, rng.uniform(reach, W - reach))
        if pair == "rotation":
            rate = float(rng.uniform(5.0, 12.0))  # deg/frame: < 45 deg even at a 3-frame stride
            angle = angle + rate * np.arange(T)
        elif pair == "visibility":
            ramp = rng.uniform(0.3, 0.6) * (T - 1)
            start = rng.uniform(0, T - 1 - ramp)
            alpha = np.clip((np.arange(T) - start) / ramp, 0.0, 1.0)
    distractor = None
    if rng.uniform() < distractor_prob:  # a static shape elsewhere: the moving object is not the only object
        d_r = float(rng.uniform(*radius))
        d_reach = d_r * math.sqrt(2.0)
        distractor = {"shape": str(rng.choice(_SHAPES)), "radius": d_r,
                      "centre": rng.uniform(d_reach, W - d_reach, 2).tolist(),
                      "angle": float(rng.uniform(0, 360)),
                      "colour": _object_colour(rng, bg_mean, contrast, tint).tolist()}
    return {
        "pair": pair, "size": W, "num_frames": T, "shape": shape, "colour": colour.tolist(),
        "speed": float(rate), "centre": np.stack([cx, cy], 1).tolist(), "radius": radii.tolist(),
        "angle": (angle % 360.0).tolist(), "alpha": alpha.tolist(), "background": bg,
        "distractor": distractor, "noise": float(rng.uniform(*noise)),
        "noise_seed": int(rng.integers(2 ** 63)),
    }


def render_clip(spec: dict, *, reverse: bool = False) -> np.ndarray:
    """Render a clip drawn by ``sample_clip``: the pair's first class, or played backwards.

    Args:
        spec: a dict from ``sample_clip`` (forward order).
        reverse: False renders the pair's first class (moving_right, moving_down, growing,
            rotating_cw, appearing); True returns the same frames in reverse order (the second
            class: moving_left, moving_up, shrinking, rotating_ccw, vanishing), noise included.

    Returns:
        uint8 (T, H, W, 3) RGB frames, T = spec["num_frames"], H = W = spec["size"]; a pure
        function of ``spec``.

    Raises:
        KeyError: ``spec`` lacks a field that ``sample_clip`` writes.
    """
    W, T = spec["size"], spec["num_frames"]
    bg = _render_background(spec["background"], W)
    d = spec["distractor"]
    if d is not None:
        cov = _coverage(d["shape"], W, d["centre"][0], d["centre"][1], d["radius"],
                        math.radians(d["angle"]))[..., None]
        bg = bg * (1 - cov) + np.asarray(d["colour"]) * cov
    colour = np.asarray(spec["colour"])
    noise = np.random.default_rng(spec["noise_seed"])
    frames = np.empty((T, W, W, 3), np.uint8)
    for t in range(T):
        (cx, cy), r = spec["centre"][t], spec["radius"][t]
        cov = _coverage(spec["shape"], W, cx, cy, r, math.radians(spec["angle"][t]))[..., None]
        cov = cov * spec["alpha"][t]
        img = bg * (1 - cov) + colour * cov + noise.normal(0.0, spec["noise"], (W, W, 3))
        frames[t] = np.clip(np.rint(img * 255.0), 0, 255).astype(np.uint8)
    return frames[::-1].copy() if reverse else frames


def _check_params(p: _Params, contrast: float, tint: float) -> None:
    if not 0 <= contrast < 0.5:
        raise ValueError(f"contrast must be in [0, 0.5) (brightness difference, intensity units), "
                         f"got {contrast}")
    if not 0 <= tint <= 0.5:
        raise ValueError(f"tint must be in [0, 0.5] (intensity units per channel), got {tint}")
    if p.size < 24 or p.size % 2:
        raise ValueError(f"size must be even and >= 24 pixels (H.264 4:2:0), got {p.size}")
    if p.num_frames < 2:
        raise ValueError(f"num_frames must be >= 2, got {p.num_frames}")
    for name, (lo, hi) in (("speed", p.speed), ("radius", p.radius), ("noise", p.noise)):
        if not 0 <= lo <= hi:
            raise ValueError(f"{name} must be (low, high) with 0 <= low <= high, got {(lo, hi)}")
    travel = p.speed[1] * (p.num_frames - 1)
    if 2 * p.radius[1] + travel > p.size or 3 * p.radius[1] * math.sqrt(2.0) > p.size:
        raise ValueError(
            f"objects of radius up to {p.radius[1]} px moving {p.speed[1]} px/frame for "
            f"{p.num_frames} frames ({travel:.0f} px) do not fit a {p.size}-px frame: lower speed, "
            "radius or num_frames, or raise size")
