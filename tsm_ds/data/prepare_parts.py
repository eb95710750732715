"""``tsm-ds prepare`` on many nodes: one part of the videos per process (``--part i/n`` or a SLURM
array task), then one merge (``--merge``) that writes the lists and the report of the whole set.

The split: the source records sorted by path, video ``k`` of that list goes to part ``k mod n``
(strided, not contiguous blocks). Sorted Kinetics paths are grouped by class, and classes differ
in clip length and resolution; a stride gives every part a slice of every class, so parts take
about the same time (contiguous blocks would give one part the longest classes) and their sizes
differ by at most one video. The split depends only on the sorted source list and ``n``, so a
rerun (or any node) computes the same parts.

A part writes its outputs into the shared OUT tree (the same paths as a one-node prepare) and its
report ``OUT/parts/part-<i>-of-<n>.json`` (4 digits each, ``i`` from 0): its rows (src, out, label,
status, num_frames, reason) in split order and the counts ``done`` / ``skipped`` (already there
from an earlier, killed run) / ``failed`` / ``temporaries_removed`` (half-written files a killed
run left). It writes no global list: ``all.txt``, ``classes.txt`` and ``prepare_report.json`` are
the merge's. The report is written atomically when the part has finished, so a report present
means a finished part.

The merge re-reads the source (the class folders, or ``--list``) as a one-node prepare does,
checks that the reports of all ``n`` parts are there, agree on the mode and options, and cover the
sorted source list exactly (each part its own stride), then writes the three files from the rows
in the one-node order: byte for byte what ``tsm-ds prepare SRC OUT`` writes on one node for the
same outputs.

Which part a process takes (:func:`resolve_part`): ``--part i/n`` when given; else under a SLURM
array job ``i = SLURM_ARRAY_TASK_ID`` and ``n = --parts`` when given, else the array's size
(``SLURM_ARRAY_TASK_COUNT``, or ``MAX - MIN + 1``), which must then be ``--array=0-<n-1>``
(contiguous from 0, no step); else no part: the whole set on this node.
"""
from __future__ import annotations

import json
import os
import re
import socket
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from tsm_ds.utils.io import atomic_write_text

__all__ = ["PARTS_DIR", "PartsError", "parse_part", "resolve_part", "sorted_records", "split_records",
           "part_report_path", "prepare_part", "read_part_reports", "merge_parts"]

#: the folder of OUT that holds the part reports
PARTS_DIR = "parts"

_REPORT_NAME = re.compile(r"^part-(\d+)-of-(\d+)\.json$")


class PartsError(ValueError):
    """Parts that cannot be run or merged (the message names the flag, part or file, and the fix)."""


def parse_part(text: str) -> tuple[int, int]:
    """``"3/64"`` -> ``(3, 64)``: part ``i`` of ``n``, ``0 <= i < n``.

    Raises:
        PartsError: not ``i/n`` with integers, ``n < 1`` or ``i`` outside ``0 .. n-1``.
    """
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", str(text))
    if not m:
        raise PartsError(f"--part {text!r}: expected I/N, part I of N counted from 0 (e.g. --part 0/4 ... --part 3/4)")
    i, n = int(m.group(1)), int(m.group(2))
    if n < 1 or i >= n:
        raise PartsError(f"--part {text}: the part must be 0 .. N-1 of N >= 1 parts (e.g. --part 0/{max(n, 1)})")
    return i, n


def _env_int(environ: Mapping[str, str], name: str) -> int | None:
    v = environ.get(name, "")
    if v == "":
        return None
    if not v.isdigit():
        raise PartsError(f"{name}={v!r} is not a number: run under a SLURM array job, or pass --part I/N")
    return int(v)


def resolve_part(part: str | None, parts: int | None, environ: Mapping[str, str]
                 ) -> tuple[int, int, str] | None:
    """The part this process prepares (precedence in the module docstring).

    Args:
        part: ``--part`` (``"i/n"``) or None. parts: ``--parts`` (N for an array task) or None.
        environ: the environment (``os.environ``): ``SLURM_ARRAY_TASK_ID``, ``_COUNT``, ``_MIN``,
            ``_MAX``.

    Returns:
        (i, n, where it came from: ``"--part"`` or ``"SLURM_ARRAY_TASK_ID=..."``), or None: no
        part (the whole set on this node).

    Raises:
        PartsError: a malformed ``--part``; ``--part`` and ``--parts`` disagree; ``--parts``
            outside an array job; an array task id outside ``0 .. n-1``; an array that is not
            ``0-<n-1>`` without ``--parts`` (a step, a list, or not starting at 0).
    """
    if parts is not None and parts < 1:
        raise PartsError(f"--parts {parts}: the number of parts must be >= 1")
    if part is not None:
        i, n = parse_part(part)
        if parts is not None and parts != n:
            raise PartsError(f"--part {part} and --parts {parts} disagree on the number of parts: give one of them")
        return i, n, "--part"
    task = _env_int(environ, "SLURM_ARRAY_TASK_ID")
    if task is None:
        if parts is not None:
            raise PartsError(f"--parts {parts} takes the part from SLURM_ARRAY_TASK_ID, which is not set (not an "
                             "array job): pass --part I/N instead")
        return None
    where = f"SLURM_ARRAY_TASK_ID={task}"
    if parts is not None:
        if task >= parts:
            raise PartsError(f"{where} is not a part of --parts {parts} (0 .. {parts - 1}): submit "
                             f"--array with indices below {parts}")
        return task, parts, where
    lo, hi = _env_int(environ, "SLURM_ARRAY_TASK_MIN"), _env_int(environ, "SLURM_ARRAY_TASK_MAX")
    count = _env_int(environ, "SLURM_ARRAY_TASK_COUNT")
    if lo is None or hi is None:
        raise PartsError(f"{where} without SLURM_ARRAY_TASK_MIN / _MAX: pass --part I/N (or --parts N)")
    n = count if count is not None else hi - lo + 1
    if lo != 0 or n != hi + 1:
        raise PartsError(f"array job --array={lo}-{hi} with {n} task(s) is not 0-{n - 1}: the part index is the "
                         f"task id, so submit --array=0-<N-1>; to rerun some parts of N, add --parts N "
                         f"(sbatch --array=3,7 ... --parts N) or pass --part I/N")
    return task, n, where


