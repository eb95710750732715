"""Something-Something v1 / v2 and Jester, read from the annotation files of their releases.

- Something-Something v2: ``something-something-v2-{labels,train,validation,test}.json`` in the
  root (or ``annotations/``, ``labels/``), or the later package's ``labels/{labels,train,validation,
  test}.json`` (in the root or one folder below, e.g.
  ``20bn-something-something-download-package-labels/labels/``). labels: ``{template: "id"}``;
  train / validation: ``[{"id", "label", "template", "placeholders"}, ...]``, the class being the
  template with its brackets removed (``"Putting [something] on [something]"`` -> ``"Putting
  something on something"``); test: ``[{"id"}, ...]``. Videos ``<id>.webm`` (or ``.mp4``) in
  ``20bn-something-something-v2/``, ``videos/`` or the root. Class i is the labels file's id i.
- Something-Something v1 and Jester: ``something-something-v1-{labels,train,validation,test}.csv``
  / ``jester-v1-...csv``: labels one class a line; train / validation ``id;label`` a line; test
  ``id`` a line. Frame folders ``<id>/00001.jpg ...`` (``frame_template``, default ``{:05d}.jpg``) in
  ``20bn-something-something-v1/`` / ``20bn-jester-v1/``, ``frames/``, ``rawframes/`` or the root.
  Class i is the i-th label in sorted order.

Source: the official TSM scripts ``tools/gen_label_sthv1.py`` (sorted labels, ``id;label``; its
comment names Jester's files the same way) and ``tools/gen_label_sthv2.py`` (labels in id order,
template without brackets), and ``ops/dataset_config.py`` (frames ``{:05d}.jpg``).
"""
from __future__ import annotations

from pathlib import Path

from ._common import Collector, find_file, json_entries, log, text_lines, video_index

__all__ = ["SSV1_FRAME_TEMPLATE", "read_somethingv2", "read_somethingv1", "read_jester", "check_frame_template"]

#: frame file names of the Something-Something v1 and Jester releases (1-based)
SSV1_FRAME_TEMPLATE = "{:05d}.jpg"

_ANNOTATION_DIRS = ("", "annotations", "labels")


def _v2_files(root: Path) -> dict[str, Path | None]:
    """The four annotation files of Something-Something v2: the original names, else the later
    package's ``labels/*.json`` (in the root or one folder below)."""
    sides = ("labels", "train", "validation", "test")
    files = {s: find_file(root, [f"something-something-v2-{s}.json"], _ANNOTATION_DIRS) for s in sides}
    if files["labels"] is None:
        for labels_dir in [root / "labels", *sorted(p / "labels" for p in root.iterdir() if p.is_dir())]:
            if (labels_dir / "labels.json").is_file():
                files = {s: (labels_dir / f"{s}.json") if (labels_dir / f"{s}.json").is_file() else None
                         for s in sides}
                break
    return files


def read_somethingv2(root: Path):
    """The Something-Something v2 release under ``root`` (layout: module docstring).

    Returns:
        :class:`~tsm_ds.data.records.Split` (kind ``"dataset"``, ``flip`` False): train = the train
        file's ids, val = the validation file's, test = the test file's (label -1); ids whose video
        is not on disk are left out and named in ``missing``, repeated ids in ``duplicates``.

    Raises:
        FileNotFoundError: no labels or train file (the names looked for are given).
        ValueError: a template not in the labels file, an entry without ``id`` / ``template``, label
            ids that are not 0..N-1 once each, bad JSON (each names the file and the line).
    """
    files = _v2_files(root)
    if files["labels"] is None or files["train"] is None:
        raise FileNotFoundError(f"{root}: no Something-Something v2 annotations: expected "
                                f"something-something-v2-labels.json and -train.json (in the folder, annotations/ "
                                f"or labels/) or labels/labels.json and labels/train.json")
    by_id: dict[int, str] = {}
    for line, template, value in json_entries(files["labels"], dict):
        try:
            i = int(value)
        except (TypeError, ValueError):
            raise ValueError(f"{files['labels']}:{line}: {template!r} has the id {value!r}, not a number") from None
        if i in by_id:
            raise ValueError(f"{files['labels']}:{line}: {template!r} has the id {i} of {by_id[i]!r}")
        if template.strip() in by_id.values():
            raise ValueError(f"{files['labels']}:{line}: the class {template!r} is listed twice")
        by_id[i] = template.strip()
    if sorted(by_id) != list(range(len(by_id))):
        raise ValueError(f"{files['labels']}: the class ids are not 0..{len(by_id) - 1} (missing: "
                         f"{sorted(set(range(len(by_id))) - set(by_id))[:5]})")
    names = [by_id[i] for i in range(len(by_id))]
    index = {n: i for i, n in enumerate(names)}
    videos = video_index([root / "20bn-something-something-v2", root / "videos", root])
    got = Collector()
    for side, key in (("train", "train"), ("val", "validation"), ("test", "test")):
        path = files[key]
        if path is None:
            if side == "val":
                log.warning("somethingv2: %s has no validation file: no validation side", root)
            continue
        for line, _, item in json_entries(path, list):
            if not isinstance(item, dict) or "id" not in item:
                raise ValueError(f"{path}:{line}: expected an object with an \"id\", got {str(item)[:80]}")
            vid = str(item["id"]).strip()
            label = -1
            if side != "test":
                template = item.get("template")
                if not isinstance(template, str):
                    raise ValueError(f"{path}:{line}: id {vid} has no \"template\"")
                cls = template.replace("[", "").replace("]", "").strip()
                if cls not in index:
                    raise ValueError(f"{path}:{line}: id {vid}: the class {cls!r} (template {template!r}) is not in "
                                     f"{files['labels']}")
                label = index[cls]
            got.add(side, vid, videos.get(vid), label)
    return got.split(name="somethingv2", root=root, class_names=names,
                     described=f"annotations {files['labels'].parent}", dataset_split=None, frame_template=None,
                     flip=False)


