"""Dataset annotations -> :class:`VideoRecord` lists.

Formats read here (all paths may be relative; see each reader for what they are relative to):

- class-per-folder tree ``root/<class>/<video>`` (:func:`read_class_folders`);
- video list, one ``path label`` per line (:func:`read_video_list`); the same reader accepts the
  official TSM frame list ``frame_dir num_frames label`` (JPEG frames ``img_{:05d}.jpg``,
  1-indexed) and tells them apart by the number of fields;
- the Kinetics CSV ``label,youtube_id,time_start,time_end,split[,is_cc]`` (test CSVs have no label
  column) with clips named ``{youtube_id}_{time_start:06d}_{time_end:06d}.mp4``
  (:func:`read_kinetics_csv`), labels through a label map such as kinetics400_labels.txt;
- ../shared/data/videos with its manifest.csv, split by source video (:func:`split_by_source_group`).

:class:`Split` (train / validation records of one data source) is defined here, beside
:class:`VideoRecord`, so that the resolver (:mod:`tsm_ds.data.splits`) and the readers of the
distributed datasets (:mod:`tsm_ds.data.datasets`) share it without importing each other.
"""
from __future__ import annotations

import csv
import os
from dataclasses import dataclass, field
from pathlib import Path

from tsm_ds.utils.io import atomic_write_text

__all__ = ["VideoRecord", "Split", "VIDEO_EXTENSIONS", "normalize_class_name", "read_label_map",
           "read_class_folders", "read_video_list", "write_video_list", "read_kinetics_csv",
           "kinetics_clip_name", "split_by_source_group"]

VIDEO_EXTENSIONS = (".mp4", ".avi", ".mkv", ".webm", ".mov", ".m4v", ".flv", ".mpg", ".mpeg",
                    ".wmv", ".gif", ".ogv", ".3gp", ".ts", ".jpack")


@dataclass
class VideoRecord:
    """One labelled video: a file, or a JPEG frame folder (then ``num_frames`` comes from the
    official list file).

    Attributes:
        path: video file or frame folder.
        label: class index (int, 0-based); -1 for unlabelled test items.
        num_frames: frames, when the annotation states it (frame folders); None for videos (the
            loader counts packets, see :func:`tsm_ds.data.video.count_frames`).
        frame_template: file name of frame i + 1 in a frame folder, a ``str.format`` pattern
            (``"{:05d}.jpg"`` for the Something-Something v1 and Jester releases); None: the
            official TSM layout :data:`tsm_ds.data.video.FRAME_TEMPLATE` (``img_{:05d}.jpg``).
    """

    path: str
    label: int
    num_frames: int | None = None
    frame_template: str | None = None