def sorted_records(records) -> list:
    """The records sorted by path (then label): the order the split is defined on."""
    return sorted(records, key=lambda r: (str(r.path), r.label))


def split_records(records, i: int, n: int) -> list:
    """Part ``i`` of ``n`` of ``records``: the videos ``k`` of the sorted list with ``k mod n == i``.

    Raises:
        PartsError: ``i`` outside ``0 .. n-1``.
    """
    if not 0 <= i < n:
        raise PartsError(f"part {i} of {n}: the part must be 0 .. {n - 1}")
    return sorted_records(records)[i::n]


def part_report_path(out_root: str | os.PathLike, i: int, n: int) -> Path:
    """``OUT/parts/part-<i>-of-<n>.json`` (4 digits each, ``i`` from 0)."""
    return Path(out_root) / PARTS_DIR / f"part-{i:04d}-of-{n:04d}.json"


def prepare_part(records, src_root: str, out_root: str, i: int, n: int, *, mode: str = "packed",
                 workers: int = 1, progress: bool = True, **opts) -> dict:
    """Prepare part ``i`` of ``n`` of ``records`` into ``out_root`` and write its report.

    Finished outputs (an earlier run of this part, killed or not) are skipped and counted;
    temporaries a killed run left beside this part's outputs are removed and counted.

    Args:
        records: every ``VideoRecord`` of the source (the whole set: the part is chosen here).
        src_root / out_root / mode / workers / progress / opts: as
            :func:`tsm_ds.data.prepare.prepare_dataset`.
        i, n: the part, ``0 <= i < n``.

    Returns:
        the report written to :func:`part_report_path`: ``part``, ``parts``, ``src``, ``mode``,
        ``options``, ``sources`` (videos in the whole source), ``counts`` (``videos``, ``done``,
        ``skipped``, ``failed``, ``temporaries_removed``), ``host`` (``SLURMD_NODENAME``, else the host
        name), ``seconds``, ``files`` (rows).

    Raises:
        PartsError: ``i`` outside ``0 .. n-1``. ValueError: an unknown mode. OSError: OUT not writable.
    """
    from .prepare import prepare_rows

    mine = split_records(records, i, n)
    t0 = time.monotonic()
    rows, temporaries = prepare_rows(mine, src_root, out_root, mode=mode, workers=workers, progress=progress, **opts)
    counts = {"videos": len(rows), "done": sum(r["status"] == "done" for r in rows),
              "skipped": sum(r["status"].startswith("skipped") for r in rows),
              "failed": sum(r["status"] == "failed" for r in rows), "temporaries_removed": temporaries}
    report = {"part": i, "parts": n, "src": os.path.abspath(src_root), "mode": mode, "options": opts,
              "sources": len(records), "counts": counts,
              "host": os.environ.get("SLURMD_NODENAME") or socket.gethostname(),
              "seconds": round(time.monotonic() - t0, 3), "files": rows}
    atomic_write_text(part_report_path(out_root, i, n), json.dumps(report, indent=2) + "\n")
    return report


def read_part_reports(out_root: str | os.PathLike) -> dict[int, dict[int, dict]]:
    """Every part report under ``OUT/parts``: ``{n: {i: report}}``.

    Raises:
        PartsError: a report that is not JSON, or whose name and content disagree.
    """
    found: dict[int, dict[int, dict]] = {}
    folder = Path(out_root) / PARTS_DIR
    if not folder.is_dir():
        return found
    for f in sorted(folder.iterdir()):
        m = _REPORT_NAME.match(f.name)
        if not m:
            continue
        try:
            report = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise PartsError(f"{f}: unreadable part report ({e}): delete it and rerun that part") from None
        i, n = int(m.group(1)), int(m.group(2))
        if report.get("part") != i or report.get("parts") != n:
            raise PartsError(f"{f}: names part {i} of {n} but holds part {report.get('part')} of "
                             f"{report.get('parts')}: delete it and rerun that part")
        found.setdefault(n, {})[i] = report
    return found


