"""``tsm-ds prepare``: pack (default), re-encode or extract JPEG frames of a video dataset, and write lists.

Usage::

    tsm-ds prepare SRC OUT [--list LIST] [--mode packed|video|frames] [--short-side 256]
                   [--keyint 16] [--crf 23] [--preset veryfast] [--workers N]
    tsm-ds prepare SRC OUT --part I/N [...]      # one part (or a SLURM array task: I from the task id)
    tsm-ds prepare SRC OUT --merge               # after all parts: lists + report of the whole set
    tsm-ds prepare --dataset somethingv2 SRC OUT  # a distributed dataset, its split kept in OUT

SRC is a class-per-folder tree (or use ``--list`` with a video list, or ``--dataset NAME`` for a
dataset as it is distributed: :mod:`tsm_ds.data.datasets`; OUT then also holds train.txt, val.txt,
test.txt and dataset.json, :mod:`tsm_ds.data.datasets.prepared`, so ``--data OUT`` trains the same
split); what is written is described in :mod:`tsm_ds.data.prepare`, the parts and the merge in
:mod:`tsm_ds.data.prepare_parts`.
Options: :data:`tsm_ds.config.tools.PREPARE`. Exit status 1 when a file failed, 2 for parts that
cannot be run or merged (the message says why and what to run).
"""
from __future__ import annotations

import argparse
import os
import socket
import sys

from tsm_ds.config import Config, parse
from tsm_ds.config.fields import build_parser as build_parser_for
from tsm_ds.config.tools import PREPARE

#: the fields this command uses
COMMAND = PREPARE


def build_parser() -> argparse.ArgumentParser:
    """The ``tsm-ds prepare`` argument parser (generated from :data:`COMMAND`)."""
    return build_parser_for(COMMAND, Config)


class _Refused(Exception):
    """Options or inputs ``tsm-ds prepare`` refuses; the message is printed and the status is 2."""


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``tsm-ds prepare``; returns 1 when any input failed, 2 when the options, the
    part options or the merge are refused (message on stderr), else 0.

    Raises:
        SystemExit: bad options (argparse).
    """
    cfg, given = parse(COMMAND, Config, argv)
    p = cfg.prepare
    src_root, out_root = os.path.abspath(p.src), os.path.abspath(p.out)
    try:
        _check_options(cfg, given)
        part = _part(p)
        records, classes, split = _records(cfg, src_root)
        rows, summary = _run(cfg, given, records, classes, src_root, out_root, part)
    except _Refused as e:
        print(str(e), file=sys.stderr)
        return 2
    failed = [r for r in rows if r["status"] == "failed"]
    for r in failed:
        print(f"  failed {r['src']}: {r['reason']}")
    for r in rows:   # kept, but only the frames before a decode error
        if r["status"] != "failed" and r["reason"].startswith("partial source"):
            print(f"  partial {r['src']}: {r['num_frames']} frames kept ({r['reason']})")
    if split is not None and part is None:
        _keep_split(split, rows, out_root, src_root, mode=p.mode if not p.merge else summary["mode"])
    if p.shards is not None and part is None:
        code = _write_shards(out_root, rows, p.shards, classes, _shard_split(split, rows))
        if code:
            return code
    return 1 if failed else 0


def _check_options(cfg: Config, given) -> None:
    """Refuse options that cannot apply (raises _Refused naming them and what to do)."""
    p, d = cfg.prepare, cfg.data
    if not 1 <= p.quality <= 95:
        raise _Refused(f"tsm-ds prepare: --quality {p.quality}: give a JPEG quality from 1 to 95 (default 90)")
    if p.shards is not None and (p.mode != "packed" or not p.shards > 0):
        raise _Refused(f"tsm-ds prepare: --shards {p.shards} --mode {p.mode}: shards hold packs; give --mode packed "
                       "(the default) and a shard size in MB > 0")
    if p.shards is not None and p.part is not None:
        raise _Refused("tsm-ds prepare: --shards with --part: the shards are written once, at --merge (give "
                       "--shards there)")
    # options of another mode would be ignored: say so instead
    only = {"video": ("keyint", "crf", "preset", "tune"), "packed frames": ("quality",)}
    for modes, names in only.items():
        stray = [f"--{n.replace('_', '-')}" for n in names if f"prepare.{n}" in given and p.mode not in modes.split()]
        if stray:
            raise _Refused(f"tsm-ds prepare: {', '.join(stray)} applies to --mode {modes.replace(' ', ' / ')} only, "
                           f"not --mode {p.mode}: drop it or choose that mode")
    if d.dataset is None and (d.dataset_split is not None or d.frame_template or d.classes):
        raise _Refused("tsm-ds prepare: --dataset-split, --frame-template and --classes belong to --dataset NAME")
    if d.dataset is not None and p.list:
        raise _Refused(f"tsm-ds prepare: --dataset {d.dataset} reads the dataset's annotation files under SRC; "
                       "drop --list")


def _part(p) -> tuple | None:
    """This process's part (I, N, where from), or None (all, or the merge). Raises _Refused."""
    from tsm_ds.data.prepare_parts import PartsError, resolve_part

    try:
        if not p.merge:
            return resolve_part(p.part, p.parts, os.environ)
        if p.part is not None or p.parts is not None:
            raise PartsError("--merge runs after the parts, alone: drop --part / --parts")
        if int(os.environ.get("SLURM_ARRAY_TASK_COUNT", "0") or 0) > 1:
            raise PartsError("--merge in a task of a SLURM array job: every task would merge; run the merge "
                             "once after the array (sbatch --dependency=afterok:<array job id> "
                             "launch/slurm_prepare.sbatch SRC OUT --merge)")
        return None
    except PartsError as e:
        raise _Refused(f"prepare: {e}") from None


