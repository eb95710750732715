"""One resolver of train / validation records, shared by ``tsm-ds train`` and ``tsm-ds eval``.

:func:`resolve_split` turns data arguments into a :class:`Split`; the kinds, tried in this order:

- ``"lists"``: ``train_list`` (+ ``val_list``) files of ``path label`` lines, relative to ``data``
  when given, else to the list file's folder; class names from ``classes`` (one per line);
- ``"manifest"``: the project's real clips, ``data`` = the folder holding ``manifest.csv`` and
  ``videos/`` (../shared/data) or that ``videos/`` folder itself: split by ``source_group``
  (:func:`tsm_ds.data.records.split_by_source_group`; per class the last group is validation);
- ``"train_val_folders"``: ``data/train/<class>/...`` and ``data/val/<class>/...``;
- ``"holdout"``: a class-folder tree ``data/<class>/...``; per class the last ``val_fraction`` of
  the files by path (rounded; classes of one video keep it for training) are validation.
- ``"shards"``: ``data`` = a shard folder or ``s3://bucket/prefix`` written by ``tsm-ds prepare
  --shards`` (:mod:`tsm_ds.data.shards`); split as ``"holdout"`` splits the packs it was made from,
  so the same clips are train / validation as with ``--data <prepare output>``.
- ``"dataset"``: ``dataset`` names a distributed dataset (somethingv2, ucf101, kinetics400, ...) whose
  own annotation files under ``data`` give the split (:func:`tsm_ds.data.datasets.read_dataset`); also
  ``data`` = a folder ``tsm-ds prepare --dataset`` wrote (its ``dataset.json``), or its shards (their
  ``samples.json`` records the split), with or without ``dataset``. Tried before the other kinds.

:meth:`Split.as_dict` records the arguments (absolute paths) and the kind; :func:`split_from_record`
resolves them again from a run's ``config.json``, which is how ``tsm-ds eval --checkpoint RUN/...``
finds the run's validation clips. Nothing here falls back to other data: :func:`default_data`
(../shared/data/videos) and :func:`demo_split` (the generated demo dataset)
are called explicitly by the train command, which logs its choice.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

from tsm_ds.data.records import Split, VideoRecord

__all__ = ["Split", "SPLIT_KINDS", "DEFAULT_SHARED", "resolve_split", "split_from_record", "default_data",
           "demo_split", "manifest_root", "build_datasets"]

log = logging.getLogger(__name__)

#: the project's real clips, next to a source checkout (absent in a user's clone or an install)
DEFAULT_SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "videos"

SPLIT_KINDS = ("lists", "manifest", "train_val_folders", "holdout", "shards", "dataset")


def _abs(p: str | os.PathLike | None) -> Path | None:
    return Path(os.path.abspath(os.path.expanduser(os.fspath(p)))) if p is not None else None


def manifest_root(data: str | os.PathLike) -> Path | None:
    """The folder holding ``manifest.csv`` when ``data`` is that folder (with a ``videos/``
    subfolder) or its ``videos/`` folder; else None."""
    data = Path(data)
    if (data / "manifest.csv").is_file() and (data / "videos").is_dir():
        return data
    if data.name == "videos" and (data.parent / "manifest.csv").is_file():
        return data.parent
    return None


def _class_names_file(path: Path) -> list[str]:
    from tsm_ds.data.records import read_label_map

    if not path.is_file():
        raise FileNotFoundError(f"class-name file {path} does not exist")
    return read_label_map(path)


def _holdout(records: list[VideoRecord], num_classes: int, val_fraction: float
             ) -> tuple[list[VideoRecord], list[VideoRecord]]:
    train, val = [], []
    for c in range(num_classes):
        rs = sorted((r for r in records if r.label == c), key=lambda r: r.path)
        k = int(round(len(rs) * val_fraction)) if len(rs) > 1 else 0
        train += rs[: len(rs) - k]
        val += rs[len(rs) - k:]
    return train, val


def _shards_split(data, *, classes, val_fraction: float, dataset: str | None, dataset_split: int | None,
                  frame_template: str | None) -> Split:
    """Kind ``"shards"`` (per-class hold-out), or ``"dataset"`` when the shards record a dataset's split."""
    from tsm_ds.data import shards

    root = str(data).rstrip("/") if str(data).startswith("s3://") else str(_abs(data))
    allr, names = shards.shard_records(root)
    info = shards.shard_split(root)
    if info is not None or dataset is not None:   # written by tsm-ds prepare --dataset NAME --shards
        return _shard_dataset_split(root, allr, names, info, dataset=dataset, dataset_split=dataset_split,
                                    frame_template=frame_template, classes=classes)
    if classes is not None:
        names = _class_names_file(_abs(classes))
    train, val = _holdout(allr, len(names), val_fraction)
    if not train:
        raise ValueError(f"{root}: no training samples in the shards")
    return Split(train, val, list(names), "shards",
                 f"{root}: shards, per-class hold-out of the last {val_fraction:.0%} by pack path",
                 data=root, classes=str(_abs(classes)) if classes else None, val_fraction=val_fraction)


