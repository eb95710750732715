"""``tsm-ds bench {models,data,comm,scale,all}``: the benchmark entry point.

A single bench runs in this process: ``tsm-ds bench scale --out-dir R`` calls
``tsm_ds.bench.scaling.main(["--out-dir", "R"])``. ``all`` runs every bench one after the other,
each in its own Python process (a bench that crashes, hangs or runs out of memory cannot take the
others with it; each has a time limit), passes ``--quick`` when no GPU is present (reduced sizes:
the set fits in about 10 minutes on a 2-core CPU) and full sizes on a GPU, then writes
``summary.json`` / ``summary.md`` (every bench's status, time and table) and the PNG plots of
:mod:`tsm_ds.bench.plots` into the same folder.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import inspect
import io
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Sequence

#: bench name -> (module, one-line help)
BENCHES: dict[str, tuple[str, str]] = {
    "models": ("tsm_ds.bench.models", "throughput, FLOPs, parameters, gradient bytes: TSM vs TSN vs I3D vs torchvision"),
    "data": ("tsm_ds.bench.data", "clip loader throughput: decode strategies, workers, frames per clip"),
    "comm": ("tsm_ds.bench.comm", "gradient communication: bytes and time per step, fp32 / bf16 / 1-bit"),
    "scale": ("tsm_ds.bench.scaling", "analytic scaling model: 6 -> 1,536 GPUs, TSM vs I3D, what-ifs"),
}
#: order and per-bench time limits (s) of ``all``: (quick, full)
ALL_ORDER: tuple[str, ...] = ("comm", "data", "models", "scale")  # scale last: it reads the others' JSON
TIME_LIMITS: dict[str, tuple[float, float]] = {
    "models": (400.0, 3600.0), "data": (240.0, 3600.0), "comm": (180.0, 1800.0), "scale": (60.0, 60.0)}
DEFAULT_OUT = "bench_out"


def _usage() -> str:
    width = max(len(n) for n in BENCHES)
    lines = ["usage: tsm-ds bench <bench> [options]", "", "benches:"]
    lines += [f"  {n.ljust(width)}  {h}" for n, (_, h) in BENCHES.items()]
    lines += [f"  {'all'.ljust(width)}  every bench above (--quick on CPU, full size on a GPU), "
              "then summary.md and the PNG plots",
              "", "Run 'tsm-ds bench <bench> --help' for a bench's options."]
    return "\n".join(lines)


def bench_options(module_name: str) -> set[str]:
    """Option strings (``--out-dir``, ``--quick``, ...) bench ``module_name`` accepts.

    Asked of its ``build_parser()`` when it has one, else read from its argparse ``--help`` text
    (``main(["--help"])`` exits before any work); a module without argparse or that fails to
    import gives an empty set (the subprocess will then show the real error).
    """
    try:
        module = importlib.import_module(module_name)
    except Exception:  # noqa: BLE001
        return set()
    build = getattr(module, "build_parser", None)
    if callable(build):
        try:
            return {o for a in build()._actions for o in a.option_strings}
        except Exception:  # noqa: BLE001
            pass
    try:
        if "argparse" not in inspect.getsource(module):
            return set()
    except (OSError, TypeError):
        return set()
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        try:
            module.main(["--help"])
        except SystemExit:
            pass
        except Exception:  # noqa: BLE001
            return set()
    return set(re.findall(r"(?<![\w-])--[A-Za-z0-9][\w-]*", out.getvalue()))


def bench_argv(name: str, out_dir: str, *, quick: bool, extra: Sequence[str] = ()) -> list[str]:
    """The argument list ``all`` gives bench ``name``: its output-folder flag (``--out-dir`` or
    ``--out``) with ``out_dir``, ``--quick`` when ``quick`` and the bench takes it, then ``extra``."""
    opts = bench_options(BENCHES[name][0])
    argv: list[str] = []
    for flag in ("--out-dir", "--out", "--output-dir"):
        if flag in opts:
            argv += [flag, out_dir]
            break
    if quick and "--quick" in opts:
        argv.append("--quick")
    return argv + list(extra)


def run_one(name: str, argv: Sequence[str]) -> int:
    """Run bench ``name`` in this process with ``argv``; return its exit status.

    Returns 2 (with a message naming the module) when the bench module is not there.
    """
    module_name = BENCHES[name][0]
    if importlib.util.find_spec(module_name) is None:
        print(f"tsm-ds bench {name}: module {module_name} is not installed in this checkout",
              file=sys.stderr)
        return 2
    module = importlib.import_module(module_name)
    return int(module.main(list(argv)) or 0)


def _run_subprocess(name: str, argv: Sequence[str], timeout: float, log,
                    env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``python -m tsm_ds.cli bench name argv`` with a time limit, echoing its output to
    stdout and ``log``. Returns {"bench", "argv", "rc", "seconds", "status"}."""
    cmd = [sys.executable, "-m", "tsm_ds.cli", "bench", name, *argv]
    header = f"\n=== tsm-ds bench {name} {' '.join(argv)} (limit {timeout:.0f} s) ===\n"
    sys.stdout.write(header)
    log.write(header)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            bufsize=1, start_new_session=True, env=env)

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            log.write(line)

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
    line = f"=== bench {name}: {status} in {seconds:.1f} s ===\n"
    sys.stdout.write(line)
    log.write(line)
    log.flush()
    return {"bench": name, "argv": " ".join(argv), "rc": rc, "seconds": round(seconds, 1), "status": status}


