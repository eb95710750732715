"""``tsm-ds predict VIDEO...``: the top-k classes of each video, by the test protocol or streaming.

Clip mode (default) takes ``num_clips x num_crops`` views of each video exactly as ``tsm-ds eval``
does (:mod:`tsm_ds.engine.views`; the same ``VideoClipDataset`` test pipeline) and prints the top-k
class names with their probabilities (softmax of the averaged logits, or the averaged
probabilities with ``--average prob``)::

    tsm-ds predict --checkpoint best.pt clip1.mp4 clip2.avi --top-k 5
    tsm-ds predict --checkpoint TSM_kinetics_RGB_resnet50_shift8_blockres_avg_segment8_e50.pth \\
        --labels ../shared/data/kinetics400_labels.txt --num-clips 10 --num-crops 3 clip.mp4

Online mode (``--online``, a checkpoint trained with ``shift="online"``) streams the video frame by
frame through the uni-directional TSM's ``model.step`` (each frame sees the cached shifted channels
of the previous one, nothing from the future) and prints the running prediction: the mean of the
last ``--window`` per-frame logits, as the official online demo (``online_demo/main.py``:
``history_logit[-12:]``, every second camera frame, hence the defaults window 12, stride 2).

A video that cannot be read (missing, not a video, no decodable frame) gets a one-line message on
stderr naming the file and the reason; the other videos are still predicted and the exit status is 1.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F


class UnreadableVideo(Exception):
    """A video that cannot be predicted: ``path`` and a human-readable ``reason``."""

    def __init__(self, path: str, reason: str):
        self.path, self.reason = path, reason
        super().__init__(f"cannot read video {path}: {reason}")


def probe(path: str) -> int:
    """Frames in ``path`` (>= 1), or :class:`UnreadableVideo` naming the problem.

    Uses ``tsm_ds.data.decode.count_frames`` (demux only) and decodes the first frame, so a file
    that opens but holds no decodable picture is caught here rather than inside the dataset.
    """
    from tsm_ds.data import decode

    p = Path(path)
    if not p.exists():
        raise UnreadableVideo(path, "no such file")
    try:
        n = decode.count_frames(path)
        if n < 1:
            raise UnreadableVideo(path, "the video stream has no frame")
        decode.decode_frames(path, [0])
    except decode.VideoError as e:
        raise UnreadableVideo(path, e.reason) from e
    except UnreadableVideo:
        raise
    except Exception as e:  # FFmpeg/PyAV errors not wrapped by the decoder
        raise UnreadableVideo(path, f"{type(e).__name__}: {e}") from e
    return n


def topk(probs: torch.Tensor, class_names: list[str], k: int) -> list[tuple[str, float]]:
    """The ``k`` best (name, probability) pairs of one video's probabilities (K,), best first."""
    k = min(k, probs.numel())
    vals, idx = probs.topk(k)
    return [(class_names[int(i)], float(v)) for v, i in zip(vals, idx)]


def predict_clip(model: torch.nn.Module, path: str, *, num_segments: int, img_size: int,
                 num_clips: int = 1, num_crops: int = 1, average: str = "logits",
                 max_clips: int | None = None) -> torch.Tensor:
    """Class probabilities of one video under a multi-view test protocol.

    Args:
        model: eval-mode recognizer, float32 (N, T, 3, H, W) -> logits (N, K).
        path: video file.
        num_segments: T. img_size: crop size in pixels.
        num_clips, num_crops: the protocol (:func:`tsm_ds.engine.views.view_protocol`).
        average: ``"logits"`` (softmax of the mean logits) or ``"prob"`` (mean of per-view softmax).
        max_clips: clips per model call.

    Returns:
        float32 (K,) probabilities summing to 1.

    Raises:
        UnreadableVideo: the file cannot be decoded (see :func:`probe`).
    """
    from tsm_ds.data.dataset import VideoClipDataset
    from tsm_ds.data.records import VideoRecord
    from tsm_ds.engine.views import MultiViewForward, view_protocol

    n = probe(path)
    protocol = view_protocol(num_clips, num_crops)
    ds = VideoClipDataset([VideoRecord(path, 0, n)], num_segments=num_segments, img_size=img_size,
                          **protocol.dataset_kwargs())
    try:
        item = ds[0]
    except Exception as e:
        raise UnreadableVideo(path, f"{type(e).__name__}: {e}") from e
    if int(item.get("bad", 0)):
        raise UnreadableVideo(path, "the decoder failed on the sampled frames")
    scores = MultiViewForward(protocol.num_views, average, max_clips=max_clips)(model, item["clip"][None])[0]
    return scores if average == "prob" else F.softmax(scores, dim=0)


