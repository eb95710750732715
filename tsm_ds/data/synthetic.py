"""A synthetic video dataset whose labels live only in the order of the frames.

The demo dataset (``tsm-ds demo``, and the trainer's fallback when no data is given) shows in a
few CPU minutes what the TSM paper claims: a 2D network that shifts channels in time (TSM) models
temporal order, the same network averaging per-frame scores (TSN) cannot.

Design: classes come in *time-reversal pairs* ("moving_right" / "moving_left", "moving_down" /
"moving_up", "growing" / "shrinking", "rotating_cw" / "rotating_ccw", "appearing" / "vanishing").
Clip j of the second class of a pair is clip j of the first class played backwards: the same
shape, colours, background, distractor and per-frame noise, frames in reverse order. So

- the bag of frames of a clip and of its twin is the same (up to the codec), and any function of
  the unordered frames (TSN's average consensus) scores both alike: within a pair it is at chance;
- single frames pooled over time have the same distribution in both classes of a pair; for the
  four ``moving_*`` classes the object's position is also drawn so that the pooled single-frame
  distribution is the same across *all* four (the moving coordinate runs along a trajectory whose
  midpoint is uniform over the positions that keep it in the frame; the still coordinate is the
  position of an independent trajectory of the same law at a uniformly drawn frame);
- nothing else depends on the class: shapes, colours, sizes, speeds, backgrounds, an optional
  static distractor and noise are drawn from one law for every class.

Everything is drawn from ``numpy.random.default_rng((seed, split, pair, j))``, so a clip does not
depend on the others, on the order they are made in, or on the number of worker processes, and
the decoded frames are byte-identical for the same seed and parameters (same machine and
PyAV/FFmpeg build).

Files: ``root/{train,val}/<class>/<class>_<j:04d>.mp4`` (H.264 via libx264 when the PyAV build
has it, else MPEG-4 part 2), list files ``root/train.txt`` and ``root/val.txt`` with lines
``<path relative to root> <label>``, ``root/classes.txt`` (one name per line, line number =
label) and ``root/meta.json`` (parameters plus per-clip ground truth: object centre, size, angle
and opacity per frame). ``meta.json`` is written last and atomically: its presence marks a
complete dataset, which a second call with the same parameters reuses.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

__all__ = ["CLASS_PAIRS", "ALL_CLASSES", "DEFAULT_CLASSES", "make_demo_dataset", "sample_clip",
           "render_clip", "encode_video", "available_codec"]

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
_SPLITS = {"train": 0, "val": 1}
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


# --------------------------------------------------------------------------------------------
# encoding


def available_codec(preferred: str = "auto") -> str:
    """The PyAV encoder to use: 'libx264' (H.264) when present, else 'mpeg4' (MPEG-4 part 2).

    Args:
        preferred: "auto", or an encoder name to check ("libx264", "mpeg4", ...).

    Raises:
        ValueError: the named encoder is not in this PyAV/FFmpeg build.
    """
    import av

    def has(name: str) -> bool:
        try:
            av.codec.Codec(name, "w")
            return True
        except Exception:  # noqa: BLE001 - PyAV raises several types for a missing codec
            return False

    if preferred == "auto":
        return "libx264" if has("libx264") else "mpeg4"
    if not has(preferred):
        raise ValueError(f"encoder {preferred!r} is not available in this PyAV/FFmpeg build; "
                         "use codec='auto', 'libx264' or 'mpeg4'")
    return preferred


def encode_video(frames: np.ndarray, path: str | os.PathLike, *, fps: int = 8,
                 codec: str = "libx264") -> None:
    """Write frames to an .mp4 file (atomically: a temporary file, then ``os.replace``).

    Args:
        frames: uint8 (T, H, W, 3) RGB, H and W even.
        path: destination file.
        fps: frame rate written to the container (frames per second).
        codec: PyAV encoder; 'libx264' uses CRF 18, preset medium, one thread, no MB-tree
            (with MB-tree the same frames gave different bitstreams from run to run);
            'mpeg4' uses qscale 3.

    Raises:
        ValueError: frames of the wrong dtype or shape.
    """
    import av

    frames = np.asarray(frames)
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(f"frames must be uint8 (T, H, W, 3), got {frames.dtype} {frames.shape}")
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    if codec in ("libx264", "h264"):
        # MB-tree rate control made x264 (FFmpeg 8.1 build of PyAV 18) emit different bitstreams
        # for the same frames in ~1 of 3 runs, threads=1 or not; without it output is bit-exact
        options = {"crf": "18", "preset": "medium", "threads": "1", "x264-params": "mbtree=0"}
    else:
        options = {"qscale": "3", "threads": "1"}
    with av.open(str(tmp), "w", format="mp4") as container:
        stream = container.add_stream(codec, rate=fps, options=options)
        stream.width, stream.height = frames.shape[2], frames.shape[1]
        stream.pix_fmt = "yuv420p"
        for img in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    os.replace(tmp, path)


# --------------------------------------------------------------------------------------------
# the dataset


def _clip_rng(seed: int, split: str, pair: str, j: int) -> np.random.Generator:
    pair_id = list(CLASS_PAIRS).index(pair)
    return np.random.default_rng((seed, _SPLITS[split], pair_id, j))


def _make_one(job: tuple) -> dict:
    root, split, cls, label, j, params = job
    pair_id, pair, reverse = _CLASS_TO_PAIR[cls]
    spec = sample_clip(pair, _clip_rng(params["seed"], split, pair, j), size=params["size"],
                       num_frames=params["num_frames"], speed=tuple(params["speed"]),
                       radius=tuple(params["radius"]), noise=tuple(params["noise"]),
                       distractor_prob=params["distractor_prob"], clutter=params["clutter"],
                       contrast=params["contrast"], tint=params["tint"])
    rel = f"{split}/{cls}/{cls}_{j:04d}.mp4"
    encode_video(render_clip(spec, reverse=reverse), Path(root) / rel, fps=params["fps"],
                 codec=params["codec"])
    if reverse:  # ground truth in the order the frames are shown
        for key in ("centre", "radius", "angle", "alpha"):
            spec[key] = spec[key][::-1]
    twin = CLASS_PAIRS[pair][0 if reverse else 1]
    return {"path": rel, "label": label, "class": cls, "split": split, "reversed": reverse,
            "twin": f"{split}/{twin}/{twin}_{j:04d}.mp4", **spec}


@contextlib.contextmanager
def _locked(root: Path):
    """Hold an exclusive lock on root/.lock: two ranks that call at once generate once."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _result(root: Path, classes: Sequence[str], meta: dict) -> dict:
    return {"train_list": str(root / "train.txt"), "val_list": str(root / "val.txt"),
            "classes": list(classes), "root": str(root), "num_frames": meta["params"]["num_frames"],
            "meta": str(root / "meta.json")}