def _headline(out: Path) -> list[str]:
    """Key numbers of the summary, from the JSONs that exist (scale.json explicitly)."""
    from tsm_ds.bench.report import read_report

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
    each bench's markdown report, the plots. Returns the markdown path."""
    from tsm_ds.bench.report import append_markdown, markdown_table, write_report

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


def run_all(argv: Sequence[str]) -> int:
    """``tsm-ds bench all``: every bench in its own process, then summary and plots.

    Returns 0 when every bench succeeded, 1 otherwise (the summary is written either way).
    """
    ap = argparse.ArgumentParser(prog="tsm-ds bench all", description=_usage())
    ap.add_argument("--out-dir", default=DEFAULT_OUT, help="output folder (default %(default)s)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="reduced sizes (default without a GPU)")
    mode.add_argument("--full", action="store_true", help="full sizes (default with a GPU)")
    ap.add_argument("--only", default=",".join(ALL_ORDER),
                    help="comma-separated benches to run (default %(default)s)")
    ap.add_argument("--time-limit-scale", type=float, default=1.0,
                    help="multiply every bench's time limit by this")
    args = ap.parse_args(list(argv))
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in BENCHES]
    if unknown:
        print(f"tsm-ds bench all: unknown bench(es) {unknown}; choose from {sorted(BENCHES)}", file=sys.stderr)
        return 2
    if (args.quick or args.full) and names == ["scale"]:
        has_gpu = False                           # the model needs neither torch nor a GPU
    else:
        import torch

        has_gpu = torch.cuda.is_available()
    quick = args.quick if (args.quick or args.full) else not has_gpu
    env = dict(os.environ)
    if not has_gpu:
        env.setdefault("DS_ACCELERATOR", "cpu")   # DeepSpeed's CPU accelerator for bench comm
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    results = []
    with open(out / "bench_all.log", "w") as log:
        for name in names:
            if importlib.util.find_spec(BENCHES[name][0]) is None:
                results.append({"bench": name, "argv": "", "rc": None, "seconds": 0.0,
                                "status": f"skipped: {BENCHES[name][0]} not present"})
                continue
            limit = TIME_LIMITS[name][0 if quick else 1] * args.time_limit_scale
            results.append(_run_subprocess(name, bench_argv(name, str(out), quick=quick), limit, log, env))
    from tsm_ds.bench.plots import make_plots

    plots = make_plots(out)
    md = write_summary(out, results, plots, quick=quick, started=started)
    print(f"\nwrote {md}")
    for r in results:
        print(f"  {r['bench']:7s} {r['status']} ({r['seconds']} s)")
    for k, v in plots.items():
        print(f"  plot {k}: {v}")
    return 0 if all(r["status"] == "ok" for r in results) else 1


def main(argv: list[str] | None = None) -> int:
    """Dispatch ``tsm-ds bench <bench> ...``; ``all`` runs the set.

    Returns the bench's exit status; 2 for an unknown bench.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name == "all":
        return run_all(rest)
    if name not in BENCHES:
        print(f"tsm-ds bench: unknown bench {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    return run_one(name, rest)


if __name__ == "__main__":
    sys.exit(main())
