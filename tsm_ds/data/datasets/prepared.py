"""A dataset prepared by ``tsm-ds prepare --dataset NAME SRC OUT``: its split, kept in OUT.

OUT holds, besides the prepared files (:mod:`tsm_ds.data.prepare`) and ``all.txt``:

- ``train.txt``, ``val.txt``, ``test.txt``: the prepared files of each side (``path label``, or
  ``dir num_frames label`` for ``--mode frames``; test labels -1), paths relative to OUT;
- ``classes.txt``: the class names, line i = class i;
- :data:`PREPARED_FILE` (``dataset.json``): the dataset's name, numbered split and flip rule, the
  list files, and per side the ids missing in the source and the files prepare could not read.

So ``--data OUT`` (with or without ``--dataset NAME``) trains and evaluates the same split, with
the same flip rule, without the annotation files.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from tsm_ds.data.records import Split, read_label_map, read_video_list
from tsm_ds.utils.io import atomic_write_text

__all__ = ["PREPARED_FILE", "FORMAT", "is_prepared", "prepared_sides", "write_prepared_split", "read_prepared"]

#: the file that marks a prepared dataset folder
PREPARED_FILE = "dataset.json"
#: its ``format`` value
FORMAT = "tsm_ds.dataset"
_LISTS = {"train": "train.txt", "val": "val.txt", "test": "test.txt"}


def is_prepared(root: str | os.PathLike | None) -> bool:
    """True when ``root`` is a folder holding :data:`PREPARED_FILE`."""
    return root is not None and os.path.isfile(os.path.join(os.fspath(root), PREPARED_FILE))


def prepared_sides(split: Split, rows: list[dict]) -> tuple[dict[str, list[dict]], dict[str, list[str]]]:
    """Prepare's rows of each side of ``split`` (its ``train + val + test`` records were prepared in
    that order, one row each) and the source files that failed, per side.

    Returns:
        (``{side: rows not failed}``, ``{side: failed source paths}``, sides without failures left out).

    Raises:
        ValueError: ``rows`` are not the split's files in that order.
    """
    sides = {"train": split.train, "val": split.val, "test": split.test}
    records = [r for s in sides.values() for r in s]
    if len(rows) != len(records) or any(row["src"] != r.path for row, r in zip(rows, records)):
        raise ValueError(f"{len(rows)} prepared rows for {len(records)} records of {split.dataset}: not the split's "
                         f"files in its order")
    ok: dict[str, list[dict]] = {}
    failed: dict[str, list[str]] = {}
    i = 0
    for side, recs in sides.items():
        part = rows[i:i + len(recs)]
        i += len(recs)
        ok[side] = [row for row in part if row["status"] != "failed"]
        bad = [row["src"] for row in part if row["status"] == "failed"]
        if bad:
            failed[side] = bad
    return ok, failed


def write_prepared_split(out_root: str | os.PathLike, split: Split, rows: list[dict], *, mode: str,
                         source: str | os.PathLike) -> dict:
    """Write the split lists, ``classes.txt`` and :data:`PREPARED_FILE` of a prepared dataset.

    Args:
        out_root: the prepare output folder.
        split: the dataset's split (kind ``"dataset"``), whose ``train + val + test`` records were prepared
            in that order.
        rows: prepare's rows (:func:`tsm_ds.data.prepare.prepare_rows`), one per record, same order.
        mode: the prepare mode (``"frames"`` lists carry frame counts).
        source: the dataset folder prepared (recorded).

    Returns:
        the :data:`PREPARED_FILE` document.

    Raises:
        ValueError: ``rows`` and the split's records differ in number or files.
        OSError: OUT not writable.
    """
    out = Path(out_root)
    ok, failed = prepared_sides(split, rows)
    for side, kept in ok.items():
        lines = [f"{row['out']} {row['num_frames']} {row['label']}" if mode == "frames"
                 else f"{row['out']} {row['label']}" for row in kept]
        atomic_write_text(out / _LISTS[side], "\n".join(lines) + ("\n" if lines else ""))
    atomic_write_text(out / "classes.txt", "\n".join(split.class_names) + "\n")
    doc = {"format": FORMAT, "version": 1, "dataset": split.dataset, "dataset_split": split.dataset_split,
           "flip": split.flip, "mode": mode, "source": os.path.abspath(source), "classes": "classes.txt",
           "lists": dict(_LISTS), "missing": split.missing, "duplicates": split.duplicates, "failed": failed}
    atomic_write_text(out / PREPARED_FILE, json.dumps(doc, indent=1) + "\n")
    return doc


def read_prepared(root: str | os.PathLike) -> Split:
    """The split of a prepared dataset folder (module docstring).

    Returns:
        :class:`~tsm_ds.data.records.Split` of kind ``"dataset"``: the lists' records (paths under
        ``root``), its ``dataset`` / ``dataset_split`` / ``flip``; ``missing`` per side holds the ids
        missing in the source and the source files prepare could not read.

    Raises:
        FileNotFoundError: a list or ``classes.txt`` named by the file is absent.
        ValueError: :data:`PREPARED_FILE` is not such a file; a malformed list line (file and line).
    """
    root = Path(os.path.abspath(os.fspath(root)))
    path = root / PREPARED_FILE
    try:
        doc = json.loads(path.read_text(encoding="utf-8-sig"))
        if doc.get("format") != FORMAT:
            raise ValueError(f"format {doc.get('format')!r}")
        name, lists = str(doc["dataset"]), dict(doc["lists"])
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{path}: not a prepared dataset file ({e}); write it again with tsm-ds prepare "
                         f"--dataset") from None
    names = read_label_map(root / doc.get("classes", "classes.txt"))
    sides = {}
    for side in ("train", "val", "test"):
        f = root / lists.get(side, _LISTS[side])
        sides[side] = read_video_list(f, root=root) if f.is_file() else []
    if not sides["train"]:
        raise ValueError(f"{root}: the prepared {name} folder has no training files ({lists.get('train')})")
    missing = {s: list(doc.get("missing", {}).get(s, [])) + list(doc.get("failed", {}).get(s, []))
               for s in ("train", "val", "test")}
    missing = {s: v for s, v in missing.items() if v}
    n_split = doc.get("dataset_split")
    desc = (f"{root}: {name}{f' split {n_split}' if n_split else ''} prepared by tsm-ds prepare from "
            f"{doc.get('source')} ({', '.join(f'{len(v)} {s}' for s, v in sides.items() if v)}; "
            f"{sum(len(v) for v in missing.values())} listed videos missing or unreadable)")
    return Split(sides["train"], sides["val"], names, "dataset", desc, data=str(root), dataset=name,
                 dataset_split=n_split, frame_template=None, flip=bool(doc.get("flip", True)),
                 test=sides["test"], missing=missing, duplicates=dict(doc.get("duplicates", {})))
