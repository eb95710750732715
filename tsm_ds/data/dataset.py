"""``VideoClipDataset``: records -> sampled, decoded, transformed clips, robust to bad files.

``ds[i]`` returns ``{"clip": uint8 (T, 3, H, W) (test with V = num_clips * num_crops > 1 views:
(V, T, 3, H, W), crop-major: view = crop * num_clips + clip, as the official test script stacks
them), "label": int, "index": i, "bad": int, "bad_files": str}``. Clips are cropped, resized and
flipped but not normalised: the consumer normalises each batch on its device with
``tsm_ds.data.transforms.normalize_batch(batch["clip"], *ds.normalization, device, dtype)``.

Determinism: every random choice of item ``i`` (frame sampling, crop, flip, replacement) comes
from ``numpy.random.default_rng([seed, epoch, i, attempt, stream])``, so an item depends only on
(seed, epoch, index) and never on the worker, the order of access or the history of a process.

Bad files: a record whose file cannot be opened, has no video stream or no decodable frame is
replaced by another record drawn at random under the same seed (attempt 1, 2, ...), counted
(``"bad"`` in the item: how many unreadable files were replaced to produce it, i.e. encounters)
and named (``"bad_files"``: a JSON list of ``[path, reason]`` pairs, ``""`` for none; a string,
so that the default collate keeps it as a list of strings per batch, from which
:class:`tsm_ds.data.bad_videos.BadVideoTracker` counts distinct files over workers and ranks).
It is warned once per file (``RuntimeWarning`` naming the file and the reason) over all the
DataLoader workers of a process tree: a shared-memory flag per record marks the files already
warned (two workers failing on the same file in the same instant could still both warn). The
trainer turns these warnings off (``warn_bad_files = False``) and warns once per file per run
from rank 0 instead (the tracker).
Memory: after every item the heap memory the decoder freed is returned to the OS
(:func:`tsm_ds.data.memory.release_freed_heap`, glibc ``malloc_trim``; ``reader_options.malloc_trim``
False, ``--no-malloc-trim``, turns it off), so that a worker's RSS stays flat over a long epoch.

After ``max_replacements`` failures in a row a ``RuntimeError`` names the files: the dataset is
mostly unreadable and looping on would hide it. Partly decodable files are kept; see
:func:`tsm_ds.data.video.decode_frames`.
"""
from __future__ import annotations

import json
import os
from typing import Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from . import shards as _shards
from . import video as _video
from .memory import release_freed_heap
from .options import ReaderOptions
from .packed_batch import PackedClip, check_decode_device, stack_views
from .records import VideoRecord
from .sampling import clip_indices
from .transforms import ClipTransform

__all__ = ["VideoClipDataset"]


def _open_pack(path: str) -> _video.PackedVideo:
    """A ``.jpack`` file, or a pack inside shards (``<shard folder>!/<key>``, :mod:`tsm_ds.data.shards`):
    the same reader either way, so the items are the same. Raises VideoError subclasses naming ``path``."""
    if _shards.is_shard_path(path):
        return _shards.open_packed(path)
    return _video.PackedVideo(path)