def _records(cfg: Config, src_root: str) -> tuple:
    """(records, class names or None, the dataset's split or None) of the source. Raises _Refused."""
    from tsm_ds.data.records import read_class_folders, read_video_list

    p, d = cfg.prepare, cfg.data
    if d.dataset is not None:   # the dataset's own annotation files; the split is kept in OUT
        from tsm_ds.data.splits import resolve_split
        try:
            split = resolve_split(dataset=d.dataset, data=src_root, dataset_split=d.dataset_split,
                                  frame_template=d.frame_template, classes=d.classes)
        except (FileNotFoundError, NotADirectoryError, ValueError) as e:
            raise _Refused(f"tsm-ds prepare: {e}") from None
        lost = {s: len(v) for s, v in split.missing.items()}
        print(f"prepare: {split.description}" + (f"; not on disk (left out): {lost}" if lost else ""), flush=True)
        return split.train + split.val + split.test, split.class_names, split
    try:
        if p.list:
            return read_video_list(p.list, root=src_root), None, None
        records, classes = read_class_folders(src_root)
        return records, classes, None
    except (FileNotFoundError, NotADirectoryError, ValueError) as e:
        raise _Refused(f"tsm-ds prepare: {e} (SRC is a folder of class folders, <SRC>/<class>/<video>, or the root "
                       f"of --list's paths)") from None


def _run(cfg: Config, given, records, classes, src_root: str, out_root: str, part) -> tuple[list[dict], dict]:
    """Prepare (or merge) and print the summary line; returns (rows, the merge summary or {})."""
    from tsm_ds.data.prepare import prepare_dataset
    from tsm_ds.data.prepare_parts import PARTS_DIR, PartsError, merge_parts, part_report_path, prepare_part

    p = cfg.prepare
    opts = ({"short_side": p.short_side, "keyint": p.keyint, "crf": p.crf, "preset": p.preset, "tune": p.tune}
            if p.mode == "video" else {"short_side": p.short_side, "quality": p.quality})
    if p.merge:
        expect = {f.split(".", 1)[1]: getattr(p, f.split(".", 1)[1]) for f in given
                  if f in ("prepare.mode", "prepare.short_side", "prepare.keyint", "prepare.crf", "prepare.preset",
                           "prepare.tune", "prepare.quality")}
        try:
            rows, summary = merge_parts(records, src_root, out_root, classes=classes, expect=expect)
        except PartsError as e:
            raise _Refused(f"prepare: {e}") from None
        c = summary["counts"]
        print(f"prepare --merge: {summary['parts']} parts, {c['videos']} videos ({summary['mode']}): "
              f"{c['videos'] - c['failed']} ready in {out_root} (list: all.txt), {c['failed']} failed "
              f"(see prepare_report.json)")
        return rows, summary
    if part is not None:
        i, n, where = part
        host = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
        print(f"prepare: part {i} of {n} (from {where}) on {host}, {p.workers} worker(s)", flush=True)
        report = prepare_part(records, src_root, out_root, i, n, mode=p.mode, workers=p.workers, **opts)
        rows, c = report["files"], report["counts"]
        print(f"prepare: part {i} of {n}: {c['videos']} of {len(records)} videos, {c['done']} done, {c['skipped']} "
              f"skipped (already prepared), {c['failed']} failed, {c['temporaries_removed']} temporary file(s) of a "
              f"killed run removed, in {report['seconds']:.1f} s; report {PARTS_DIR}/"
              f"{part_report_path(out_root, i, n).name}. After all {n} parts: tsm-ds prepare SRC OUT --merge")
        return rows, {}
    rows = prepare_dataset(records, src_root, out_root, mode=p.mode, classes=classes, workers=p.workers, **opts)
    ok = [r for r in rows if r["status"] != "failed"]
    print(f"prepare: {len(ok)} of {len(rows)} files ready in {out_root} (list: all.txt); "
          f"{len(rows) - len(ok)} failed (see prepare_report.json)")
    return rows, {}


