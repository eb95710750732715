"""Multi-view evaluation of a checkpoint on one process or many (the library half of ``tsm-ds eval``).

Several processes (each video is scored once, by one rank; DistributedSampler padding is dropped by
:func:`tsm_ds.engine.loop.evaluate.gather_predictions`). Views are averaged as logits by default (as
the official ``test_models.py``; see :mod:`tsm_ds.inference.views`); ``average="prob"`` averages
softmax probabilities. Results (rank 0 writes them): see :mod:`tsm_ds.inference.eval_report`.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Callable, Sequence

import torch

from tsm_ds.engine.comm.dist import init_distributed
from tsm_ds.inference.loading import load_for_inference, resolve_img_size


def _norm(name: str) -> str:
    from tsm_ds.data.records import normalize_class_name

    return normalize_class_name(name).lower()


def map_labels(dataset_classes: Sequence[str] | None, model_classes: Sequence[str]) -> list[int] | None:
    """Map dataset label i to the model's class index by name (``tai_chi`` == ``tai chi``; names
    compared after the official folder-name normalisation, ``normalize_class_name``, and lower case).

    Args:
        dataset_classes: the dataset's class names in label order, or None (a list file with integer
            labels: they are taken to be the model's indices already).
        model_classes: the checkpoint's K class names.

    Returns:
        ``mapping[i]`` = model index of dataset class i, or None when no mapping is needed (same
        names in the same order, or no dataset names).

    Raises:
        ValueError: a dataset class that the model does not know (named in the message).
    """
    if dataset_classes is None or list(dataset_classes) == list(model_classes):
        return None
    index = {_norm(n): i for i, n in enumerate(model_classes)}
    missing = [c for c in dataset_classes if _norm(c) not in index]
    if missing:
        raise ValueError(f"dataset classes {missing} are not among the checkpoint's {len(model_classes)} "
                         "classes; evaluate on the classes the model was trained on (or pass --labels)")
    mapping = [index[_norm(c)] for c in dataset_classes]
    return None if mapping == list(range(len(model_classes))) else mapping


def find_run_config(checkpoint: str | os.PathLike) -> Path:
    """The training run's ``config.json`` for a checkpoint: ``RUN/best_model.pt``,
    ``RUN/last_model.pt``, ``RUN``, ``RUN/checkpoints`` or ``RUN/checkpoints/<tag>``.

    Raises:
        FileNotFoundError: no run's ``config.json`` there (the places looked at
            are named).
    """
    p = Path(checkpoint)
    start = p if p.is_dir() else p.parent
    places = [start]
    if start.name == "checkpoints":
        places.append(start.parent)
    elif start.parent.name == "checkpoints":
        places.append(start.parent.parent)
    for d in places:
        cfg = d / "config.json"
        if cfg.is_file():
            try:
                rec = json.loads(cfg.read_text(encoding="utf-8"))
                if "config" in rec or "flags" in rec:   # schema 2 or 1 (tsm_ds.config.record)
                    return cfg
            except ValueError:
                pass
    raise FileNotFoundError(f"no data given (--data DIR or --list FILE) and no training run's config.json "
                            f"next to the checkpoint {checkpoint} (looked in {', '.join(map(str, places))})")


def load_records(checkpoint: str | os.PathLike, *, data: str | None = None, list_file: str | None = None,
                 root: str | None = None, split: str | None = None, val_fraction: float = 0.2,
                 dataset: str | None = None, dataset_split: int | None = None, frame_template: str | None = None
                 ) -> tuple[list, list[str] | None, dict]:
    """The evaluation records, the dataset's class names (None for list files) and where they
    came from, from the ``tsm-ds eval`` options.

    - ``list_file`` (``--list FILE [--root DIR]``): a video list (``path label`` lines); ``split`` is refused.
    - ``data`` (``--data DIR``): resolved as training does (:func:`tsm_ds.data.splits.resolve_split`, with
      ``val_fraction``); ``split`` train|val|all picks the side; default: ``val`` when the data
      carries its own split (manifest, ``train/`` + ``val/``, ``dataset``), ``all`` for a plain class-folder tree.
      ``dataset`` / ``dataset_split`` / ``frame_template``: a distributed dataset under ``data``
      (:func:`tsm_ds.data.datasets.read_dataset`).
    - neither: the run's ``config.json`` next to ``checkpoint`` (:func:`find_run_config`) is resolved
      again (:func:`tsm_ds.data.splits.split_from_record`); ``split`` default ``val``.

    Returns:
        (records, class names or None, ``{"data", "split", "description", "missing"}``): ``missing``
        names the listed videos of that side that are not on disk (a dataset's; else empty): they
        are not in the records, so they are neither scored nor counted as unreadable.

    Raises:
        FileNotFoundError / NotADirectoryError: missing data, list or run config (named).
        ValueError: ``split`` with a list file, or no videos found.
    """
    from tsm_ds.data import records as rec
    from tsm_ds.data import splits

    side = split
    if dataset and not data:
        raise ValueError(f"--dataset {dataset}: give --data, the dataset's folder")
    if list_file:
        if side is not None:
            raise ValueError("--split applies to --data or a run's config.json, not to --list")
        records, names = rec.read_video_list(list_file, root=root), None
        info = {"data": str(list_file), "split": None, "description": f"list file {list_file}"}
    elif data:
        sp = splits.resolve_split(data=data, val_fraction=val_fraction, dataset=dataset, dataset_split=dataset_split,
                                  frame_template=frame_template)
        side = side or ("all" if sp.kind in ("holdout", "shards") else "val")
        records, names = sp.side(side), sp.class_names
        info = {"data": str(data), "split": side,
                "description": f"{sp.description}; {side} side"}
    else:
        cfg = find_run_config(checkpoint)
        sp = splits.split_from_record(json.loads(cfg.read_text(encoding="utf-8")))
        side = side or "val"
        records, names = sp.side(side), sp.class_names
        info = {"data": str(cfg), "split": side, "run_split": sp.as_dict(),
                "description": f"no data flag: {side} side of the run's data, read from {cfg}: {sp.description}"}
    info["missing"] = [] if list_file else [m for s in (("train", "val") if side == "all" else (side,))
                                            for m in sp.missing.get(s, [])]
    if not records:
        raise ValueError(f"no videos to evaluate in {info['description']}")
    return list(records), (list(names) if names is not None else None), info


def evaluate(checkpoint: str | os.PathLike, *, out: str | os.PathLike, labels: str | None = None,
             overrides: dict | None = None, data: str | None = None, list_file: str | None = None,
             root: str | None = None, split: str | None = None, val_fraction: float = 0.2, num_clips: int = 1,
             num_crops: int = 1, sampling: str | None = None, full_res: bool | None = None, resize: str = "box",
             img_size: int | None = None, average: str = "logits", batch_size: int = 1, workers: int = 0,
             max_clips: int | None = None, plot: bool = True, trust: bool = False,
             decode_device: str | None = None, log: Callable[[str], None] | None = None,
             max_bad_fraction: float = 0.01, dataset: str | None = None, dataset_split: int | None = None,
             frame_template: str | None = None, reader_options=None) -> dict | None:
    """Evaluate a checkpoint on videos with a multi-view test protocol (``tsm-ds eval``; the options
    are the fields of the ``checkpoint``, ``views`` and ``eval`` sections of :mod:`tsm_ds.config.tree`).

    Args:
        checkpoint: any checkpoint :func:`load_for_inference` reads; out: results folder (rank 0).
        labels: label-map file overriding the checkpoint's class names.
        overrides: ``build_model`` options replacing the checkpoint's (:func:`checkpoint_overrides`).
        data, list_file, root, split, val_fraction, dataset, dataset_split, frame_template: the videos
            (:func:`load_records`).
        num_clips, num_crops, sampling, full_res, resize: the view protocol
            (:func:`tsm_ds.inference.views.view_protocol`); average: ``"logits"`` or ``"prob"``.
        img_size: crop side in px (None: the size the checkpoint was trained at, else 224).
        batch_size: videos per rank per step; workers: DataLoader workers; max_clips: clips per
            model call (None: all views of a batch at once).
        plot: write confusion.png; log: rank 0's progress lines (default: the ``tsm_ds.inference`` logger).
        decode_device: decode packed videos' JPEG frames in batches there (``--decode-device``; see
            :class:`~tsm_ds.data.dataset.VideoClipDataset`); None: in the DataLoader workers.
        trust: load a checkpoint that needs more than the weights-only allowlist with full unpickling
            (``--trust-checkpoint``; :func:`load_for_inference`).
        reader_options: the readers' caches (``--shard-cache``, ...; :class:`tsm_ds.data.options.ReaderOptions`;
            None: the defaults).
        max_bad_fraction: the data-loss budget (``--max-bad-fraction``): unreadable videos are left
            out of the scores; more than this share of the videos stops the evaluation.

    Returns:
        the metrics dict on rank 0 (also written to ``out``; ``"data_lost"`` names the unreadable
        videos left out, ``meta["missing_videos"]`` the listed videos of the side that are not on
        disk, never scored), None on other ranks.

    Raises:
        DataLossError: more unreadable videos than ``max_bad_fraction`` allows (nothing written).
        ValueError / FileNotFoundError: bad checkpoints or data (see :func:`load_for_inference`,
        :func:`load_records`).
    """
    from torch.utils.data import DataLoader
    from torch.utils.data.distributed import DistributedSampler

    from tsm_ds.data.bad_videos import check_data_loss
    from tsm_ds.data.dataset import VideoClipDataset
    from tsm_ds.data.packed_batch import collate_items
    from tsm_ds.engine.loop.evaluate import gather_predictions
    from tsm_ds.inference.eval_report import write_eval_results
    from tsm_ds.inference.views import MultiViewForward, view_protocol

    rank, world = init_distributed(require_group=False)
    protocol = view_protocol(num_clips, num_crops, sampling, full_res=full_res, resize=resize)
    overrides = dict(overrides or {})
    loaded = load_for_inference(checkpoint, labels=labels, trust=trust, **overrides)
    if torch.cuda.is_available():
        loaded.model.cuda()
    num_segments = int(loaded.config.get("num_segments", overrides.get("num_segments") or 8))
    img_size = resolve_img_size(img_size, loaded)
    records, ds_names, data_info = load_records(checkpoint, data=data, list_file=list_file, root=root, split=split,
                                                val_fraction=val_fraction, dataset=dataset,
                                                dataset_split=dataset_split, frame_template=frame_template)
    mapping = map_labels(ds_names, loaded.class_names)
    dataset = VideoClipDataset(records, num_segments=num_segments, img_size=img_size,
                               decode_device=decode_device, reader_options=reader_options,
                               **protocol.dataset_kwargs())
    sampler = DistributedSampler(dataset, shuffle=False) if world > 1 else None
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, shuffle=False,
                        num_workers=workers, collate_fn=collate_items)
    if rank == 0:
        log = log or logging.getLogger("tsm_ds.inference").info
        for note in loaded.notes:
            log(f"note: {note}")
        log(f"checkpoint: {loaded.path} ({loaded.source})")
        log(f"data: {data_info['description']}")
        if data_info["missing"]:
            miss = data_info["missing"]
            log(f"data: {len(miss)} listed {data_info['split']} videos are not on disk and are not scored: "
                f"{', '.join(miss[:10])}{' ...' if len(miss) > 10 else ''} (metrics.json meta.missing_videos "
                f"names all)")
        log(f"eval: {len(records)} videos, {protocol.describe()}, T={num_segments}, "
            f"{img_size}px, average={average}, world size {world}")
    forward = MultiViewForward(protocol.num_views, average, max_clips=max_clips)
    lost: dict = {}
    indices, scores, labels = gather_predictions(loaded.model, loader, forward=forward, lost=lost)
    if len(indices) + len(lost["items"]) != len(dataset):
        raise RuntimeError(f"scored {len(indices)} and left out {len(lost['items'])} of {len(dataset)} videos")
    report = check_data_loss("eval", lost["files"], len(dataset), max_bad_fraction)   # the same on every rank
    metrics = None
    if rank == 0:
        labels_np = labels.numpy()
        if mapping is not None:
            labels_np = [mapping[i] for i in labels_np]
        meta = {"checkpoint": str(checkpoint), "checkpoint_file": loaded.path, "checkpoint_kind": loaded.source,
                "model_config": loaded.config, "protocol": protocol.describe(),
                "num_clips": protocol.num_clips, "num_crops": protocol.num_crops,
                "sampling": protocol.sampling, "num_segments": num_segments, "img_size": img_size,
                "world_size": world, "data": data_info["data"], "split": data_info["split"],
                "data_description": data_info["description"], "missing_videos": list(data_info["missing"])}
        metrics = write_eval_results(out, scores=scores.numpy(), labels=labels_np,
                                     class_names=loaded.class_names,
                                     paths=[str(records[i].path) for i in indices.tolist()],
                                     indices=indices.numpy(), average=average, meta=meta,
                                     plot=plot, data_lost=report)
    if world > 1:
        import torch.distributed as dist

        dist.barrier()
    return metrics