def _dataset_split(data, *, train_list, val_list, classes, dataset: str | None, dataset_split: int | None,
                   frame_template: str | None) -> Split:
    """Kind ``"dataset"``: ``dataset``'s own annotation files under ``data``, or a folder ``tsm-ds prepare
    --dataset`` wrote (:mod:`tsm_ds.data.datasets`)."""
    from tsm_ds.data import datasets

    if dataset is not None and data is None:
        raise ValueError(f"--dataset {dataset}: give --data, the folder holding the dataset's annotation files "
                         f"and videos (docs/datasets.md)")
    if train_list is not None or val_list is not None:
        raise ValueError(f"--dataset {dataset}: the split comes from the dataset's own annotation files; drop "
                         f"--train-list / --val-list")
    if dataset is None:   # a folder tsm-ds prepare --dataset wrote
        if classes is not None:
            raise ValueError(f"{data}: a prepared dataset folder fixes its classes in its classes.txt; drop "
                             f"--classes")
        return datasets.read_prepared(data)
    sp = datasets.read_dataset(dataset, data, split=dataset_split, frame_template=frame_template, label_map=classes)
    sp.classes = str(_abs(classes)) if classes is not None else None
    return sp


def _shard_dataset_split(root: str, records: list[VideoRecord], names: list[str], info: dict | None, *,
                         dataset: str | None, dataset_split: int | None, frame_template: str | None,
                         classes) -> Split:
    """The split a shard folder of ``tsm-ds prepare --dataset NAME --shards`` records
    (:func:`tsm_ds.data.shards.shard_split`): its train / val / test keys, in their order."""
    from tsm_ds.data.shards import SAMPLES_FILE, SHARD_SEP

    if info is None:
        raise ValueError(f"--dataset {dataset}: the shards {root} hold no dataset split (written without --dataset); "
                         f"write them with tsm-ds prepare --dataset {dataset} SRC OUT --shards MB, or drop --dataset")
    name = str(info.get("dataset"))
    where = f"{root}/{SAMPLES_FILE}"
    if dataset is not None and dataset != name:
        raise ValueError(f"{where}: shards of {name}, not {dataset}")
    if dataset_split is not None and int(dataset_split) != info.get("dataset_split"):
        raise ValueError(f"{where}: shards of split {info.get('dataset_split')}, not {dataset_split}")
    if classes is not None or frame_template is not None:
        raise ValueError(f"{where}: the shards of {name} fix their classes and hold packs; drop --classes / "
                         f"--frame-template")
    by_key = {r.path.split(SHARD_SEP, 1)[1]: r for r in records}
    sides = {}
    for side in ("train", "val", "test"):
        keys = [str(k) for k in info.get(side, [])]
        absent = [k for k in keys if k not in by_key]
        if absent:
            raise ValueError(f"{where}: the {side} keys {absent[:3]} are not samples of the shards")
        sides[side] = [by_key[k] for k in keys]
    if not sides["train"]:
        raise ValueError(f"{where}: no training samples in the {name} split")
    missing = {s: list(v) for s, v in dict(info.get("missing") or {}).items() if v}
    n = info.get("dataset_split")
    desc = (f"{root}: {name}{f' split {n}' if n else ''} shards written by tsm-ds prepare --dataset "
            f"({', '.join(f'{len(v)} {s}' for s, v in sides.items() if v)}; "
            f"{sum(len(v) for v in missing.values())} listed videos missing or unreadable)")
    return Split(sides["train"], sides["val"], list(names), "dataset", desc, data=root, dataset=name,
                 dataset_split=n, flip=bool(info.get("flip", True)), test=sides["test"], missing=missing)