@dataclass
class Split:
    """Train and validation records of one data source, and how to resolve them again.

    Attributes:
        train, val: the records (``val`` may be empty: a list run without ``val_list``).
        class_names: label i is ``class_names[i]``.
        kind: one of :data:`tsm_ds.data.splits.SPLIT_KINDS`.
        description: one line for logs (what was read, how it was split).
        data, train_list, val_list, classes: the resolver's arguments as absolute paths (or None).
        val_fraction: the hold-out fraction (used by kind "holdout" only).
        demo: True for the generated demo dataset (:func:`tsm_ds.data.splits.demo_split`): direction
            classes.
        dataset: kind "dataset": the ``--dataset`` name (:data:`tsm_ds.data.datasets.DATASETS`),
            read from its annotation files or from a folder ``tsm-ds prepare --dataset`` wrote.
        dataset_split: the numbered split read (UCF101, HMDB51: 1-3), else None.
        frame_template: the frame file names of the dataset's frame folders (None: videos, or
            ``img_{:05d}.jpg``).
        flip: False when a horizontal flip changes the class (Something-Something, Jester: classes
            say left and right; the official TSM code trains them without flip).
        test: unlabelled test records (label -1), for ``tsm-ds predict``; never trained or scored.
        missing: side (``"train"``, ``"val"``, ``"test"``) -> the ids the annotations list whose video
            is not on disk; they are left out of the records (so they never reach the loader and
            never count against ``--max-bad-fraction``) and named here.
        duplicates: side -> ids listed again after their first listing (the repeats are left out).
    """

    train: list[VideoRecord]
    val: list[VideoRecord]
    class_names: list[str]
    kind: str
    description: str
    data: str | None = None
    train_list: str | None = None
    val_list: str | None = None
    classes: str | None = None
    val_fraction: float = 0.2
    demo: bool = False
    dataset: str | None = None
    dataset_split: int | None = None
    frame_template: str | None = None
    flip: bool = True
    test: list[VideoRecord] = field(default_factory=list)
    missing: dict[str, list[str]] = field(default_factory=dict)
    duplicates: dict[str, list[str]] = field(default_factory=dict)

    def side(self, name: str) -> list[VideoRecord]:
        """``"train"``, ``"val"``, or ``"all"`` (both, sorted by path). Raises ValueError for other names."""
        if name == "train":
            return list(self.train)
        if name == "val":
            return list(self.val)
        if name == "all":
            return sorted(list(self.train) + list(self.val), key=lambda r: r.path)
        raise ValueError(f"split side must be train, val or all; got {name!r}")

    def as_dict(self) -> dict:
        """The resolver's arguments plus ``kind``, ``demo`` and the clip counts (JSON-ready), for
        ``config.json``; :func:`tsm_ds.data.splits.split_from_record` reads it back. A dataset split
        adds ``dataset``, ``dataset_split``, ``frame_template``, ``flip``, ``test_clips`` and the counts
        of missing and duplicate ids per side (the ids themselves: :attr:`missing`, the log)."""
        out = {"kind": self.kind, "data": self.data, "train_list": self.train_list, "val_list": self.val_list,
               "classes": self.classes, "val_fraction": self.val_fraction, "demo": self.demo,
               "train_clips": len(self.train), "val_clips": len(self.val)}
        if self.dataset is not None:
            out.update({"dataset": self.dataset, "dataset_split": self.dataset_split,
                        "frame_template": self.frame_template, "flip": self.flip, "test_clips": len(self.test),
                        "missing": {k: len(v) for k, v in self.missing.items()},
                        "duplicates": {k: len(v) for k, v in self.duplicates.items()}})
        return out


def normalize_class_name(name: str) -> str:
    """Official Kinetics class-name normalisation for folder names: spaces -> '_', and drop
    '"', '(', ')' and "'" (TSM tools/gen_label_kinetics.py). 'petting animal (not cat)' ->
    'petting_animal_not_cat'."""
    return (name.strip().replace(" ", "_").replace('"', "").replace("(", "").replace(")", "")
            .replace("'", ""))


def read_label_map(path: str | os.PathLike) -> list[str]:
    """Class names, one per line; line N (from 0) is class N. Blank trailing lines are ignored.

    Raises FileNotFoundError; ValueError on a blank line in the middle or a duplicate name.
    """
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    names = [ln.strip() for ln in lines]
    for i, n in enumerate(names):
        if not n:
            raise ValueError(f"{path}: line {i + 1} is blank; a label map has one class per line")
    if len(set(names)) != len(names):
        raise ValueError(f"{path}: duplicate class names")
    return names


def _is_video(p: Path) -> bool:
    return p.is_file() and p.suffix.lower() in VIDEO_EXTENSIONS


