"""tsm_ds.data: annotations -> frame indices -> decoded frames -> transformed clips.

Modules: records (list files, class folders, Kinetics CSV, manifest split), datasets (the distributed
datasets read from their own annotation files: Something-Something, Jester, UCF101, HMDB51,
Kinetics; a package), splits (the one train / val resolver), sampling (TSN /
dense / multi-clip indices), video (PyAV, exact frames, cached packet index; a package),
transforms (official crops to uint8 clips; ``normalize_batch``: the ImageNet normalisation, once
per batch on the device), dataset (VideoClipDataset), prepare / check
(the ``tsm-ds prepare`` / ``tsm-ds check-videos`` commands), synthetic (the demo dataset
generator; a package), testvideo (numbered test videos).

The names below are imported lazily, so ``import tsm_ds.data.records`` does not load torch.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "VideoRecord": "records", "read_class_folders": "records", "read_video_list": "records",
    "read_kinetics_csv": "records", "read_label_map": "records",
    "split_by_source_group": "records", "write_video_list": "records", "Split": "records",
    "read_dataset": "datasets",
    "clip_indices": "sampling",
    "decode_frames": "video", "count_frames": "video", "VideoError": "video",
    "ClipTransform": "transforms", "normalize_batch": "transforms",
    "VideoClipDataset": "dataset",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
