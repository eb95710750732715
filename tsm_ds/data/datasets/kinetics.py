"""Kinetics 400 / 600 / 700, read from the CSV files of each release.

Annotations: ``train.csv``, ``validate.csv`` (or ``val.csv`` / ``validation.csv``) and ``test.csv``
(also with a prefix, e.g. ``kinetics_train.csv``, ``kinetics-400_val.csv``) in the root,
``annotations/``, ``kinetics<N>/``, ``kinetics-<N>/``, ``kinetics<N>_2020/`` or ``labels/``. Each has
a header ``label,youtube_id,time_start,time_end,split[,is_cc]``; test files may have no ``label``
column (their clips get label -1).

Videos: the common downloaders' names ``<youtube_id>_<time_start:06d>_<time_end:06d>.<ext>``
(:func:`tsm_ds.data.records.kinetics_clip_name`), anywhere below the root (``train/<class>/``,
``val/``, flat...): the root is walked once.

Classes: a label map (one class a line, e.g. ``kinetics400_labels.txt``; names compared raw, then
in the official folder-name form of :func:`~tsm_ds.data.records.normalize_class_name`), else the
training CSV's class names sorted as written, which is the order of the official label maps of
the releases (so official checkpoints' class indices apply). How many listed clips are missing on
disk is reported; downloads of Kinetics always miss some.

Source: the Kinetics releases' CSV files; the official TSM ``tools/gen_label_kinetics.py`` for the
label-map order and the class-name normalisation.
"""
from __future__ import annotations

import csv
import io
import re
from pathlib import Path

from tsm_ds.data.records import kinetics_clip_name, normalize_class_name, read_label_map

from ._common import Collector, log, read_text, video_index

__all__ = ["KINETICS_VERSIONS", "read_kinetics", "kinetics_csv_files"]

#: the releases and their class counts
KINETICS_VERSIONS = (400, 600, 700)

_SIDE_OF = {"train": "train", "validate": "val", "val": "val", "validation": "val", "test": "test"}
_STEM = re.compile(r"(?:^|[_\-.])(train|validate|validation|val|test)$", re.I)


def kinetics_csv_files(root: Path, version: int) -> dict[str, Path]:
    """``{"train" | "val" | "test": csv}`` found under ``root`` (the folders and names of the module
    docstring; the first folder holding a training CSV is used).

    Raises:
        FileNotFoundError: no training CSV (the folders looked in are given).
        ValueError: two CSVs of one side in that folder (both named).
    """
    dirs = ["", "annotations", f"kinetics{version}", f"kinetics-{version}", f"kinetics{version}_2020",
            f"kinetics-{version}_2020", "labels"]
    for d in dirs:
        folder = root / d
        if not folder.is_dir():
            continue
        found: dict[str, Path] = {}
        for p in sorted(folder.glob("*.csv")):
            m = _STEM.search(p.stem)
            if not m:
                continue
            side = _SIDE_OF[m.group(1).lower()]
            if side in found:
                raise ValueError(f"{folder}: two {side} CSV files, {found[side].name} and {p.name}: keep one")
            found[side] = p
        if "train" in found:
            return found
    raise FileNotFoundError(f"{root}: no Kinetics training CSV (train.csv, kinetics_train.csv, ...) in "
                            f"{', '.join(d or '.' for d in dirs)}")


def _rows(path: Path):
    """(line, row dict, has_label) of a Kinetics CSV, CRLF / BOM tolerated."""
    text = read_text(path).replace("\r\n", "\n").replace("\r", "\n")
    reader = csv.DictReader(io.StringIO(text))
    fields = [f.strip() for f in (reader.fieldnames or [])]
    reader.fieldnames = fields
    need = {"youtube_id", "time_start", "time_end"}
    if not need <= set(fields):
        raise ValueError(f"{path}:1: the header must name label,youtube_id,time_start,time_end,split; got "
                         f"{','.join(fields) or 'nothing'}")
    for row in reader:
        yield reader.line_num, row, "label" in fields


def read_kinetics(root: Path, *, version: int, label_map: str | None = None):
    """Kinetics-``version`` (400, 600, 700) under ``root`` (layout: module docstring).

    Args:
        root: the dataset folder.
        version: 400, 600 or 700 (the names ``kinetics400`` ...).
        label_map: a label-map file fixing the class order (None: the training CSV's classes,
            sorted as written).

    Returns:
        :class:`~tsm_ds.data.records.Split` (kind ``"dataset"``): train / val / test (label -1 when
        the test CSV has no label) from the CSVs; clips not on disk are left out and named in
        ``missing`` (``<youtube_id>_<start>_<end>``), repeated clips in ``duplicates``.

    Raises:
        FileNotFoundError: no training CSV; the label map does not exist.
        ValueError: a class not in the label map (or, without one, a validation class the training
            CSV does not have), a bad header or time (each names the file and the line).
    """
    files = kinetics_csv_files(root, version)
    if label_map is not None:
        names = read_label_map(label_map)
        source = str(label_map)
    else:
        seen: dict[str, None] = {}
        for line, row, has_label in _rows(files["train"]):
            if not has_label:
                raise ValueError(f"{files['train']}:1: the training CSV has no label column")
            seen.setdefault((row["label"] or "").strip(), None)
        names = sorted(n for n in seen if n)
        source = f"the classes of {files['train'].name}"
    exact = {n: i for i, n in enumerate(names)}
    normal = {normalize_class_name(n): i for i, n in enumerate(names)}
    videos = video_index([root], recursive=True)
    got = Collector()
    for side in ("train", "val", "test"):
        path = files.get(side)
        if path is None:
            if side == "val":
                log.warning("kinetics%d: %s has no validation CSV: no validation side", version, root)
            continue
        for line, row, has_label in _rows(path):
            try:
                stem = kinetics_clip_name(row["youtube_id"].strip(), row["time_start"], row["time_end"], "")
            except (TypeError, ValueError, AttributeError):
                got_values = ", ".join(repr(row.get(k)) for k in ("youtube_id", "time_start", "time_end"))
                raise ValueError(f"{path}:{line}: youtube_id / time_start / time_end not readable: "
                                 f"{got_values}") from None
            label = -1
            text = (row.get("label") or "").strip() if has_label else ""
            if text:
                label = exact.get(text, normal.get(normalize_class_name(text), -2))
                if label == -2:
                    raise ValueError(f"{path}:{line}: the class {text!r} is not in {source}")
            elif side != "test":
                raise ValueError(f"{path}:{line}: clip {stem} has no label")
            got.add(side, stem, videos.get(stem), label)
    if len(names) != version:
        log.warning("kinetics%d: %d classes, from %s (the release has %d)", version, len(names), source, version)
    return got.split(name=f"kinetics{version}", root=root, class_names=names,
                     described=f"CSVs {files['train'].parent}, classes from {source}", dataset_split=None,
                     frame_template=None, flip=True)
