"""Top-k classes of a video (the library half of ``tsm-ds predict VIDEO...``), by the test protocol or streaming.

Clip mode (default) takes ``num_clips x num_crops`` views of each video exactly as ``tsm-ds eval``
does (:mod:`tsm_ds.inference.views`; the same ``VideoClipDataset`` test pipeline) and prints the top-k
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

    Uses :func:`tsm_ds.data.video.count_frames` (demux only) and decodes the first frame (the
    sequential loop :func:`~tsm_ds.data.video.iter_frames` that :func:`stream_frames` runs), so a
    file that opens but holds no decodable picture is caught here rather than inside the dataset.
    """
    from tsm_ds.data import video

    p = Path(path)
    if not p.exists():
        raise UnreadableVideo(path, "no such file")
    try:
        n = video.count_frames(path)
        if n < 1:
            raise UnreadableVideo(path, "the video stream has no frame")
        first = video.iter_frames(path, stop=1, num_frames=n)
        try:
            next(first)
        finally:
            first.close()
    except video.VideoError as e:
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
                 max_clips: int | None = None, full_res: bool | None = None,
                 resize: str | None = None) -> torch.Tensor:
    """Class probabilities of one video under a multi-view test protocol.

    Args:
        model: eval-mode recognizer, float32 (N, T, 3, H, W) -> logits (N, K).
        path: video file.
        num_segments: T. img_size: crop size in pixels.
        num_clips, num_crops, full_res, resize: the protocol
            (:func:`tsm_ds.inference.views.view_protocol`).
        average: ``"logits"`` (softmax of the mean logits) or ``"prob"`` (mean of per-view softmax).
        max_clips: clips per model call.

    Returns:
        float32 (K,) probabilities summing to 1.

    Raises:
        UnreadableVideo: the file cannot be decoded (see :func:`probe`).
    """
    from tsm_ds.data.dataset import VideoClipDataset
    from tsm_ds.data.records import VideoRecord
    from tsm_ds.data.transforms import normalize_batch
    from tsm_ds.inference.views import MultiViewForward, view_protocol

    n = probe(path)
    protocol = view_protocol(num_clips, num_crops, full_res=full_res, resize=resize)
    ds = VideoClipDataset([VideoRecord(path, 0, n)], num_segments=num_segments, img_size=img_size,
                          **protocol.dataset_kwargs())
    try:
        item = ds[0]
    except Exception as e:
        raise UnreadableVideo(path, f"{type(e).__name__}: {e}") from e
    if int(item.get("bad", 0)):
        raise UnreadableVideo(path, "the decoder failed on the sampled frames")
    param = next((q for q in model.parameters() if q.is_floating_point()), None)
    clip = normalize_batch(item["clip"][None], *ds.normalization, param.device if param is not None else None)
    scores = MultiViewForward(protocol.num_views, average, max_clips=max_clips)(model, clip)[0]
    return scores if average == "prob" else F.softmax(scores, dim=0)


def frame_transform(frame: np.ndarray, img_size: int) -> torch.Tensor:
    """One decoded frame to the network's input, exactly as the 1-crop test pipeline does it.

    Args:
        frame: uint8 (H, W, 3) RGB.
        img_size: crop side S in pixels.

    Returns:
        float32 (3, S, S): short side scaled to S * 256 // 224, centre crop
        (``tsm_ds.data.transforms.ClipTransform("val")``; official ``GroupScale`` + ``GroupCenterCrop``),
        ImageNet mean/std (:func:`tsm_ds.data.transforms.normalize_batch`).
    """
    from tsm_ds.data.transforms import ClipTransform, normalize_batch

    t = ClipTransform("val", img_size)
    return normalize_batch(t(frame[None]), *t.normalization)[0]


def stream_frames(path: str, num_frames: int, *, stride: int = 1, max_frames: int | None = None):
    """Yield (frame index, uint8 (H, W, 3) RGB) for frames 0, stride, 2*stride, ... (< num_frames,
    at most ``max_frames`` of them) in one sequential decoding pass.

    Frames are decoded one at a time (:func:`tsm_ds.data.video.iter_frames`), so memory stays
    bounded for long or high-resolution videos; frames past the end of a stream shorter than its
    packet count are the last decoded frame (one warning), as :func:`tsm_ds.data.video.decode_frames`
    gives them.

    Raises :class:`UnreadableVideo` on a decoder error.
    """
    from tsm_ds.data import video

    stride = max(1, stride)
    wanted = range(0, num_frames, stride)
    if max_frames is not None:
        wanted = wanted[:max_frames]
    if not wanted:
        return
    frames = video.iter_frames(path, stride=stride, stop=wanted[-1] + 1, num_frames=num_frames)
    try:
        yield from frames
    except video.VideoError as e:
        raise UnreadableVideo(path, e.reason) from e
    finally:
        frames.close()


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
