"""Helpers shared by the dataset readers: annotation text as releases ship it (UTF-8 with or
without a BOM, CRLF / CR / LF line ends), JSON lists and objects with the line of each entry,
annotation files found under the dataset root, and :class:`Collector`, which gathers the records
of each side with the duplicate ids and the missing videos counted and named.
"""
from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path
from typing import Any, Iterable, Sequence

from tsm_ds.data.records import VIDEO_EXTENSIONS, Split, VideoRecord

__all__ = ["SIDES", "log", "read_text", "text_lines", "json_entries", "find_file", "video_index", "Collector"]

#: the sides of a dataset, in the order their annotation files are read (a repeated id keeps its first)
SIDES = ("train", "val", "test")

log = logging.getLogger("tsm_ds.data.datasets")

_EOL = re.compile(r"\r\n|\r|\n")
_WS = re.compile(r"[ \t\r\n]*")


def read_text(path: str | os.PathLike) -> str:
    """The file as text: UTF-8, a leading BOM dropped.

    Raises:
        FileNotFoundError: no such file. ValueError: not UTF-8 (names the file and the line).
    """
    raw = Path(path).read_bytes()
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        at = raw.count(b"\n", 0, e.start) + 1
        raise ValueError(f"{path}:{at}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def text_lines(path: str | os.PathLike) -> list[tuple[int, str]]:
    """``(line number from 1, text)`` of every line that is not blank, stripped of surrounding
    blanks; CRLF, CR and LF ends count alike and a BOM is dropped (:func:`read_text`).

    Raises:
        FileNotFoundError, ValueError: see :func:`read_text`.
    """
    return [(n, s.strip()) for n, s in enumerate(_EOL.split(read_text(path)), 1) if s.strip()]


def json_entries(path: str | os.PathLike, kind: type) -> list[tuple[int, Any, Any]]:
    """The entries of a JSON file holding one list (``kind=list``) or one object (``kind=dict``),
    each with the line it starts on: ``(line, None, item)`` for a list, ``(line, key, value)`` for an
    object, in file order (repeated keys of an object are all returned).

    Raises:
        FileNotFoundError: no such file.
        ValueError: not UTF-8, not JSON, or not a list / an object (names the file and the line).
    """
    text = read_text(path)
    dec = json.JSONDecoder()
    opening, closing = ("[", "]") if kind is list else ("{", "}")
    what = "a JSON list [...]" if kind is list else "a JSON object {...}"

    seen = [0, 1]   # (offset, its line): offsets only grow, so lines are counted once over the file

    def line(i: int) -> int:
        seen[1] += text.count("\n", seen[0], i)
        seen[0] = i
        return seen[1]

    def value(i: int) -> tuple[Any, int]:
        try:
            return dec.raw_decode(text, i)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None

    i = _WS.match(text, 0).end()
    if text[i:i + 1] != opening:
        raise ValueError(f"{path}:{line(i)}: expected {what}")
    out: list[tuple[int, Any, Any]] = []
    i = _WS.match(text, i + 1).end()
    if text[i:i + 1] == closing:
        return out
    while True:
        start = i
        key = None
        if kind is dict:
            key, i = value(i)
            if not isinstance(key, str):
                raise ValueError(f"{path}:{line(start)}: expected a quoted key")
            i = _WS.match(text, i).end()
            if text[i:i + 1] != ":":
                raise ValueError(f"{path}:{line(i)}: expected ':' after the key {key!r}")
            i = _WS.match(text, i + 1).end()
        item, i = value(i)
        out.append((line(start), key, item))
        i = _WS.match(text, i).end()
        c = text[i:i + 1]
        if c == closing:
            return out
        if c != ",":
            raise ValueError(f"{path}:{line(i)}: expected ',' or '{closing}'")
        i = _WS.match(text, i + 1).end()


def find_file(root: Path, names: Sequence[str], dirs: Sequence[str]) -> Path | None:
    """The first of ``root/<dir>/<name>`` that is a file, dirs outer, names inner; None if none is."""
    for d in dirs:
        for name in names:
            p = root / d / name
            if p.is_file():
                return p
    return None


def video_index(dirs: Iterable[Path], *, folders: bool = False, recursive: bool = False) -> dict[str, str]:
    """``{stem: path}`` of the video files (extension in VIDEO_EXTENSIONS) directly in ``dirs``
    (every level below with ``recursive``), or of the sub-folders with ``folders`` (frame folders:
    ``{folder name: path}``). The first found wins: dirs in order, names sorted. Missing dirs are
    skipped; hidden entries (``.name``) are ignored."""
    index: dict[str, str] = {}
    for d in dirs:
        if not d.is_dir():
            continue
        if recursive:
            for dirpath, dirnames, filenames in os.walk(d):
                dirnames[:] = sorted(n for n in dirnames if not n.startswith("."))
                for f in sorted(filenames):
                    stem, ext = os.path.splitext(f)
                    if ext.lower() in VIDEO_EXTENSIONS and not f.startswith("."):
                        index.setdefault(stem, os.path.join(dirpath, f))
            continue
        with os.scandir(d) as it:
            entries = sorted(it, key=lambda e: e.name)
        for e in entries:
            if e.name.startswith("."):
                continue
            if folders:
                if e.is_dir():
                    index.setdefault(e.name, e.path)
            else:
                stem, ext = os.path.splitext(e.name)
                if ext.lower() in VIDEO_EXTENSIONS and e.is_file():
                    index.setdefault(stem, e.path)
    return index


def _examples(ids: Sequence[str], k: int = 5) -> str:
    return ", ".join(ids[:k]) + (f", ... ({len(ids) - k} more)" if len(ids) > k else "")


class Collector:
    """The records of each side of one dataset, in listing order.

    An id listed again (on the same side or a later one: train, then val, then test) is a
    duplicate: the first listing is kept, the repeats are counted and named. An id whose video (or
    frame folder) is not on disk is missing: left out of the records and named, so that it never
    reaches the loader (nor the data-loss budget, which counts files the loader cannot read).
    """

    def __init__(self) -> None:
        self.records: dict[str, list[VideoRecord]] = {s: [] for s in SIDES}
        self.missing: dict[str, list[str]] = {s: [] for s in SIDES}
        self.duplicates: dict[str, list[str]] = {s: [] for s in SIDES}
        self._seen: set[str] = set()

    def add(self, side: str, key: str, path: str | None, label: int, *, frame_template: str | None = None) -> None:
        """One listed id: ``path`` is its video or frame folder, None when it is not on disk;
        ``label`` the class index (-1: unlabelled test item)."""
        if key in self._seen:
            self.duplicates[side].append(key)
            return
        self._seen.add(key)
        if path is None:
            self.missing[side].append(key)
            return
        self.records[side].append(VideoRecord(str(path), int(label), None, frame_template))

    def split(self, *, name: str, root: Path, class_names: list[str], described: str, dataset_split: int | None,
              frame_template: str | None, flip: bool) -> Split:
        """The :class:`~tsm_ds.data.records.Split` (kind ``"dataset"``), after one warning per side
        that has missing or duplicate ids (their count and the first ids).

        Raises:
            ValueError: no training video found (every listed one is missing).
        """
        listed = {s: len(self.records[s]) + len(self.missing[s]) for s in SIDES}
        for s in SIDES:
            if self.missing[s]:
                log.warning("%s: %d of %d listed %s videos are not on disk under %s; left out (not counted as "
                            "unreadable): %s", name, len(self.missing[s]), listed[s], s, root,
                            _examples(self.missing[s]))
            if self.duplicates[s]:
                log.warning("%s: %d %s ids are listed again after their first listing; the repeats are left out: "
                            "%s", name, len(self.duplicates[s]), s, _examples(self.duplicates[s]))
        if not self.records["train"]:
            raise ValueError(f"{name} at {root}: none of the {listed['train']} training videos {described} is on "
                             f"disk (looked for e.g. {self.missing['train'][:3]}); see docs/datasets.md for the "
                             f"layout")
        counts = ", ".join(f"{len(self.records[s])} {s}" for s in SIDES if listed[s])
        lost = sum(len(v) for v in self.missing.values())
        desc = (f"{root}: {name}{f' split {dataset_split}' if dataset_split else ''} ({described}): {counts}; "
                f"{lost} listed videos missing on disk, {sum(len(v) for v in self.duplicates.values())} duplicate ids")
        return Split(self.records["train"], self.records["val"], list(class_names), "dataset", desc,
                     data=str(root), dataset=name, dataset_split=dataset_split, frame_template=frame_template,
                     flip=flip, test=self.records["test"], missing={s: v for s, v in self.missing.items() if v},
                     duplicates={s: v for s, v in self.duplicates.items() if v})
