"""The datasets TSM is trained on, read as they are distributed (``--dataset NAME --data ROOT``).

One reader per dataset, each returning the :class:`~tsm_ds.data.records.Split` (kind
``"dataset"``) that training, evaluation and ``tsm-ds prepare`` use for any data:

==============  =========================================================  =====  ============
name            annotations (layout: the reader's module)                  flip   splits
==============  =========================================================  =====  ============
somethingv1     ``something-something-v1-*.csv``, frames ``<id>/00001.jpg``  no     -
somethingv2     ``something-something-v2-*.json`` (or ``labels/*.json``),     no     -
                videos ``<id>.webm``
jester          ``jester-v1-*.csv``, frames ``<id>/00001.jpg``               no     -
ucf101          ``classInd.txt``, ``trainlist0N.txt`` / ``testlist0N.txt``   yes    1, 2, 3
hmdb51          ``<class>_test_splitN.txt``                                 yes    1, 2, 3
kinetics400     ``train.csv`` / ``validate.csv`` / ``test.csv``,              yes    -
/600/700        clips ``<youtube_id>_<start>_<end>.mp4``
==============  =========================================================  =====  ============

What every reader does with what real releases get wrong: a listed video that is not on disk is
left out of the records (so it never reaches the loader and never counts against the data-loss
budget ``--max-bad-fraction``, which is for files the loader cannot read) and is counted and
named: one warning per side on the ``tsm_ds.data.datasets`` logger, and ``Split.missing``; an id
listed again (in the same file or a later one: train, validation, test) keeps its first listing
and the repeats are counted and named (``Split.duplicates``); a label that is not in the label map
is a ValueError naming the file and the line; CRLF line ends and UTF-8 byte-order marks are read
as plain text. Test ids without labels become ``Split.test`` (label -1, for ``tsm-ds predict``).

Flip: Something-Something and Jester classes say left and right ("Pushing something from left to
right"), so the official TSM code trains them without horizontal flip (``main.py``:
``flip=False if 'something' in args.dataset or 'jester' in args.dataset``); their splits carry
``flip=False`` and the train command follows it.

A folder written by ``tsm-ds prepare --dataset NAME SRC OUT`` keeps the split
(:mod:`tsm_ds.data.datasets.prepared`): ``--data OUT`` reads it back without the annotation files;
with ``--shards``, the shards' ``samples.json`` records it too (:func:`tsm_ds.data.shards.shard_split`),
so ``--data OUT/shards`` (or their copy on S3) trains the same split.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from tsm_ds.data.records import Split

from .prepared import PREPARED_FILE, is_prepared, prepared_sides, read_prepared, write_prepared_split

__all__ = ["DatasetSpec", "DATASETS", "DATASET_NAMES", "read_dataset", "PREPARED_FILE", "is_prepared",
           "prepared_sides", "read_prepared", "write_prepared_split"]


@dataclass(frozen=True)
class DatasetSpec:
    """What the project knows of one dataset.

    Attributes:
        name: the ``--dataset`` value.
        title: the dataset's own name.
        flip: False when a horizontal flip changes the class (trained without it).
        splits: the numbered splits (``--dataset-split``), empty when the release has one split.
        frame_template: the release's frame file names when it ships frame folders, else None.
        num_classes: classes of the full release.
        official: the official TSM settings for it (``docs/datasets.md`` says where each comes from),
            empty where the official code gives none.
    """

    name: str
    title: str
    flip: bool
    splits: tuple[int, ...] = ()
    frame_template: str | None = None
    num_classes: int | None = None
    official: dict = field(default_factory=dict)


_SS = {"num_segments": 8, "lr": 0.01, "batch_size": 64, "lr_steps": (20, 40), "epochs": 50, "dropout": 0.5,
       "init": "ImageNet", "partial_bn": False}
_KIN = {"num_segments": 8, "lr": 0.02, "batch_size": 128, "lr_steps": (20, 40), "epochs": 50, "dropout": 0.5,
        "init": "ImageNet", "partial_bn": False}
_UCF = {"num_segments": 8, "lr": 0.001, "batch_size": 64, "lr_steps": (10, 20), "epochs": 25, "dropout": 0.8,
        "init": "TSM_kinetics_RGB_resnet50_shift8_blockres_avg_segment8_e50.pth", "partial_bn": True}

#: name -> :class:`DatasetSpec`, the choices of ``--dataset``
DATASETS: dict[str, DatasetSpec] = {s.name: s for s in (
    DatasetSpec("somethingv1", "Something-Something v1", False, frame_template="{:05d}.jpg", num_classes=174,
                official=_SS),
    DatasetSpec("somethingv2", "Something-Something v2", False, num_classes=174, official=_SS),
    DatasetSpec("jester", "Jester", False, frame_template="{:05d}.jpg", num_classes=27),
    DatasetSpec("ucf101", "UCF101", True, splits=(1, 2, 3), num_classes=101, official=_UCF),
    DatasetSpec("hmdb51", "HMDB51", True, splits=(1, 2, 3), num_classes=51),
    DatasetSpec("kinetics400", "Kinetics-400", True, num_classes=400, official=_KIN),
    DatasetSpec("kinetics600", "Kinetics-600", True, num_classes=600),
    DatasetSpec("kinetics700", "Kinetics-700", True, num_classes=700),
)}

#: the ``--dataset`` names, in table order
DATASET_NAMES = tuple(DATASETS)


def _check_options(name: str, root: str | os.PathLike, *, split, frame_template, label_map) -> Path:
    """``root`` made absolute, after the checks of :func:`read_dataset`'s options (its Raises)."""
    if name not in DATASETS:
        raise ValueError(f"--dataset {name!r}: not one of {', '.join(DATASET_NAMES)}")
    spec = DATASETS[name]
    root = Path(os.path.abspath(os.path.expanduser(os.fspath(root))))
    if not root.exists():
        raise FileNotFoundError(f"--dataset {name}: the data folder {root} does not exist")
    if not root.is_dir():
        raise NotADirectoryError(f"--dataset {name}: {root} is not a folder")
    if split is not None and not spec.splits:
        raise ValueError(f"--dataset-split {split}: {spec.title} has one split (numbered splits: ucf101, hmdb51)")
    if frame_template is not None and spec.frame_template is None:
        raise ValueError(f"--frame-template: {spec.title} is read from videos, not frame folders (frame folders: "
                         f"somethingv1, jester)")
    if label_map is not None and not name.startswith("kinetics"):
        raise ValueError(f"--classes: {spec.title} fixes its classes in its own annotation files (a label map is "
                         f"for kinetics400/600/700)")
    return root