def resolve_split(*, data: str | os.PathLike | None = None, train_list: str | os.PathLike | None = None,
                  val_list: str | os.PathLike | None = None, classes: str | os.PathLike | None = None,
                  val_fraction: float = 0.2, dataset: str | None = None, dataset_split: int | None = None,
                  frame_template: str | None = None) -> Split:
    """Train / validation records from data arguments (the kinds and their order: module docstring).

    Args:
        data: a folder: manifest root or its ``videos/``, ``train/`` + ``val/`` class folders, or a
            class-folder tree; with list files, the folder their paths are relative to.
        train_list, val_list: ``path label`` list files (``val_list`` needs ``train_list``).
        classes: class names, one per line (line = label). For list files: their names (default
            ``class_<i>``); for class folders: the label order (default: sorted folder names); for a
            manifest it must list the manifest's classes in sorted order.
        val_fraction: per-class hold-out of a plain class-folder tree, in [0, 1).
        dataset, dataset_split, frame_template: a distributed dataset under ``data``
            (:func:`tsm_ds.data.datasets.read_dataset`; ``classes`` is its label map, Kinetics only).

    Returns:
        :class:`Split`; record paths are absolute when ``data`` / the list files are given so.

    Raises:
        FileNotFoundError: ``data``, a list file or the class-name file does not exist (named).
        NotADirectoryError: ``data`` is a file.
        ValueError: nothing given, ``val_list`` without ``train_list``, a bad ``val_fraction``, a
            tree without class folders or videos (named), ``train/`` and ``val/`` with different
            classes, a malformed list line; ``dataset`` without ``data`` or with list files, the
            dataset readers' errors (file and line).
    """
    from tsm_ds.data import datasets
    from tsm_ds.data import records as rec

    if not 0.0 <= float(val_fraction) < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1); got {val_fraction}")
    if val_list is not None and train_list is None:
        raise ValueError(f"validation list {val_list} given without a training list")
    if dataset is None and (dataset_split is not None or frame_template is not None):
        raise ValueError("--dataset-split / --frame-template belong to --dataset NAME (ucf101, hmdb51 / "
                         "somethingv1, jester)")
    from tsm_ds.data import shards

    if data is not None and train_list is None and shards.is_shard_source(data):
        return _shards_split(data, classes=classes, val_fraction=float(val_fraction), dataset=dataset,
                             dataset_split=dataset_split, frame_template=frame_template)
    if dataset is not None or (train_list is None and data is not None and datasets.is_prepared(data)):
        return _dataset_split(data, train_list=train_list, val_list=val_list, classes=classes, dataset=dataset,
                              dataset_split=dataset_split, frame_template=frame_template)
    d, tl, vl, cl = _abs(data), _abs(train_list), _abs(val_list), _abs(classes)
    if d is None and tl is None:
        raise ValueError("no data given: a data folder (class folders, train/ + val/, or a manifest.csv "
                         "root) or a training list file")
    if d is not None and not d.exists():
        raise FileNotFoundError(f"data folder {data} does not exist")
    if d is not None and not d.is_dir():
        raise NotADirectoryError(f"data {data} is not a folder")
    names = _class_names_file(cl) if cl is not None else None
    args = dict(data=str(d) if d else None, train_list=str(tl) if tl else None, val_list=str(vl) if vl else None,
                classes=str(cl) if cl else None, val_fraction=float(val_fraction))
    if tl is not None:
        for f in (tl, vl):
            if f is not None and not f.is_file():
                raise FileNotFoundError(f"list file {f} does not exist")
        train = rec.read_video_list(tl, root=d)
        val = rec.read_video_list(vl, root=d) if vl is not None else []
        if names is None:
            labels = [r.label for r in train + val]
            names = [f"class_{i}" for i in range(1 + max(labels, default=0))]
        kind, where = "lists", (f"list files {tl} / {vl}" if vl else f"list file {tl} (no validation list)") + (
            f" (paths relative to {d})" if d else "")
    elif manifest_root(d) is not None:
        train, val, names_m = rec.split_by_source_group(manifest_root(d))
        if names is not None and list(names) != list(names_m):
            raise ValueError(f"{cl} names {names}, the manifest of {d} has the classes {names_m}")
        names = names_m
        kind, where = "manifest", (f"{d}: split by source_group (manifest.csv; per class the last group is "
                                   f"validation)")
    elif (d / "train").is_dir() and (d / "val").is_dir():
        train, names_t = rec.read_class_folders(d / "train", class_names=names)
        val, names_v = rec.read_class_folders(d / "val", class_names=names)
        if names is None and list(names_v) != list(names_t):
            raise ValueError(f"{d}/train and {d}/val have different class folders: {names_t} vs {names_v}")
        names = names_t
        kind, where = "train_val_folders", f"{d}/train and {d}/val"
    else:
        allr, names = rec.read_class_folders(d, class_names=names)
        train, val = _holdout(allr, len(names), float(val_fraction))
        kind, where = "holdout", f"{d}: per-class hold-out of the last {val_fraction:.0%} by file name"
    if not train:
        raise ValueError(f"{where}: no training videos found")
    return Split(list(train), list(val), list(names), kind, where, **args)