def frame_transform(frame: np.ndarray, img_size: int) -> torch.Tensor:
    """One decoded frame to the network's input, exactly as the 1-crop test pipeline does it.

    Args:
        frame: uint8 (H, W, 3) RGB.
        img_size: crop side S in pixels.

    Returns:
        float32 (3, S, S): short side scaled to S * 256 // 224, centre crop, ImageNet mean/std
        (``tsm_ds.data.transforms.ClipTransform("val")``; official ``GroupScale`` + ``GroupCenterCrop``).
    """
    from tsm_ds.data.transforms import ClipTransform

    return ClipTransform("val", img_size)(frame[None])[0]


def stream_frames(path: str, num_frames: int, *, stride: int = 1, chunk: int = 16,
                  max_frames: int | None = None):
    """Yield (frame index, uint8 (H, W, 3)) for frames 0, stride, 2*stride, ... decoded in chunks.

    Decoding ``chunk`` frames at a time keeps memory bounded for long or high-resolution videos.
    Raises :class:`UnreadableVideo` on a decoder error.
    """
    from tsm_ds.data import decode

    wanted = list(range(0, num_frames, max(1, stride)))
    if max_frames is not None:
        wanted = wanted[:max_frames]
    for s in range(0, len(wanted), chunk):
        idx = wanted[s:s + chunk]
        try:
            frames = decode.decode_frames(path, idx)
        except decode.VideoError as e:
            raise UnreadableVideo(path, e.reason) from e
        yield from zip(idx, frames)


def predict_online(model: torch.nn.Module, path: str, class_names: list[str], *, img_size: int,
                   window: int = 12, stride: int = 2, max_frames: int | None = None,
                   every: int = 1, top_k: int = 5, out=None) -> dict[str, Any]:
    """Stream a video through the online TSM frame by frame, printing the running prediction.

    Args:
        model: built with ``shift="online"`` (has ``step``), eval mode.
        path: video file. class_names: K names.
        img_size: crop size. window: running prediction = mean of the last ``window`` per-frame
            logits. stride: use every ``stride``-th frame. max_frames: stop after this many steps.
        every: print the running prediction every ``every`` steps (0: only the final one).
        top_k: names in the final prediction. out: text stream for the running lines (None: stdout).

    Returns:
        ``{"frames": steps run, "running": [(frame index, top-1 name, probability)],
        "final": [(name, probability)] of the last window}``.

    Raises:
        UnreadableVideo: unreadable file. RuntimeError: the model has no online ``step``.
    """
    if not callable(getattr(model, "step", None)) or getattr(model, "config", {}).get("shift") != "online":
        raise RuntimeError("--online needs a checkpoint trained with shift='online' "
                           f"(this one has shift={getattr(model, 'config', {}).get('shift')!r})")
    out = out if out is not None else sys.stdout
    n = probe(path)
    cache = None
    history: deque[torch.Tensor] = deque(maxlen=max(1, window))
    running = []
    steps = 0
    with torch.no_grad():
        for i, img in stream_frames(path, n, stride=stride, max_frames=max_frames):
            logits, cache = model.step(frame_transform(img, img_size)[None], cache)
            history.append(logits[0].float())
            probs = F.softmax(torch.stack(list(history)).mean(0), dim=0)
            name, p = topk(probs, class_names, 1)[0]
            running.append((i, name, p))
            steps += 1
            if every and steps % every == 0:
                print(f"  frame {i:5d}  {name}  {p:.3f}", file=out, flush=True)
    final = topk(probs, class_names, top_k) if steps else []
    return {"frames": steps, "running": running, "final": final}


