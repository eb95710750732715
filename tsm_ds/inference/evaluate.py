"""Multi-view evaluation of a checkpoint on one process or many (the library half of ``tsm-ds eval``).

Several processes (each video is scored once, by one rank; DistributedSampler padding is dropped by
:func:`tsm_ds.engine.evaluate.gather_predictions`). Views are averaged as logits by default (as
the official ``test_models.py``; see :mod:`tsm_ds.inference.views`); ``average="prob"`` averages
softmax probabilities. Results (rank 0 writes them): see :mod:`tsm_ds.inference.report`.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from tsm_ds.engine.dist import init_distributed
from tsm_ds.inference.loading import checkpoint_overrides, load_for_inference, resolve_img_size


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
        FileNotFoundError: no ``config.json`` with a ``flags`` record there (the places looked at
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
                if "flags" in json.loads(cfg.read_text(encoding="utf-8")):
                    return cfg
            except ValueError:
                pass
    raise FileNotFoundError(f"no data given (--data DIR or --list FILE) and no training run's config.json "
                            f"next to the checkpoint {checkpoint} (looked in {', '.join(map(str, places))})")


def load_records(args: Any) -> tuple[list, list[str] | None, dict]:
    """The evaluation records, the dataset's class names (None for ``--list`` files) and where they
    came from, from the ``tsm-ds eval`` flags.

    - ``--list FILE [--root DIR]``: a video list (``path label`` lines); ``--split`` is refused.
    - ``--data DIR``: resolved as training does (:func:`tsm_ds.data.splits.resolve_split`, with
      ``--val-fraction``); ``--split train|val|all`` picks the side; default: ``val`` when the data
      carries its own split (manifest, ``train/`` + ``val/``), ``all`` for a plain class-folder tree.
    - neither: the run's ``config.json`` next to ``--checkpoint`` (:func:`find_run_config`) is resolved
      again (:func:`tsm_ds.data.splits.split_from_record`); ``--split`` default ``val``.

    Returns:
        (records, class names or None, ``{"data", "split", "description"}``).

    Raises:
        FileNotFoundError / NotADirectoryError: missing data, list or run config (named).
        ValueError: ``--split`` with ``--list``, or no videos found.
    """
    from tsm_ds.data import records as rec
    from tsm_ds.data import splits

    side = getattr(args, "split", None)
    if args.list:
        if side is not None:
            raise ValueError("--split applies to --data or a run's config.json, not to --list")
        records, names = rec.read_video_list(args.list, root=args.root), None
        info = {"data": str(args.list), "split": None, "description": f"list file {args.list}"}
    elif args.data:
        split = splits.resolve_split(data=args.data, val_fraction=getattr(args, "val_fraction", 0.2))
        side = side or ("all" if split.kind == "holdout" else "val")
        records, names = split.side(side), split.class_names
        info = {"data": str(args.data), "split": side,
                "description": f"{split.description}; {side} side"}
    else:
        cfg = find_run_config(args.checkpoint)
        split = splits.split_from_record(json.loads(cfg.read_text(encoding="utf-8")))
        side = side or "val"
        records, names = split.side(side), split.class_names
        info = {"data": str(cfg), "split": side, "run_split": split.as_dict(),
                "description": f"no data flag: {side} side of the run's data, read from {cfg}: {split.description}"}
    if not records:
        raise ValueError(f"no videos to evaluate in {info['description']}")
    return list(records), (list(names) if names is not None else None), info


def evaluate(args: Any, *, log: Callable[[str], None] | None = None) -> dict | None:
    """Run the evaluation described by parsed ``tsm-ds eval`` arguments (see :mod:`tsm_ds.cli.eval`).

    ``args`` carries the command's option attributes (checkpoint, labels, data / list / root /
    split, num_clips, num_crops, sampling, num_segments, img_size, average, batch_size, workers,
    max_clips, out, no_plot, trust_checkpoint: see :func:`load_for_inference`'s ``trust``); ``log`` receives rank 0's progress lines (checkpoint notes, the
    protocol), default: the ``tsm_ds.inference`` logger.

    Returns the metrics dict on rank 0 (also written to ``args.out``), None on other ranks.
    Raises ValueError / FileNotFoundError for bad checkpoints or data (see :func:`load_for_inference`).
    """
    from torch.utils.data import DataLoader
    from torch.utils.data.distributed import DistributedSampler

    from tsm_ds.data.dataset import VideoClipDataset
    from tsm_ds.engine.evaluate import gather_predictions
    from tsm_ds.inference.report import write_eval_results
    from tsm_ds.inference.views import MultiViewForward, view_protocol

    rank, world = init_distributed(require_group=False)
    protocol = view_protocol(args.num_clips, args.num_crops, args.sampling,
                             full_res=getattr(args, "full_res", None), resize=getattr(args, "resize", None))
    loaded = load_for_inference(args.checkpoint, labels=args.labels, trust=bool(getattr(args, "trust_checkpoint", False)),
                                **checkpoint_overrides(args))
    if torch.cuda.is_available():
        loaded.model.cuda()
    num_segments = int(loaded.config.get("num_segments", args.num_segments or 8))
    args.img_size = resolve_img_size(args.img_size, loaded)
    records, ds_names, data_info = load_records(args)
    mapping = map_labels(ds_names, loaded.class_names)
    dataset = VideoClipDataset(records, num_segments=num_segments, img_size=args.img_size,
                               **protocol.dataset_kwargs())
    sampler = DistributedSampler(dataset, shuffle=False) if world > 1 else None
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, shuffle=False,
                        num_workers=args.workers)
    if rank == 0:
        log = log or logging.getLogger("tsm_ds.inference").info
        for note in loaded.notes:
            log(f"note: {note}")
        log(f"checkpoint: {loaded.path} ({loaded.source})")
        log(f"data: {data_info['description']}")
        log(f"eval: {len(records)} videos, {protocol.describe()}, T={num_segments}, "
            f"{args.img_size}px, average={args.average}, world size {world}")
    forward = MultiViewForward(protocol.num_views, args.average, max_clips=args.max_clips)
    indices, scores, labels = gather_predictions(loaded.model, loader, forward=forward)
    if len(indices) != len(dataset):
        raise RuntimeError(f"scored {len(indices)} of {len(dataset)} videos")
    metrics = None
    if rank == 0:
        labels_np = labels.numpy()
        if mapping is not None:
            labels_np = [mapping[i] for i in labels_np]
        meta = {"checkpoint": str(args.checkpoint), "checkpoint_file": loaded.path, "checkpoint_kind": loaded.source,
                "model_config": loaded.config, "protocol": protocol.describe(),
                "num_clips": protocol.num_clips, "num_crops": protocol.num_crops,
                "sampling": protocol.sampling, "num_segments": num_segments, "img_size": args.img_size,
                "world_size": world, "data": data_info["data"], "split": data_info["split"],
                "data_description": data_info["description"]}
        metrics = write_eval_results(args.out, scores=scores.numpy(), labels=labels_np,
                                     class_names=loaded.class_names,
                                     paths=[str(records[i].path) for i in indices.tolist()],
                                     indices=indices.numpy(), average=args.average, meta=meta,
                                     plot=not args.no_plot)
    if world > 1:
        import torch.distributed as dist

        dist.barrier()
    return metrics