class VideoClipDataset(Dataset):
    """Clips of ``num_segments`` frames from videos, JPEG frame folders or packed videos (``.jpack``).

    Args:
        records: :class:`VideoRecord` list (videos, or frame folders with num_frames).
        num_segments: T, frames per clip.
        mode: "train" (random segment frames, multi-scale crop, flip), "val" (segment centres,
            centre crop) or "test" (num_clips x num_crops views).
        img_size: S, output side (test with full_res gives scale_size = S * 256 // 224).
        sampling: "tsn" (one frame per segment) or "dense" (I3D window of ``dense_window`` frames
            with stride dense_window // T).
        flip: random horizontal flip in training.
        seed: base seed; with :meth:`set_epoch` and the index it seeds every random choice.
        num_clips, num_crops: test views (crops 1, 3, 5, 10); twice_sample: official 2-clip
            test sampling.
        full_res: test crops of side scale_size (official ``--full_res``); None: for 3 crops
            only (the pre-issue-18 meaning). resize: "box" or "official" (val/test scaling; see
            :class:`~tsm_ds.data.transforms.ClipTransform`).
        max_replacements: bad files tolerated in a row for one item before RuntimeError.
        thread_count: decoder threads per item (1: right for DataLoader workers).
        train_short_side, scale_size: see :class:`~tsm_ds.data.transforms.ClipTransform`.
        decode_short_side: frames larger than this are scaled down while they are converted to
            RGB (:func:`~tsm_ds.data.video.decode_frames` ``short_side``); "auto": the short side
            the transform works at (train_short_side in training, scale_size otherwise), which
            is what the official pipeline gets from frames extracted at that size; None: decode
            at full resolution. With ``resize="official"`` (val/test), "auto" decodes at full
            resolution so that the whole-frame bilinear scaling does all the resizing.
        decode_device: None (default): the worker decodes and returns uint8 clips. "cpu" /
            "cuda": packed records only; the worker returns a
            :class:`~tsm_ds.data.packed_batch.PackedClip` (JPEG bytes + the drawn crop) and
            :func:`~tsm_ds.data.transforms.normalize_batch` decodes whole batches there
            (DataLoaders need ``collate_fn=collate_items``); "cuda" without CUDA is refused.
        reader_options: the frame-index cache, shard cache and heap trim of every process that reads
            this dataset (:class:`~tsm_ds.data.options.ReaderOptions`, applied there; default: the
            defaults).

    Raises ValueError for an empty record list or bad options.
    """

    def __init__(self, records: Sequence[VideoRecord], *, num_segments: int = 8,
                 mode: str = "train", img_size: int = 224, sampling: str = "tsn",
                 flip: bool = True, seed: int = 0, num_clips: int = 1, num_crops: int = 1,
                 full_res: bool | None = None, resize: str = "box", twice_sample: bool = False,
                 dense_window: int = 64, max_replacements: int = 20,
                 thread_count: int = 1, train_short_side: int | None | str = "auto",
                 scale_size: int | None = None, decode_short_side: int | None | str = "auto",
                 decode_device: str | None = None, reader_options: ReaderOptions | None = None):
        if not records:
            raise ValueError("VideoClipDataset: no records")
        if mode not in ("train", "val", "test"):
            raise ValueError(f"mode must be train/val/test, got {mode!r}")
        if mode != "test" and (num_clips != 1 or num_crops != 1 or twice_sample or full_res):
            raise ValueError("num_clips / num_crops / full_res / twice_sample apply to mode='test' only")
        self.records = list(records)
        self.reader_options = reader_options or ReaderOptions()   # applied where items are read
        self.num_segments = num_segments
        self.mode = mode
        self.sampling = sampling
        self.seed = int(seed)
        # the epoch lives in shared memory so that set_epoch reaches persistent DataLoader workers
        self._epoch = torch.zeros(1, dtype=torch.int64).share_memory_()
        # per record: 1 once its file was warned about as unreadable, seen by every worker
        self._bad_warned = torch.zeros(len(self.records), dtype=torch.uint8).share_memory_()
        self.warn_bad_files = True   # the trainer's BadVideoTracker sets False and warns once per run
        self.num_clips = 2 if twice_sample else num_clips
        self.twice_sample = twice_sample
        self.dense_window = dense_window
        self.max_replacements = max_replacements
        self.thread_count = thread_count
        self.img_size = int(img_size)  # recorded with checkpoints so that the tools use the trained size
        self.transform = ClipTransform(mode, img_size, flip=flip, num_crops=num_crops,
                                       full_res=full_res, resize=resize, train_short_side=train_short_side,
                                       scale_size=scale_size)
        if decode_short_side == "auto":
            decode_short_side = (self.transform.train_short_side if mode == "train"
                                 else None if resize == "official" else self.transform.scale_size)
        self.decode_short_side = decode_short_side
        self.decode_device = check_decode_device(decode_device)
        if self.decode_device is not None:
            not_packed = [r.path for r in self.records if not _video.is_packed(r.path)]
            if not_packed:
                raise ValueError(f"decode_device={decode_device!r} (--decode-device) decodes packed videos "
                                 f"only, and {len(not_packed)} records are not, e.g. {not_packed[0]}: "
                                 "prepare them with 'tsm-ds prepare SRC OUT' (--mode packed) or leave "
                                 "--decode-device unset")
        # fail early on a bad option combination
        clip_indices(max(num_segments, 1) * 4, num_segments, mode=mode, sampling=sampling,
                     rng=np.random.default_rng(0), num_clips=self.num_clips,
                     twice_sample=twice_sample, window=dense_window)

    #: decoded whole videos in memory (:class:`tsm_ds.data.clip_cache.DecodedFrameCache`, set by
    #: train.py ``--cache-decoded``); None: decode the clip's frames on every access
    frame_cache = None

    def __len__(self) -> int:
        return len(self.records)

    @property
    def num_views(self) -> int:
        """Views per item: num_clips * num_crops in test mode, else 1."""
        return self.num_clips * self.transform.num_views if self.mode == "test" else 1

    @property
    def normalization(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """(mean, std) per channel for pixels in [0, 1], the values :func:`~tsm_ds.data.transforms.normalize_batch`
        must use on this dataset's uint8 clips."""
        return self.transform.normalization

    @property
    def labels(self) -> list[int]:
        """Labels of all records, in order (for class-balanced samplers, confusion matrices)."""
        return [r.label for r in self.records]

    @property
    def epoch(self) -> int:
        """The epoch whose random choices items use (see :meth:`set_epoch`)."""
        return int(self._epoch[0])

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose random choices items use; call before each epoch. The value is
        in shared memory, so DataLoader workers (persistent ones too) see it."""
        self._epoch[0] = int(epoch)

    def _rng(self, index: int, attempt: int, stream: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, self.epoch, index, attempt, stream])

    def load(self, record: VideoRecord, index: int, attempt: int = 0, shape: tuple[int, int] | None = None
             ) -> torch.Tensor:
        """Decode and transform one record's clip (no bad-file handling; raises VideoError).

        ``shape`` (T, crop): cut the clip with T frames and resize its crop to ``crop`` px (train mode;
        :meth:`__getitem__`); None: ``num_segments`` and ``img_size``, the default path, unchanged."""
        self.reader_options.apply()   # this process's caches, as the dataset says (data/options.py)
        t_segs = self.num_segments if shape is None else int(shape[0])
        out = {} if shape is None else {"out_size": int(shape[1])}   # the default calls stay as they were

        def indices(n: int) -> np.ndarray:
            return clip_indices(n, t_segs, mode=self.mode, sampling=self.sampling,
                                rng=self._rng(index, attempt, 0), num_clips=self.num_clips,
                                twice_sample=self.twice_sample, window=self.dense_window)

        if self.decode_device is not None:   # the consumer decodes the batch (data/packed_batch.py)
            with _open_pack(record.path) as pv:
                idx = indices(pv.num_frames)
                flat = [min(max(int(i), 0), pv.num_frames - 1) for i in idx.reshape(-1)]
                enc = pv.read_encoded(flat)   # whole JPEGs checked here: damage replaced like a bad video
                size = (pv.width, pv.height)
            official = self.transform.resize == "official" and self.mode != "train"
            boxes = None if official else self.transform.boxes(*size, self._rng(index, attempt, 1), **out)
            return PackedClip([enc[i] for i in flat], boxes, self.transform, idx.shape[0],
                              t_segs, self.mode == "test" and self.num_views > 1,
                              record.path, self.decode_device)
        if _video.is_packed(record.path) and self.frame_cache is None:
            with _open_pack(record.path) as pv:   # one open: header, then the kept frames
                idx = indices(pv.num_frames)
                frames = pv.decode_chw(idx.reshape(-1), short_side=self.decode_short_side)
            # crops cut frame by frame: the whole frames are never copied into one clip
            x = self.transform.frames_to_clip(frames, self._rng(index, attempt, 1), **out)
            return stack_views(x, idx.shape[0], t_segs, self.mode == "test" and self.num_views > 1)
        template = record.frame_template or _video.FRAME_TEMPLATE
        if os.path.isdir(record.path) and self.frame_cache is None:   # JPEG folder: as packs
            n = record.num_frames if record.num_frames is not None else _video.frame_folder_count(record.path,
                                                                                                   template)
            idx = indices(n)
            flat = [min(max(int(i), 0), n - 1) for i in idx.reshape(-1)]
            frames = [torch.from_numpy(f).permute(2, 0, 1) for f in
                      _video.read_frame_folder_list(record.path, flat, template, short_side=self.decode_short_side)]
            x = self.transform.frames_to_clip(frames, self._rng(index, attempt, 1), **out)
            return stack_views(x, idx.shape[0], t_segs, self.mode == "test" and self.num_views > 1)
        else:
            if os.path.isdir(record.path):
                n = record.num_frames or _video.frame_folder_count(record.path, template)
            else:
                n = _video.count_frames(record.path)
            idx = indices(n)
            decode = self.frame_cache.get if self.frame_cache is not None else _video.decode_frames
            frames = decode(record.path, idx.reshape(-1), num_frames=n, thread_count=self.thread_count,
                            short_side=self.decode_short_side, frame_template=template)
        k = idx.shape[0]
        x = self.transform(frames, self._rng(index, attempt, 1), **out)
        return stack_views(x, k, t_segs, self.mode == "test" and self.num_views > 1)

    def __getitem__(self, index: int | tuple[int, int, int]) -> dict:
        """The item for ``index`` (see the module docstring).

        ``index`` may be a tuple ``(index, T, crop)`` (train mode: multigrid's per-step shape, from
        :class:`tsm_ds.engine.loop.multigrid_sampler.MultigridBatchSampler`; PySlowFast's datasets take
        ``(index, short_cycle_idx)`` the same way): the clip is uint8 (T, 3, crop, crop), its T
        frames sampled over the whole video as the T-segment TSN rule says, its crop the box drawn
        as at ``img_size`` resized to ``crop`` (:meth:`~tsm_ds.data.transforms.ClipTransform.boxes`);
        every random choice still comes from (seed, epoch, index). A plain ``index``: the
        default item, as before.

        Raises:
            IndexError: index out of range. ValueError: a shape tuple outside train mode, T < 1 or
            crop < 1 (any T >= 1 is cut; the model checks its own rules, e.g. an even T with temporal
            pooling). RuntimeError: ``max_replacements`` unreadable files in a row.
        """
        shape = None
        if isinstance(index, (tuple, list)):
            index, t, c = (int(v) for v in index)
            if self.mode != "train" or t < 1 or c < 1:
                raise ValueError(f"item shape (T={t}, crop={c}): a per-item shape needs train mode, T >= 1 and "
                                 f"crop >= 1 (this dataset is {self.mode!r})")
            shape = (t, c)
        if not 0 <= index < len(self.records):
            raise IndexError(index)
        record, rec_i, failures = self.records[index], index, []
        for attempt in range(self.max_replacements + 1):
            try:
                clip = self.load(record, index, attempt, shape)
                if self.reader_options.malloc_trim:
                    release_freed_heap()   # the decoder's freed heap back to the OS: flat RSS (data/memory.py)
                return {"clip": clip, "label": int(record.label), "index": int(index), "bad": len(failures),
                        "bad_files": json.dumps(failures) if failures else ""}
            except _video.VideoError as e:
                failures.append((e.path, e.reason))
                self._warn_bad(rec_i, e)
                rec_i = int(self._rng(index, attempt, 2).integers(len(self.records)))
                record = self.records[rec_i]
        raise RuntimeError(f"item {index}: {len(failures)} unreadable files in a row, giving up "
                           f"(run 'tsm-ds check-videos' on the list): "
                           + "; ".join(f"{p} ({r})" for p, r in failures[:5]))

    def _warn_bad(self, rec_i: int, e: _video.VideoError) -> None:
        """One RuntimeWarning per unreadable file over this process tree's workers (see the module
        docstring); nothing when ``warn_bad_files`` is False (the trainer reports them)."""
        if not self.warn_bad_files or self._bad_warned[rec_i]:
            return
        self._bad_warned[rec_i] = 1
        _video.warn_once(e.path, "bad", f"unreadable video, replaced by another sample: {e.path}: {e.reason}")