def split_from_record(record: dict) -> Split:
    """Resolve a run's split again from its ``config.json`` (the whole record, or a schema-1 ``flags``).

    Uses the record's ``split`` (:meth:`Split.as_dict`, written by the train command; schema 1:
    ``flags["split"]``) when present, else the data fields ``data`` / ``train_list`` / ``val_list``
    / ``classes`` / ``val_fraction`` (schema 2: ``config.data``; schema 1: ``flags``).
    A clip count that differs from the recorded one (the data changed since) is logged as a warning.

    Raises:
        ValueError: the record names no data (a run of an older version on default data), or the
            data now resolves to another kind than recorded; errors of :func:`resolve_split`.
    """
    if "config" in record:   # schema 2 (tsm_ds.config.record)
        flags = record["config"].get("data", {})
        rec = record.get("split") or {}
    else:
        flags = record.get("flags", record)
        rec = flags.get("split") or {}
    src = rec or flags
    args = {k: src.get(k) for k in ("data", "train_list", "val_list", "classes")}
    if not args["data"] and not args["train_list"]:
        raise ValueError("the run's config records no data folder or list file (it used default data); "
                         "give the data to evaluate")
    for k in ("dataset", "dataset_split", "frame_template"):   # a --dataset run (older records have none)
        args[k] = src.get(k, flags.get(k))
    split = resolve_split(val_fraction=float(src.get("val_fraction") or 0.2), **args)
    if rec.get("kind") and rec["kind"] != split.kind:
        raise ValueError(f"the run's data was split as {rec['kind']!r}; {split.data or split.train_list} now "
                         f"resolves as {split.kind!r} (the data changed)")
    split.demo = bool(rec.get("demo", False))
    for side in ("train", "val"):
        n = rec.get(f"{side}_clips")
        if n is not None and n != len(split.side(side)):
            log.warning("the run had %d %s clips, %s now has %d (the data changed since)", n, side,
                        split.description, len(split.side(side)))
    return split


def default_data() -> tuple[Path | None, str]:
    """The data folder to train on when no data argument (nor ``$TSM_DS_DATA``, which the command
    line reads into ``data.data``) is given, and where it comes from: ``(DEFAULT_SHARED, "the
    project's shared clips")`` when that folder exists, else ``(None, "")``."""
    if DEFAULT_SHARED.is_dir():
        return DEFAULT_SHARED, "the project's shared clips"
    return None, ""


def demo_split(root: str | os.PathLike, *, seed: int = 0, clips: int = 48) -> Split:
    """Generate (or reuse) the motion-direction demo dataset under ``root`` and resolve it.

    ``clips`` training and ``max(2, clips // 4)`` validation clips per class
    (:func:`tsm_ds.data.synthetic.make_demo_dataset`). Returns a ``"lists"`` :class:`Split` with
    ``demo=True``: its classes are directions, so a horizontal flip changes the label.

    Raises:
        ValueError: the generator cannot be imported (the message says which data to give instead),
            or its own parameter errors.
    """
    try:
        from tsm_ds.data.synthetic import make_demo_dataset
    except ImportError as e:
        raise ValueError(
            f"no training data: pass --data DIR (one folder per class of video files) or "
            f"--train-list/--val-list, or set TSM_DS_DATA; the project's real clips are expected at "
            f"{DEFAULT_SHARED}, which does not exist on this machine, and the demo dataset generator "
            f"cannot be imported ({e})") from None
    log.info("demo dataset: generating (or reusing) %d + %d clips per class in %s", clips, max(2, clips // 4), root)
    info = make_demo_dataset(root, seed=seed, train_per_class=clips, val_per_class=max(2, clips // 4))
    split = resolve_split(train_list=info["train_list"], val_list=info["val_list"],
                          classes=Path(info["root"]) / "classes.txt")
    split.demo = True
    split.description = f"generated demo dataset (direction classes) in {info['root']}: {split.description}"
    return split


def build_datasets(split: Split, *, num_segments: int, img_size: int, seed: int = 0, flip: bool = True,
                   decode_device: str | None = None, reader_options=None) -> tuple:
    """(train_set, val_set) :class:`~tsm_ds.data.dataset.VideoClipDataset` of a :class:`Split`.

    Training clips: random TSN sampling, multi-scale crops, horizontal flip when ``flip``; items
    ``clip`` of shape (num_segments, 3, img_size, img_size). ``val_set`` is None when the split has
    no validation records. ``decode_device`` (``--decode-device``) and ``reader_options`` (the readers'
    caches, :class:`tsm_ds.data.options.ReaderOptions`): see the dataset.

    Raises ValueError: ``decode_device`` set for records that are not packed, or "cuda" without
    CUDA.
    """
    from tsm_ds.data.dataset import VideoClipDataset

    common = dict(num_segments=num_segments, img_size=img_size, seed=seed, decode_device=decode_device,
                  reader_options=reader_options)
    train_set = VideoClipDataset(list(split.train), mode="train", flip=flip, **common)
    val_set = VideoClipDataset(list(split.val), mode="val", **common) if split.val else None
    return train_set, val_set