def build_parser() -> argparse.ArgumentParser:
    """The ``tsm-ds predict`` argument parser."""
    p = argparse.ArgumentParser(prog="tsm-ds predict", description=__doc__.split("\n\n")[0].replace("``", ""),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("videos", nargs="+", metavar="VIDEO", help="video files")
    p.add_argument("--checkpoint", required=True,
                   help="exported state dict (.pt), DeepSpeed checkpoint directory or official TSM .pth")
    p.add_argument("--labels", default=None,
                   help="label map, one class name a line (e.g. kinetics400_labels.txt); "
                        "default: the checkpoint's class names")
    p.add_argument("--top-k", type=int, default=5, help="classes shown per video (default 5)")
    p.add_argument("--num-segments", type=int, default=None, help="T (default: the checkpoint's)")
    p.add_argument("--img-size", type=int, default=None, help="crop size, pixels (default: the size the checkpoint was trained at, else 224)")
    p.add_argument("--num-clips", type=int, default=1, choices=[1, 2, 10],
                   help="clips per video: 1 uniform, 2 twice-sample, 10 dense (default 1)")
    p.add_argument("--num-crops", type=int, default=1, choices=[1, 3, 10],
                   help="crops per clip: 1 centre, 3 full-res, 10 (default 1)")
    p.add_argument("--average", choices=["logits", "prob"], default="logits",
                   help="view averaging (default logits, as the official test code)")
    p.add_argument("--online", action="store_true",
                   help="stream frames through the online (uni-directional) TSM and print the running prediction")
    p.add_argument("--window", type=int, default=12, help="online: frames in the running average (default 12)")
    p.add_argument("--stride", type=int, default=2, help="online: use every n-th frame (default 2)")
    p.add_argument("--every", type=int, default=1, help="online: print every n steps (0: final only)")
    p.add_argument("--max-frames", type=int, default=None, help="online: stop after this many steps")
    p.add_argument("--json", default=None, help="also write all predictions to this JSON file")
    from tsm_ds.engine.eval_cli import add_official_args

    add_official_args(p)
    return p


def main(argv: list[str]) -> int:
    """``tsm-ds predict``; exit status 0, 1 when some video could not be read, 2 on a bad checkpoint."""
    args = build_parser().parse_args(argv)
    from tsm_ds.engine.eval_cli import load_from_args

    loaded = load_from_args(args, "tsm-ds predict")
    if loaded is None:
        return 2
    for note in loaded.notes:
        print(f"note: {note}", file=sys.stderr)
    model, names = loaded.model, loaded.class_names
    num_segments = int(loaded.config.get("num_segments", 8))
    if args.online and loaded.config.get("shift") != "online":
        print(f"tsm-ds predict: --online needs a checkpoint trained with shift='online'; "
              f"{args.checkpoint} has shift={loaded.config.get('shift')!r}", file=sys.stderr)
        return 2
    failed, results = 0, {}
    for path in args.videos:
        print(path, flush=True)
        try:
            if args.online:
                r = predict_online(model, path, names, img_size=args.img_size, window=args.window,
                                   stride=args.stride, max_frames=args.max_frames, every=args.every,
                                   top_k=args.top_k)
                best = r["final"]
                print(f"  after {r['frames']} frames (last {min(args.window, r['frames'])} averaged):")
                results[path] = {"top": best, "frames": r["frames"]}
            else:
                probs = predict_clip(model, path, num_segments=num_segments, img_size=args.img_size,
                                     num_clips=args.num_clips, num_crops=args.num_crops,
                                     average=args.average)
                best = topk(probs, names, args.top_k)
                results[path] = {"top": best}
        except UnreadableVideo as e:
            failed += 1
            print(f"  error: {e}", flush=True)
            results[path] = {"error": e.reason}
            continue
        for rank, (name, p) in enumerate(best, 1):
            print(f"  {rank}. {name:40s} {p:.4f}")
    if args.json:
        from tsm_ds.engine.eval_report import atomic_write_text

        atomic_write_text(args.json, json.dumps({"checkpoint": str(args.checkpoint), "online": args.online,
                                                 "predictions": results}, indent=2) + "\n")
    if failed:
        bad = [p for p, r in results.items() if "error" in r]
        print(f"tsm-ds predict: {failed} of {len(args.videos)} videos could not be read: "
              + "; ".join(f"{p} ({results[p]['error']})" for p in bad), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