def make_demo_dataset(root: str | os.PathLike, *, seed: int = 0,
                      classes: Iterable[str] = DEFAULT_CLASSES, train_per_class: int = 200,
                      val_per_class: int = 50, num_frames: int = 16, size: int = 64,
                      speed: tuple[float, float] = (1.5, 2.5),
                      radius: tuple[float, float] = (8.0, 12.0),
                      noise: tuple[float, float] = (0.01, 0.05), distractor_prob: float = 0.0,
                      clutter: float = 0.5, contrast: float = 0.4, tint: float = 0.25, fps: int = 8,
                      codec: str = "auto", workers: int = 1, overwrite: bool = False) -> dict:
    """Generate (or reuse) the motion-direction demo dataset under ``root``.

    Each class has ``train_per_class`` training and ``val_per_class`` validation clips (labels
    exactly balanced). Classes of the same pair in ``CLASS_PAIRS`` are each other's time
    reversal clip by clip (see the module docstring), so only the order of frames tells them
    apart. With the defaults: 4 classes, 800 + 200 clips of 16 frames, 64 x 64 px, objects
    16-24 px across moving 1.5-2.5 px/frame (3-5 px between the frames an 8-segment clip
    samples), half-strength background clutter, no distractor.

    Why 16 frames for 8-segment clips: validation clips take the official TSN segment centres
    (``tsm_ds.data.sampling.clip_indices``, official ``_get_val_indices``), which fall back to
    frame 0 repeated T times when a video has ``num_frames <= num_segments``. With 8-frame
    videos and 8 segments every validation clip was one still frame (no motion), so any model
    scored exactly chance on this dataset. Keep ``num_frames > num_segments`` (2x is clean:
    validation then takes frames 1, 3, ..., 15).

    Args:
        root: output folder (created). ``root/train.txt``, ``root/val.txt`` list clips as
            ``<path relative to root> <label>``; ``root/classes.txt``; ``root/meta.json``.
        seed: the clips are a pure function of (seed, parameters); same seed, same decoded bytes.
        classes: class names from ``ALL_CLASSES``, in label order (label = position).
        train_per_class, val_per_class: clips per class in each split (>= 1).
        num_frames: frames per video (>= 2); must exceed the clips' num_segments for
            validation sampling to see motion (see above).
        size: frame height = width in pixels (even, >= 24).
        speed: (low, high) pixels per frame for moving objects.
        radius: (low, high) object size in pixels.
        noise: (low, high) per-frame Gaussian noise standard deviation, intensity units in [0, 1].
        distractor_prob: probability of a static second shape in a clip (the same for all classes).
        clutter: background structure in [0, 1] (0: flat random colour; see ``sample_clip``).
        contrast: minimum brightness difference between object and background, in [0, 0.5).
        tint: largest per-channel random tint of the colours (0: grey levels).
        fps: frames per second written to the container.
        codec: "auto" (libx264 if this PyAV has it, else mpeg4), "libx264" or "mpeg4".
        workers: processes rendering and encoding clips (the result does not depend on it).
        overwrite: regenerate even when ``root/meta.json`` already describes a dataset; without
            it, a dataset made with other parameters is an error (nothing is deleted silently).

    Returns:
        ``{"train_list": str, "val_list": str, "classes": [names], "root": str,
        "num_frames": int, "meta": str}`` (paths of files, absolute).

    Raises:
        ValueError: unknown or repeated class names, counts < 1, parameters that do not fit the
            frame, an unavailable codec, or ``root`` holding a dataset made with other
            parameters (pass ``overwrite=True`` or use another folder).
    """
    root = Path(root).resolve()
    classes = list(classes)
    unknown = [c for c in classes if c not in _CLASS_TO_PAIR]
    if unknown or not classes or len(set(classes)) != len(classes):
        raise ValueError(f"classes must be distinct names from {ALL_CLASSES}; got {classes}")
    if train_per_class < 1 or val_per_class < 1:
        raise ValueError(f"train_per_class and val_per_class must be >= 1, "
                         f"got {train_per_class}, {val_per_class}")
    _check_params(_Params(size, num_frames, tuple(speed), tuple(radius), tuple(noise)), contrast, tint)
    params = {
        "format_version": _FORMAT_VERSION, "seed": int(seed), "classes": classes,
        "train_per_class": int(train_per_class), "val_per_class": int(val_per_class),
        "num_frames": int(num_frames), "size": int(size), "speed": [float(s) for s in speed],
        "radius": [float(r) for r in radius], "noise": [float(n) for n in noise],
        "distractor_prob": float(distractor_prob), "clutter": float(clutter),
        "contrast": float(contrast), "tint": float(tint), "fps": int(fps), "codec": available_codec(codec),
    }
    meta_path = root / "meta.json"
    with _locked(root):
        if meta_path.is_file() and not overwrite:
            meta = json.loads(meta_path.read_text())
            if meta.get("params") == params:
                return _result(root, classes, meta)
            raise ValueError(
                f"{meta_path} describes a demo dataset made with other parameters "
                f"({meta.get('params')}); pass overwrite=True (--overwrite) or choose another folder")
        if meta_path.exists():
            meta_path.unlink()
        for split in _SPLITS:
            shutil.rmtree(root / split, ignore_errors=True)
            for cls in classes:
                (root / split / cls).mkdir(parents=True, exist_ok=True)
        counts = {"train": train_per_class, "val": val_per_class}
        # interleave classes so that a partial list file (never written, but a reader's view of
        # the job order) stays balanced, and twins are rendered next to each other
        jobs = [(str(root), split, cls, label, j, params)
                for split in _SPLITS for j in range(counts[split])
                for label, cls in enumerate(classes)]
        if workers > 1:
            import multiprocessing as mp

            with mp.get_context("spawn").Pool(workers) as pool:
                clips = pool.map(_make_one, jobs, chunksize=8)
        else:
            clips = [_make_one(job) for job in jobs]
        for split in _SPLITS:
            lines = [f"{c['path']} {c['label']}\n" for c in clips if c["split"] == split]
            _write_atomic(root / f"{split}.txt", "".join(lines))
        _write_atomic(root / "classes.txt", "".join(f"{c}\n" for c in classes))
        meta = {"params": params, "clips": clips}
        _write_atomic(meta_path, json.dumps(meta, separators=(",", ":")))
    return _result(root, classes, meta)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