def _examples(items: Sequence[str], k: int = 3) -> str:
    return ", ".join(items[:k]) + (f" (+{len(items) - k} more)" if len(items) > k else "")


def merge_parts(records, src_root: str, out_root: str, *, classes=None,
                expect: Mapping[str, object] | None = None) -> tuple[list[dict], dict]:
    """Check the part reports of ``out_root`` against ``records`` and write ``all.txt``,
    ``classes.txt`` and ``prepare_report.json`` for the whole set (as a one-node prepare does).

    Args:
        records: every ``VideoRecord`` of the source, in the one-node order (class folders:
            sorted; ``--list``: the list's order); the rows are written in this order.
        src_root / out_root: as :func:`tsm_ds.data.prepare.prepare_dataset`.
        classes: class names for ``classes.txt`` (None: no file).
        expect: ``mode`` and option values given to the merge (``short_side``, ``keyint``, ...):
            each must equal the parts' (None: take the parts').

    Returns:
        (rows in the records' order, summary: ``parts``, ``mode``, ``options``, ``counts``
        summed over the parts).

    Raises:
        PartsError: no part report; reports of different part counts; missing parts (named, with
            the command that reruns them); parts of different modes or options, or other than
            ``expect``; a part whose rows are not its share of the sorted source (the source
            changed after it ran).
        OSError: OUT not writable.
    """
    from .prepare import write_lists

    out_root = os.path.abspath(out_root)
    src_root = os.path.abspath(src_root)
    found = read_part_reports(out_root)
    where = Path(out_root) / PARTS_DIR
    if not found:
        raise PartsError(f"--merge: no part report in {where}: run the parts first (tsm-ds prepare SRC OUT --part I/N, "
                         "or sbatch --array=0-<N-1> launch/slurm_prepare.sbatch SRC OUT)")
    if len(found) > 1:
        desc = "; ".join(f"{len(v)} of {n}" for n, v in sorted(found.items()))
        raise PartsError(f"--merge: {where} holds reports of different splits ({desc} parts): keep the reports of "
                         "one split (delete the others' part-*-of-<N>.json) and rerun its missing parts")
    n, reports = next(iter(found.items()))
    missing = [i for i in range(n) if i not in reports]
    if missing:
        names = _examples([part_report_path(out_root, i, n).name for i in missing], 8)
        idx = ",".join(str(i) for i in missing)
        raise PartsError(f"--merge: {len(missing)} of {n} parts have no report in {where} (not run, or not "
                         f"finished): parts {_examples([str(i) for i in missing], 16)} ({names}). Rerun them "
                         f"(finished videos are skipped): sbatch --array={idx} launch/slurm_prepare.sbatch SRC OUT "
                         f"--parts {n}, or tsm-ds prepare SRC OUT --part I/{n} for each")
    first = reports[0]
    mode, options = first["mode"], first["options"]
    for i, r in sorted(reports.items()):
        if (r["mode"], r["options"]) != (mode, options):
            raise PartsError(f"--merge: part {i} was prepared with --mode {r['mode']} {r['options']}, part 0 with "
                             f"--mode {mode} {options}: rerun part {i} into a clean OUT with part 0's options")
        if r["src"] != src_root:
            raise PartsError(f"--merge: part {i} prepared {r['src']}, the merge reads {src_root}: give the merge "
                             "the parts' SRC (the same path on every node)")
    for key, value in (expect or {}).items():
        have = mode if key == "mode" else options.get(key)
        if have != value:
            flag = "--" + key.replace("_", "-")
            raise PartsError(f"--merge: {flag} {value} given, but the parts were prepared with {flag} {have}: "
                             f"drop {flag} (the merge takes the parts' options) or rerun the parts")
    ordered = sorted_records(records)
    for i in range(n):
        want = [str(r.path) for r in ordered[i::n]]
        have = [row["src"] for row in reports[i]["files"]]
        if have != want:
            lost = [s for s in want if s not in set(have)]
            extra = [s for s in have if s not in set(want)]
            what = []
            if lost:
                what.append(f"{len(lost)} video(s) of its share missing ({_examples(lost)})")
            if extra:
                what.append(f"{len(extra)} not in its share of the source ({_examples(extra)})")
            raise PartsError(f"--merge: part {i} of {n} ({part_report_path(out_root, i, n).name}) does not hold its "
                             f"share of the sorted source: {'; '.join(what) or 'a different order'}. "
                             f"The source changed after the parts ran: rerun every part (finished videos are skipped)")
    by_src: dict[str, list[dict]] = {}
    for i in range(n):
        for row in reports[i]["files"]:
            by_src.setdefault(row["src"], []).append(row)
    rows = [by_src[str(r.path)].pop(0) for r in records]
    write_lists(out_root, rows, src_root=src_root, mode=mode, options=options, classes=classes)
    counts = {k: sum(reports[i]["counts"][k] for i in range(n))
              for k in ("videos", "done", "skipped", "failed", "temporaries_removed")}
    return rows, {"parts": n, "mode": mode, "options": options, "counts": counts}