def check_frame_template(template: str) -> str:
    """``template`` if it names frame i + 1 by formatting i + 1 (``"{:05d}.jpg"``, ``"img_{:05d}.jpg"``).

    Raises:
        ValueError: it does not format an integer, or gives frames 1 and 2 the same name.
    """
    try:
        a, b = template.format(1), template.format(2)
    except (IndexError, KeyError, ValueError) as e:
        raise ValueError(f"--frame-template {template!r}: not a format for a frame number, such as {{:05d}}.jpg "
                         f"({e})") from None
    if a == b or "/" in a:
        raise ValueError(f"--frame-template {template!r}: must name each frame by its number (e.g. {{:05d}}.jpg)")
    return template


def _first_frame_check(name: str, folders: list[str], template: str) -> None:
    """Stop early when the first frame folders hold no ``template.format(1)``: every item would be
    unreadable (a wrong ``--frame-template``)."""
    for folder in folders[:3]:
        first = Path(folder) / template.format(1)
        if first.is_file():
            return
    if folders:
        folder = Path(folders[0])
        files = sorted(p.name for p in folder.iterdir())[:3] if folder.is_dir() else []
        raise ValueError(f"{name}: the frame folder {folder} has no {template.format(1)} (frame template "
                         f"{template!r}); its files: {files or 'none'}: give --frame-template (e.g. "
                         f"img_{{:05d}}.jpg)")


def _read_20bn_csv(name: str, prefix: str, frames_dir: str, root: Path, frame_template: str | None):
    template = check_frame_template(frame_template or SSV1_FRAME_TEMPLATE)
    files = {s: find_file(root, [f"{prefix}-{s}.csv"], _ANNOTATION_DIRS)
             for s in ("labels", "train", "validation", "test")}
    if files["labels"] is None or files["train"] is None:
        raise FileNotFoundError(f"{root}: no {name} annotations: expected {prefix}-labels.csv and {prefix}-train.csv "
                                f"(in the folder, annotations/ or labels/)")
    raw = []
    for line, text in text_lines(files["labels"]):
        if text in raw:
            raise ValueError(f"{files['labels']}:{line}: the class {text!r} is listed twice")
        raw.append(text)
    names = sorted(raw)   # as the official gen_label_sthv1.py
    index = {n: i for i, n in enumerate(names)}
    folders = video_index([root / frames_dir, root / "frames", root / "rawframes", root], folders=True)
    got = Collector()
    for side, key in (("train", "train"), ("val", "validation"), ("test", "test")):
        path = files[key]
        if path is None:
            if side == "val":
                log.warning("%s: %s has no validation file: no validation side", name, root)
            continue
        for line, text in text_lines(path):
            vid, sep, label_text = text.partition(";")
            vid, label_text = vid.strip(), label_text.strip()
            label = -1
            if side != "test":
                if not sep or not vid:
                    raise ValueError(f"{path}:{line}: expected 'id;label', got {text!r}")
                if label_text not in index:
                    raise ValueError(f"{path}:{line}: id {vid}: the class {label_text!r} is not in {files['labels']}")
                label = index[label_text]
            got.add(side, vid, folders.get(vid), label, frame_template=template)
    _first_frame_check(name, [r.path for r in got.records["train"]], template)
    return got.split(name=name, root=root, class_names=names, described=f"annotations {files['labels'].parent}, "
                     f"frames {template}", dataset_split=None, frame_template=template, flip=False)


def read_somethingv1(root: Path, *, frame_template: str | None = None):
    """The Something-Something v1 release under ``root`` (layout: module docstring); as
    :func:`read_jester`."""
    return _read_20bn_csv("somethingv1", "something-something-v1", "20bn-something-something-v1", root, frame_template)


def read_jester(root: Path, *, frame_template: str | None = None):
    """The Jester release under ``root`` (layout: module docstring).

    Args:
        root: the dataset folder.
        frame_template: frame file names in the frame folders (default ``{:05d}.jpg``, as released).

    Returns:
        :class:`~tsm_ds.data.records.Split` (kind ``"dataset"``, ``flip`` False) of frame-folder
        records (``frame_template`` set); test ids get label -1; ids without a frame folder are
        left out and named in ``missing``, repeated ids in ``duplicates``.

    Raises:
        FileNotFoundError: no labels or train file (the names looked for are given).
        ValueError: a label not in the labels file, a line without ``;``, a class listed twice
            (each names the file and the line); a bad ``frame_template``; the first frame folders
            hold no frame 1 under that template.
    """
    return _read_20bn_csv("jester", "jester-v1", "20bn-jester-v1", root, frame_template)