def read_class_folders(root: str | os.PathLike, *, class_names: list[str] | None = None
                       ) -> tuple[list[VideoRecord], list[str]]:
    """Records of a ``root/<class>/<video>`` tree: label = index of the folder name.

    Args:
        root: the tree. Videos are files with an extension in VIDEO_EXTENSIONS, at any depth
            below the class folder; a folder holding ``img_00001.jpg`` is a JPEG frame folder. A
            shard folder (``samples.json`` + ``index.json``, :mod:`tsm_ds.data.shards`) is skipped.
        class_names: fixes the label order (e.g. a label map normalised with
            :func:`normalize_class_name`); default: sorted folder names.

    Returns:
        (records sorted by path, class_names).

    Raises:
        FileNotFoundError: root missing. ValueError: no class folder, or a folder not in
        ``class_names``.
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: not a directory (expected <root>/<class>/<video>)")
    # a shard folder (tsm-ds prepare --shards writes OUT/shards beside the class folders) is no class
    folders = sorted(d.name for d in root.iterdir()
                     if d.is_dir() and not ((d / "samples.json").is_file() and (d / "index.json").is_file()))
    if not folders:
        raise ValueError(f"{root}: no class folders")
    names = list(class_names) if class_names is not None else folders
    index = {n: i for i, n in enumerate(names)}
    records = []
    for name in folders:
        if name not in index:
            raise ValueError(f"{root / name}: class folder not in the given class names")
        for dirpath, dirnames, filenames in os.walk(root / name):
            dirnames.sort()
            if "img_00001.jpg" in filenames:
                records.append(VideoRecord(dirpath, index[name], None))
                dirnames[:] = []
                continue
            for f in sorted(filenames):
                p = Path(dirpath) / f
                if _is_video(p):
                    records.append(VideoRecord(str(p), index[name]))
    records.sort(key=lambda r: r.path)
    return records, names


def _resolve(p: str, base: Path) -> str:
    q = Path(p).expanduser()
    return str(q if q.is_absolute() else base / q)


def read_video_list(path: str | os.PathLike, root: str | os.PathLike | None = None
                    ) -> list[VideoRecord]:
    """Read a list file: ``path label`` (video list) or ``frame_dir num_frames label`` (official
    TSM frame list) per line; ``#`` comments and blank lines are skipped.

    Paths may contain spaces: the label (and num_frames) are the last fields. A line with three or
    more fields whose last two are integers is a frame-list line. Relative paths are joined to
    ``root`` when given, else to the list file's directory.

    Returns records in file order. Raises FileNotFoundError; ValueError naming the file and line
    for a malformed line.
    """
    path = Path(path)
    base = Path(root) if root is not None else path.parent
    records = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        parts = s.split()
        try:
            if len(parts) >= 3 and parts[-2].lstrip("-").isdigit() and parts[-1].lstrip("-").isdigit():
                rec = VideoRecord(_resolve(" ".join(parts[:-2]), base), int(parts[-1]), int(parts[-2]))
                if rec.num_frames < 1:
                    raise ValueError("num_frames < 1")
            elif len(parts) >= 2:
                rec = VideoRecord(_resolve(" ".join(parts[:-1]), base), int(parts[-1]))
            else:
                raise ValueError("expected 'path label' or 'frame_dir num_frames label'")
        except ValueError as e:
            raise ValueError(f"{path}:{n}: cannot parse {line!r} ({e})") from None
        records.append(rec)
    return records


def write_video_list(path: str | os.PathLike, records: list[VideoRecord], *,
                     root: str | os.PathLike | None = None) -> None:
    """Write records as a list file (``path label``, or ``dir num_frames label`` for records with
    num_frames), paths relative to ``root`` when given. Written atomically
    (:func:`tsm_ds.utils.io.atomic_write_text`)."""
    path = Path(path)
    lines = []
    for r in records:
        p = os.path.relpath(r.path, root) if root is not None else r.path
        lines.append(f"{p} {r.num_frames} {r.label}" if r.num_frames else f"{p} {r.label}")
    atomic_write_text(path, "\n".join(lines) + ("\n" if lines else ""))


def kinetics_clip_name(youtube_id: str, time_start: float | str, time_end: float | str,
                       ext: str = ".mp4") -> str:
    """``{youtube_id}_{time_start:06d}_{time_end:06d}{ext}``, as the common Kinetics downloaders
    name clips."""
    return f"{youtube_id}_{int(float(time_start)):06d}_{int(float(time_end)):06d}{ext}"


def read_kinetics_csv(csv_path: str | os.PathLike, video_root: str | os.PathLike,
                      label_map: str | os.PathLike | list[str], *, missing: str = "error"
                      ) -> tuple[list[VideoRecord], list[str]]:
    """Records of a Kinetics annotation CSV (``label,youtube_id,time_start,time_end,split[,is_cc]``
    with a header; test CSVs have no ``label`` column: their records get label -1).

    A clip is looked for as ``video_root/<class folder>/<clip>``, where the class folder is the
    normalised (:func:`normalize_class_name`) or the raw class name, then ``video_root/<clip>``;
    clip = :func:`kinetics_clip_name` with any extension in VIDEO_EXTENSIONS (.mp4 first).

    Args:
        label_map: the label-map file (e.g. ../shared/data/kinetics400_labels.txt) or names.
        missing: "error" (ValueError listing the first missing clips) or "skip" (drop them, with
            a warning giving their count; never silent).

    Returns (records, class_names). Raises ValueError for an unknown class name or header.
    """
    import warnings

    names = read_label_map(label_map) if not isinstance(label_map, list) else list(label_map)
    by_norm = {normalize_class_name(n): i for i, n in enumerate(names)}
    root = Path(video_root)
    records, absent = [], []
    with open(csv_path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        need = {"youtube_id", "time_start", "time_end"}
        if reader.fieldnames is None or not need <= set(reader.fieldnames):
            raise ValueError(f"{csv_path}: header must contain label,youtube_id,time_start,"
                             f"time_end,split; got {reader.fieldnames}")
        has_label = "label" in reader.fieldnames
        for n, row in enumerate(reader, 2):
            label, folders = -1, [""]
            if has_label:
                key = normalize_class_name(row["label"])
                if key not in by_norm:
                    raise ValueError(f"{csv_path}:{n}: class {row['label']!r} not in the label map")
                label = by_norm[key]
                folders = [key, row["label"].strip(), ""]
            stem = kinetics_clip_name(row["youtube_id"], row["time_start"], row["time_end"], "")
            found = None
            for folder in folders:
                for ext in VIDEO_EXTENSIONS:
                    p = root / folder / (stem + ext)
                    if p.is_file():
                        found = p
                        break
                if found:
                    break
            if found is None:
                absent.append(stem)
                continue
            records.append(VideoRecord(str(found), label))
    if absent:
        msg = f"{csv_path}: {len(absent)} clips not found under {root} (first: {absent[:3]})"
        if missing == "error":
            raise ValueError(msg + "; pass missing='skip' to drop them")
        warnings.warn(msg + "; skipped", RuntimeWarning, stacklevel=2)
    return records, names


def split_by_source_group(data_root: str | os.PathLike
                          ) -> tuple[list[VideoRecord], list[VideoRecord], list[str]]:
    """Train/val split of ``data_root/videos`` (../shared/data) by source video, never by file.

    The class of a clip is its folder under videos/; manifest.csv's ``source_group`` names the
    source video. Per class, the last source_group in sorted order goes to val, the others to
    train, so parts of one source video never land on both sides.

    Returns (train_records, val_records, class_names sorted). Raises FileNotFoundError when the
    manifest is missing; ValueError when a class has fewer than 2 source groups.
    """
    root = Path(data_root)
    manifest = root / "manifest.csv"
    if not manifest.is_file():
        raise FileNotFoundError(f"{manifest} not found (data_root must hold manifest.csv and videos/)")
    rows = []
    with open(manifest, newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            parts = Path(row["path"]).parts
            if len(parts) >= 3 and parts[0] == "videos":
                rows.append((parts[1], row["source_group"], str(root / row["path"])))
    classes = sorted({c for c, _, _ in rows})
    train, val = [], []
    for ci, c in enumerate(classes):
        groups = sorted({g for cc, g, _ in rows if cc == c})
        if len(groups) < 2:
            raise ValueError(f"class {c!r} has {len(groups)} source group(s); need 2 to split")
        for cc, g, p in sorted(rows):
            if cc == c:
                (val if g == groups[-1] else train).append(VideoRecord(p, ci))
    return train, val, classes
