"""``tsm-ds bench all``, the library half: every bench in its own process, then the summary.

Each bench runs as ``python -m tsm_ds.cli bench NAME ARGV`` in a new process group with a time
limit (a bench that crashes, hangs or runs out of memory cannot take the others with it; on
time-out the whole group, DataLoader workers and ranks included, is stopped). Then
``summary.json`` / ``summary.md`` (every bench's status, time and table, with the key numbers) and
the PNG plots of :mod:`tsm_ds.bench.plots` are written into the same folder. The command line
(which argv each bench gets, ``--quick`` without a GPU) is :mod:`tsm_ds.cli.bench`.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable, Sequence

from tsm_ds.utils.io import append_markdown, markdown_table, read_report, write_report

__all__ = ["ALL_ORDER", "TIME_LIMITS", "DEFAULT_OUT", "BenchJob", "AllResult", "run_subprocess",
           "write_summary", "run_all"]

#: order of ``all`` (scale last: it reads the others' JSON)
ALL_ORDER: tuple[str, ...] = ("comm", "data", "models", "scale")
#: per-bench time limits of ``all`` in seconds: (quick, full)
TIME_LIMITS: dict[str, tuple[float, float]] = {
    "models": (400.0, 3600.0), "data": (240.0, 3600.0), "comm": (180.0, 1800.0), "scale": (60.0, 60.0)}
#: default output folder of the benches
DEFAULT_OUT = "bench_out"


@dataclass(frozen=True)
class BenchJob:
    """One bench of an ``all`` run.

    Attributes:
        name: the bench (``models``, ``data``, ``comm``, ``scale``): ``tsm-ds bench NAME``.
        argv: its arguments (output folder, ``--quick``, ...).
        skip: why it is not run (e.g. its module is not installed); None runs it.
    """

    name: str
    argv: tuple[str, ...] = ()
    skip: str | None = None


@dataclass
class AllResult:
    """What :func:`run_all` did: one row per bench, the plots, the summary's markdown path."""

    results: list[dict[str, Any]]
    plots: dict[str, Path | str]
    summary_md: Path


def run_subprocess(name: str, argv: Sequence[str], timeout: float, log: IO[str],
                   env: dict[str, str] | None = None,
                   echo: Callable[[str], Any] | None = None) -> dict[str, Any]:
    """Run ``python -m tsm_ds.cli bench name argv`` with a time limit.

    Its output (stdout and stderr, line by line) goes to the open text file ``log`` and to
    ``echo`` (e.g. ``sys.stdout.write``; None: not echoed), framed by a header and a status line.
    On time-out its process group gets SIGTERM, then SIGKILL after 10 s.

    Args:
        name: the bench; argv: its arguments; timeout: seconds; env: the child's environment
            (None: this process's).

    Returns:
        {"bench", "argv" (joined), "rc" (-1 on time-out), "seconds", "status" ("ok",
        "failed (exit N)", "timed out after N s")}.
    """
    def say(text: str) -> None:
        log.write(text)
        if echo is not None:
            echo(text)

    cmd = [sys.executable, "-m", "tsm_ds.cli", "bench", name, *argv]
    say(f"\n=== tsm-ds bench {name} {' '.join(argv)} (limit {timeout:.0f} s) ===\n")
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            bufsize=1, start_new_session=True, env=env)

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            say(line)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        rc = proc.wait(timeout=timeout)
        status = "ok" if rc == 0 else f"failed (exit {rc})"
    except subprocess.TimeoutExpired:
        # the bench and the DataLoader workers / ranks it started: its own process group
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        rc, status = -1, f"timed out after {timeout:.0f} s"
    reader.join(timeout=5)
    seconds = time.perf_counter() - t0
    say(f"=== bench {name}: {status} in {seconds:.1f} s ===\n")
    log.flush()
    return {"bench": name, "argv": " ".join(argv), "rc": rc, "seconds": round(seconds, 1), "status": status}