def read_dataset(name: str, root: str | os.PathLike, *, split: int | None = None, frame_template: str | None = None,
                 label_map: str | os.PathLike | None = None) -> Split:
    """The :class:`~tsm_ds.data.records.Split` of dataset ``name`` under ``root``: its release's
    annotation files (the reader of that dataset), or the lists of a folder ``tsm-ds prepare
    --dataset`` wrote (:func:`~tsm_ds.data.datasets.prepared.read_prepared`).

    Args:
        name: one of :data:`DATASET_NAMES`.
        root: the dataset folder (``--data``).
        split: the numbered split (``--dataset-split``, UCF101 / HMDB51 only; default 1).
        frame_template: frame file names (``--frame-template``, Something-Something v1 / Jester only;
            default ``{:05d}.jpg``).
        label_map: the class order, one name a line (``--classes``; Kinetics only; default: the
            training CSV's classes sorted, the order of the official label maps).

    Returns:
        the split (kind ``"dataset"``, ``dataset`` = name): train, val, test (label -1) records;
        ids missing on disk and duplicate ids named per side (see the module docstring).

    Raises:
        FileNotFoundError: ``root`` or its annotation files are absent (named).
        NotADirectoryError: ``root`` is a file.
        ValueError: an unknown name; an option the dataset does not have (``split`` outside 1-3 or
            for a dataset without numbered splits, ``frame_template`` for video datasets,
            ``label_map`` for non-Kinetics); a prepared folder of another dataset or split; errors in
            the annotation files, naming the file and the line.
    """
    from . import kinetics, something, ucf_hmdb

    root = _check_options(name, root, split=split, frame_template=frame_template, label_map=label_map)
    if is_prepared(root):
        if label_map is not None:
            raise ValueError(f"--classes: the prepared folder {root} fixes its classes in its classes.txt; drop "
                             f"--classes")
        sp = read_prepared(root)
        if sp.dataset != name:
            raise ValueError(f"{root / PREPARED_FILE}: a prepared {sp.dataset} folder, not {name}")
        if split is not None and int(split) != sp.dataset_split:
            raise ValueError(f"{root / PREPARED_FILE}: prepared from split {sp.dataset_split}, not {split}")
        return sp
    if name == "somethingv2":
        return something.read_somethingv2(root)
    if name == "somethingv1":
        return something.read_somethingv1(root, frame_template=frame_template)
    if name == "jester":
        return something.read_jester(root, frame_template=frame_template)
    if name == "ucf101":
        return ucf_hmdb.read_ucf101(root, split=split)
    if name == "hmdb51":
        return ucf_hmdb.read_hmdb51(root, split=split)
    return kinetics.read_kinetics(root, version=int(name[len("kinetics"):]), label_map=label_map)
