"""UCF101 and HMDB51, read from their official split files (splits 1-3).

- UCF101 (``UCF101TrainTestSplits-RecognitionTask.zip``): ``classInd.txt`` (``1 ApplyEyeMakeup``:
  1-based index and class), ``trainlist0N.txt`` (``ApplyEyeMakeup/v_ApplyEyeMakeup_g08_c01.avi 1``)
  and ``testlist0N.txt`` (the path only: test lists carry no label), in the root or
  ``ucfTrainTestlist/``; videos ``<Class>/v_<Class>_gXX_cYY.avi`` in ``UCF-101/`` (as the
  ``UCF101.rar`` unpacks), ``UCF101/``, ``videos/`` or the root. The class is the folder: the folder
  ``HandstandPushups`` holds ``v_HandStandPushups_*.avi``, so the file name is not used; a class
  folder on disk spelled in another case is found too. The test list is the validation side.
- HMDB51 (``test_train_splits.rar``): ``<class>_test_split<N>.txt`` in
  ``testTrainMulti_7030_splits/`` (or ``splits/``, ``annotations/``, the root), one ``video.avi
  flag`` a line: 1 train, 2 test (the validation side), 0 unused in that split; videos
  ``<class>/<video>.avi`` in ``hmdb51_org/``, ``hmdb51/``, ``videos/`` or the root. Classes: the split
  files' class names, sorted.

Source: the UCF101 and HMDB51 releases' split files; the official TSM code reads both only through
its own lists of split 1 (``ops/dataset_config.py``), so split 1 is the default here.
"""
from __future__ import annotations

import re
from pathlib import Path

from ._common import Collector, find_file, log, text_lines

__all__ = ["read_ucf101", "read_hmdb51", "NUMBERED_SPLITS"]

#: the numbered splits of UCF101 and HMDB51
NUMBERED_SPLITS = (1, 2, 3)

_UCF_LIST_DIRS = ("", "ucfTrainTestlist", "UCF101TrainTestSplits-RecognitionTask/ucfTrainTestlist", "annotations",
                  "splits")
_UCF_VIDEO_DIRS = ("UCF-101", "UCF101", "videos", "")
_HMDB_SPLIT_DIRS = ("testTrainMulti_7030_splits", "test_train_splits/testTrainMulti_7030_splits", "splits",
                    "annotations", "")
_HMDB_VIDEO_DIRS = ("hmdb51_org", "hmdb51", "videos", "")


def _split_number(split: int | None) -> int:
    split = 1 if split is None else int(split)
    if split not in NUMBERED_SPLITS:
        raise ValueError(f"--dataset-split {split}: UCF101 and HMDB51 have the splits 1, 2 and 3")
    return split


class _ClassFolders:
    """Find ``<dir>/<class>/<file>`` over the candidate video dirs, the class folder matched
    exactly, else without regard to case (one listing per dir)."""

    def __init__(self, root: Path, dirs: tuple[str, ...]):
        self.dirs = [root / d for d in dirs if (root / d).is_dir()]
        self._folds: dict[Path, dict[str, str]] = {}

    def find(self, cls: str, filename: str) -> str | None:
        for d in self.dirs:
            p = d / cls / filename
            if p.is_file():
                return str(p)
            if d not in self._folds:
                self._folds[d] = {e.name.casefold(): e.name for e in d.iterdir() if e.is_dir()}
            other = self._folds[d].get(cls.casefold())
            if other is not None and (d / other / filename).is_file():
                return str(d / other / filename)
        return None