def _headline(out: Path) -> list[str]:
    """Key numbers of the summary (markdown bullet lines), from the bench JSONs in ``out`` that
    exist: TSM/other throughput ratios (models.json), our loader against the others (data.json),
    gradient bytes per method (comm.json), the scaling prediction and TSM vs I3D (scale.json)."""
    lines: list[str] = []
    models = read_report(out / "models.json")
    if models:
        rows = {str(r.get("model")): r for r in models["rows"] if isinstance(r, dict)}
        tsm = rows.get("TSM-R50")
        if tsm:
            for other in ("TSN-R50", "I3D-R50-8f", "I3D-R50-32f"):
                o = rows.get(other)
                parts = []
                for kind in ("train", "infer"):
                    a, b = tsm.get(f"{kind}_clips_per_s"), (o or {}).get(f"{kind}_clips_per_s")
                    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b > 0:
                        parts.append(f"{kind} {a / b:.2f}x")
                if parts:
                    lines.append(f"- TSM-R50 / {other} throughput (measured here): " + ", ".join(parts))
    data = read_report(out / "data.json")
    if data:
        rows = [r for r in data["rows"] if isinstance(r, dict) and isinstance(r.get("clips_per_s"), (int, float))]
        for inp in dict.fromkeys(str(r.get("input")) for r in rows):
            ours = next((r for r in rows if r.get("input") == inp and r.get("loader") == "tsm_ds"), None)
            if not ours:
                continue
            others = [f"{r['loader']} {r['clips_per_s']:.3g} ({ours['clips_per_s'] / r['clips_per_s']:.2f}x)"
                      for r in rows if r.get("input") == inp and r.get("loader") != "tsm_ds"]
            lines.append(f"- loader on {inp} (measured here): tsm_ds {ours['clips_per_s']:.3g} clips/s; "
                         "others (tsm_ds / other): " + (", ".join(others) or "none"))
    comm = read_report(out / "comm.json")
    if comm:
        parts = [f"{r['method']} {r['bytes_sent_per_rank'] / 1e6:.2f} MB"
                 + (f" ({r['time_ms']:.0f} ms)" if isinstance(r.get("time_ms"), (int, float)) else "")
                 for r in comm["rows"] if isinstance(r, dict) and r.get("method")
                 and isinstance(r.get("bytes_sent_per_rank"), (int, float))]
        if parts:
            lines.append(f"- gradient bytes sent per rank per step (world size "
                         f"{comm['meta'].get('world_size', '?')}, measured here): " + ", ".join(parts))
    scale = read_report(out / "scale.json")
    if scale:
        p, d = scale["meta"].get("prediction", {}), scale["meta"].get("tsm_vs_i3d", {})
        if "error_pct" in p:
            lines.append(f"- scaling model: {p.get('gpus')} GPUs predicted {p.get('train_time')} vs paper "
                         f"{p.get('paper_time')}: error {p['error_pct']:+.1f} % (calibrated only on one node)")
        if d:
            lines.append(f"- TSM vs I3D at {d.get('gpus')} GPUs (model): I3D takes {d['i3d_over_tsm_time']:.2f}x "
                         f"as long; scaling efficiency {100 * d['tsm_efficiency']:.1f} % vs "
                         f"{100 * d['i3d_efficiency']:.1f} %")
    return lines


def write_summary(out: Path, results: Sequence[dict[str, Any]], plots: dict[str, Any], *,
                  quick: bool, started: float) -> Path:
    """``summary.json`` (one row per bench: status, seconds) and ``summary.md``: headline numbers,
    each bench's markdown report, the plots. Returns the markdown path.

    Args:
        out: the folder of the bench reports; both files are written there (atomically).
        results: one dict per bench ({"bench", "argv", "rc", "seconds", "status"}).
        plots: {plot name: PNG path, or why there is none} (:func:`tsm_ds.bench.plots.make_plots`).
        quick: the reduced sizes were used (stated in the summary).
        started: ``time.perf_counter()`` at the start of the run (for the total time).

    Raises:
        OSError: ``out`` is not writable.
    """
    meta = {"mode": "quick (CPU, reduced sizes)" if quick else "full size",
            "total_seconds": round(time.perf_counter() - started, 1),
            "plots": {k: str(v) for k, v in plots.items()},
            "note": "benchmark numbers are noisy when the machine is shared; each bench reports "
                    "medians of interleaved repetitions"}
    _, md_path = write_report("summary", list(results), out, meta=meta, title="tsm-ds bench all")
    parts = ["# tsm-ds bench all", "",
             f"Mode: {meta['mode']}; total {meta['total_seconds']} s. {meta['note']}.", "",
             markdown_table(results, ["bench", "status", "seconds", "argv"])]
    head = _headline(out)
    if head:
        parts += ["## Key numbers", "", *head, ""]
    # every bench's markdown (a bench may write several, e.g. models.md + shift_op.md)
    mains = [out / f"{b}.md" for b in ("models", "data", "comm", "scale")]
    others = sorted(p for p in out.glob("*.md") if p not in mains and p.name != "summary.md")
    for md in [p for p in mains if p.exists()] + others:
        parts += [f"<!-- {md.name} -->", md.read_text().replace("\n## ", "\n### ").strip(), ""]
    parts += ["## Plots", ""]
    for name, v in plots.items():
        parts.append(f"![{name}]({Path(v).name})" if isinstance(v, Path) else f"- {name}: {v}")
    return append_markdown(md_path, "\n".join(parts) + "\n", replace=True)


def run_all(out_dir: str | os.PathLike, jobs: Sequence[BenchJob], *, quick: bool,
            time_limit_scale: float = 1.0, env: dict[str, str] | None = None,
            echo: Callable[[str], Any] | None = None) -> AllResult:
    """Run ``jobs`` one after the other, each in its own process (:func:`run_subprocess`) with
    its :data:`TIME_LIMITS` entry (quick or full) times ``time_limit_scale``, logging to
    ``out_dir/bench_all.log``; then the plots and the summary (:func:`write_summary`).

    Args:
        out_dir: folder of every report (created).
        jobs: the benches in run order; a job with ``skip`` set gets a "skipped: ..." row.
        quick: the reduced sizes are used (selects the time limits; stated in the summary).
        env: the children's environment (None: this process's).
        echo: receives the children's output as it comes (None: the log file only).

    Returns:
        :class:`AllResult`; the summary is written whether or not the benches succeeded.

    Raises:
        KeyError: a job names a bench without a time limit.
        OSError: ``out_dir`` is not writable.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    results = []
    with open(out / "bench_all.log", "w") as log:
        for job in jobs:
            if job.skip is not None:
                results.append({"bench": job.name, "argv": "", "rc": None, "seconds": 0.0,
                                "status": f"skipped: {job.skip}"})
                continue
            limit = TIME_LIMITS[job.name][0 if quick else 1] * time_limit_scale
            results.append(run_subprocess(job.name, job.argv, limit, log, env, echo))
    from tsm_ds.bench.plots import make_plots

    plots = make_plots(out)
    md = write_summary(out, results, plots, quick=quick, started=started)
    return AllResult(results, plots, md)
