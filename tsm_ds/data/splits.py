"""Train / validation records from the data flags of ``tsm_ds/train.py``.

Data: ``--data DIR`` is a class-per-folder tree (``DIR/train`` + ``DIR/val`` when present, else a
per-class hold-out of ``--val-fraction``); the project's real clips (a ``videos`` folder next to a
``manifest.csv``) are split by ``source_group`` (per class, the last group is validation);
``--train-list/--val-list`` read ``path label`` list files (relative to ``--data`` when given).
Without any of these, ``../shared/data/videos`` (or ``$TSM_DS_DATA``) is used when present, else
the generated demo dataset (:mod:`tsm_ds.data.synthetic`).
"""
from __future__ import annotations

import os
from pathlib import Path

#: the project's real clips, next to a source checkout (absent in a user's clone or an install)
DEFAULT_SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "videos"


def _find_manifest_root(data: Path) -> Path | None:
    for cand in (data, data.parent):
        if (cand / "manifest.csv").is_file():
            return cand
    return None


def build_datasets(args, log) -> tuple:
    """(train_set, val_set, class_names, description) from the data flags.

    ``args`` is the parsed ``tsm_ds/train.py`` namespace (data, model and seed flags); ``log`` a
    ``logging.Logger``. The demo fallback sets ``args.train_list`` / ``val_list`` / ``no_flip``.

    Raises:
        ValueError: no data given and neither ../shared nor the demo generator is available.
        FileNotFoundError: a given path does not exist.
    """
    from tsm_ds.data import records
    from tsm_ds.data.dataset import VideoClipDataset

    data = Path(args.data) if args.data else None
    if data is None and not args.train_list:
        env = os.environ.get("TSM_DS_DATA")
        if env:
            data = Path(env)
        elif DEFAULT_SHARED.is_dir():
            data = DEFAULT_SHARED
        else:
            try:
                from tsm_ds.data.synthetic import make_demo_dataset
            except ImportError:
                raise ValueError(
                    f"no training data: pass --data DIR (one folder per class of video files) or "
                    f"--train-list/--val-list, or set TSM_DS_DATA; the project's real clips are expected "
                    f"at {DEFAULT_SHARED}, which does not exist on this machine")
            root = Path(args.output_dir) / "demo_data"
            log.info("no data given and %s absent: generating the demo dataset in %s", DEFAULT_SHARED, root)
            info = make_demo_dataset(root, seed=args.seed, train_per_class=args.demo_clips,
                                     val_per_class=max(2, args.demo_clips // 4))
            args.train_list, args.val_list = info["train_list"], info["val_list"]
            args.classes_list = list(info["classes"])
            if not args.no_flip:
                log.info("demo dataset: direction classes, so horizontal flip is turned off")
                args.no_flip = True
            if args.shift == "none":
                log.info("demo dataset: TSN (--shift none) cannot tell its classes apart; training anyway")
    if data is not None and not data.exists():
        raise FileNotFoundError(f"--data {data}: no such directory")
    if args.train_list:
        tr = records.read_video_list(args.train_list, root=str(data) if data else None)
        va = records.read_video_list(args.val_list, root=str(data) if data else None) if args.val_list else []
        names = getattr(args, "classes_list", None)
        if names is None and args.classes:
            names = [ln.strip() for ln in Path(args.classes).read_text().splitlines() if ln.strip()]
        if names is None:
            n = 1 + max(r.label for r in list(tr) + list(va))
            names = [f"class_{i}" for i in range(n)]
        desc = f"list files {args.train_list} / {args.val_list}"
    elif _find_manifest_root(data) is not None and data.name == "videos":
        tr, va, names = records.split_by_source_group(_find_manifest_root(data))
        desc = f"{data}: split by source_group (manifest.csv; per class the last group is validation)"
    elif (data / "train").is_dir() and (data / "val").is_dir():
        tr, names = records.read_class_folders(data / "train")
        va, vnames = records.read_class_folders(data / "val")
        if list(vnames) != list(names):
            raise ValueError(f"{data}/train and {data}/val have different class folders: {names} vs {vnames}")
        desc = f"{data}/train and {data}/val"
    else:
        allr, names = records.read_class_folders(data)
        tr, va = [], []
        for c in range(len(names)):
            rs = sorted((r for r in allr if r.label == c), key=lambda r: r.path)
            k = int(round(len(rs) * args.val_fraction)) if len(rs) > 1 else 0
            tr += rs[: len(rs) - k]
            va += rs[len(rs) - k:]
        desc = f"{data}: per-class hold-out of the last {args.val_fraction:.0%} by file name"
    common = dict(num_segments=args.num_segments, img_size=args.img_size, seed=args.seed)
    train_set = VideoClipDataset(list(tr), mode="train", flip=not args.no_flip, **common)
    val_set = VideoClipDataset(list(va), mode="val", **common) if len(va) else None
    return train_set, val_set, list(names), desc