def read_ucf101(root: Path, *, split: int | None = None):
    """UCF101 split ``split`` (1-3, default 1) under ``root`` (layout: module docstring).

    Returns:
        :class:`~tsm_ds.data.records.Split` (kind ``"dataset"``): train = trainlist0N, val =
        testlist0N; class i = line i + 1 of classInd.txt; videos not on disk are left out and named
        in ``missing``, repeated paths in ``duplicates``.

    Raises:
        FileNotFoundError: no classInd.txt or list file of that split (the names looked for are given).
        ValueError: a split other than 1-3; a class folder not in classInd.txt, a label that is not
            its folder's class, classInd indices that are not 1..K once each (each names the file and
            the line).
    """
    n = _split_number(split)
    class_ind = find_file(root, ["classInd.txt"], _UCF_LIST_DIRS)
    train_list = find_file(root, [f"trainlist0{n}.txt"], _UCF_LIST_DIRS)
    if class_ind is None or train_list is None:
        raise FileNotFoundError(f"{root}: no UCF101 split files: expected classInd.txt and trainlist0{n}.txt (in the "
                                f"folder or ucfTrainTestlist/)")
    test_list = find_file(root, [f"testlist0{n}.txt"], _UCF_LIST_DIRS)
    by_index: dict[int, str] = {}
    for line, text in text_lines(class_ind):
        parts = text.split()
        if len(parts) != 2 or not parts[0].isdigit():
            raise ValueError(f"{class_ind}:{line}: expected '<index> <class>', got {text!r}")
        i = int(parts[0])
        if i in by_index or parts[1] in by_index.values():
            raise ValueError(f"{class_ind}:{line}: the index {i} or the class {parts[1]!r} is listed twice")
        by_index[i] = parts[1]
    if sorted(by_index) != list(range(1, len(by_index) + 1)):
        raise ValueError(f"{class_ind}: the class indices are not 1..{len(by_index)}")
    names = [by_index[i] for i in range(1, len(by_index) + 1)]
    exact = {c: i for i, c in enumerate(names)}
    folded = {c.casefold(): i for i, c in enumerate(names)}
    videos = _ClassFolders(root, _UCF_VIDEO_DIRS)
    got = Collector()
    for side, path in (("train", train_list), ("val", test_list)):
        if path is None:
            log.warning("ucf101: %s has no testlist0%d.txt: no validation side", root, n)
            continue
        for line, text in text_lines(path):
            parts = text.split()
            number = None
            if len(parts) >= 2 and parts[-1].isdigit():
                number, parts = int(parts[-1]), parts[:-1]
            rel = " ".join(parts).replace("\\", "/")
            cls, _, filename = rel.partition("/")
            if not filename:
                raise ValueError(f"{path}:{line}: expected '<Class>/<video>.avi', got {text!r}")
            label = exact.get(cls, folded.get(cls.casefold()))
            if label is None:
                raise ValueError(f"{path}:{line}: the class folder {cls!r} is not in {class_ind}")
            if number is not None and number != label + 1:
                raise ValueError(f"{path}:{line}: {rel} is labelled {number} ({by_index.get(number)!r} in "
                                 f"{class_ind.name}), its folder is the class {label + 1} ({names[label]!r})")
            got.add(side, rel, videos.find(cls, filename), label)
    if len(names) != 101:
        log.warning("ucf101: %s lists %d classes (the release has 101)", class_ind, len(names))
    return got.split(name="ucf101", root=root, class_names=names, described=f"lists {class_ind.parent}",
                     dataset_split=n, frame_template=None, flip=True)


_HMDB_FILE = re.compile(r"^(?P<cls>.+)_test_split(?P<n>[123])\.txt$")


def read_hmdb51(root: Path, *, split: int | None = None):
    """HMDB51 split ``split`` (1-3, default 1) under ``root`` (layout: module docstring).

    Returns:
        :class:`~tsm_ds.data.records.Split` (kind ``"dataset"``): train = flag 1, val = flag 2 (flag
        0 videos are in neither); class i = the i-th class in sorted order; videos not on disk are
        left out and named in ``missing``, repeated videos in ``duplicates``.

    Raises:
        FileNotFoundError: no ``*_test_split<N>.txt`` file (the folders looked in are given).
        ValueError: a split other than 1-3; a line whose flag is not 0, 1 or 2 (names the file and
            the line).
    """
    n = _split_number(split)
    files: dict[str, Path] = {}
    where = None
    for d in _HMDB_SPLIT_DIRS:
        folder = root / d
        if not folder.is_dir():
            continue
        for p in sorted(folder.iterdir()):
            m = _HMDB_FILE.match(p.name)
            if m and int(m["n"]) == n and p.is_file():
                files[m["cls"]] = p
        if files:
            where = folder
            break
    if not files:
        raise FileNotFoundError(f"{root}: no HMDB51 split files <class>_test_split{n}.txt (looked in "
                                f"{', '.join(d or '.' for d in _HMDB_SPLIT_DIRS)})")
    names = sorted(files)
    videos = _ClassFolders(root, _HMDB_VIDEO_DIRS)
    got = Collector()
    rows: dict[str, list[tuple[str, str, int]]] = {"train": [], "val": []}
    for label, cls in enumerate(names):
        path = files[cls]
        for line, text in text_lines(path):
            parts = text.split()
            if len(parts) < 2 or parts[-1] not in ("0", "1", "2"):
                raise ValueError(f"{path}:{line}: expected '<video>.avi 0|1|2' (0 unused, 1 train, 2 test), got "
                                 f"{text!r}")
            flag = parts[-1]
            if flag != "0":
                rows["train" if flag == "1" else "val"].append((" ".join(parts[:-1]), cls, label))
    for side in ("train", "val"):   # every training video before the validation ones: a repeat keeps train
        for video, cls, label in rows[side]:
            got.add(side, video, videos.find(cls, video), label)
    if len(names) != 51:
        log.warning("hmdb51: %s holds split files of %d classes (the release has 51)", where, len(names))
    return got.split(name="hmdb51", root=root, class_names=names, described=f"split files {where}",
                     dataset_split=n, frame_template=None, flip=True)