def _keep_split(split, rows: list[dict], out_root: str, src_root: str, *, mode: str) -> None:
    """Write the dataset's split into OUT (train / val / test lists, classes, dataset.json) and say so."""
    from tsm_ds.data.datasets import PREPARED_FILE, write_prepared_split

    doc = write_prepared_split(out_root, split, rows, mode=mode, source=src_root)
    kept = {s: len(side) - len(doc["failed"].get(s, [])) for s, side in
            (("train", split.train), ("val", split.val), ("test", split.test))}
    print(f"prepare: the {split.dataset} split kept in {out_root}: train.txt {kept['train']}, val.txt "
          f"{kept['val']}, test.txt {kept['test']} files, classes.txt, {PREPARED_FILE}; train with --data "
          f"{out_root}")


def _shard_split(split, rows: list[dict]) -> dict | None:
    """The dataset's split as the shards' ``samples.json`` keeps it, or None without a dataset."""
    if split is None:
        return None
    from tsm_ds.data.datasets import prepared_sides

    ok, failed_src = prepared_sides(split, rows)
    return {"dataset": split.dataset, "dataset_split": split.dataset_split, "flip": split.flip,
            **{side: [row["out"] for row in kept] for side, kept in ok.items()},
            "missing": {s: split.missing.get(s, []) + failed_src.get(s, []) for s in ("train", "val", "test")}}


def _write_shards(out_root: str, rows: list[dict], shard_mb: float, classes, split: dict | None = None) -> int:
    """Write (or find already written) ``OUT/shards`` from the prepared packs (with a dataset's
    ``split``, :func:`tsm_ds.data.shards.write_shards`); returns 0, or 2 with a message when a
    different shard folder is there."""
    from tsm_ds.data.shards import SAMPLES_FILE, read_samples, write_shards
    from tsm_ds.data.video import VideoError

    folder = os.path.join(out_root, "shards")
    want = [(r["out"], int(r["label"])) for r in rows if r["status"] != "failed"]
    if os.path.isfile(os.path.join(folder, SAMPLES_FILE)):
        try:
            keys, labels, _ = read_samples(folder)
        except ValueError as e:   # e.g. shards of an older layout (version 1: one sample per pack)
            print(f"prepare: {e}; remove {folder} to write them again", file=sys.stderr)
            return 2
        if list(zip(keys, labels)) == want:
            print(f"prepare: shards in {folder} already hold these {len(want)} packs (kept)")
            return 0
        print(f"prepare: {folder} holds shards of other packs ({len(keys)} samples, these are {len(want)}); "
              "remove the folder to write them again", file=sys.stderr)
        return 2
    try:
        info = write_shards(out_root, want, folder, shard_mb=shard_mb, classes=classes, split=split)
    except (ValueError, VideoError) as e:   # a pack damaged since it was written is named
        print(f"prepare: {e}", file=sys.stderr)
        return 2
    print(f"prepare: {info['samples']} packs ({info['frames']} frames) in {info['shards']} shards of <= "
          f"{shard_mb:g} MB in {folder} ({info['bytes'] / 1e6:.1f} MB); train with --data {folder}")
    return 0


if __name__ == "__main__":
    from tsm_ds.cli.process_exit import exit_process
    exit_process(main())
