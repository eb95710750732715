"""``tsm-ds bench {models,data,comm,scale,all}``: the benchmark entry point.

A single bench runs in this process: ``tsm-ds bench scale --out-dir R`` calls
``tsm_ds.cli.bench_scale.main(["--out-dir", "R"])``. ``all`` runs every bench one after the other,
each in its own Python process with a time limit (:func:`tsm_ds.bench.runner.run_all`), passes
``--quick`` when no GPU is present (reduced sizes: the set fits in about 10 minutes on a 2-core
CPU) and full sizes on a GPU, then writes ``summary.json`` / ``summary.md`` and the PNG plots into
the same folder.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import importlib.util
import inspect
import io
import os
import re
import sys
from typing import Sequence

from tsm_ds.bench.runner import BenchJob
from tsm_ds.bench.runner import run_all as run_benches
from tsm_ds.config import Command, Config, parse
from tsm_ds.config.fields import build_parser as build_parser_for
from tsm_ds.config.tools import BENCH_ALL

#: bench name -> (command module, one-line help)
BENCHES: dict[str, tuple[str, str]] = {
    "models": ("tsm_ds.cli.bench_models",
               "throughput, FLOPs, parameters, gradient bytes: TSM vs TSN vs I3D vs torchvision"),
    "data": ("tsm_ds.cli.bench_data",
             "clip loader throughput: decoders, workers, training items per core by data format"),
    "comm": ("tsm_ds.cli.bench_comm", "gradient communication: bytes and time per step, fp32 / bf16 / 1-bit"),
    "scale": ("tsm_ds.cli.bench_scale", "analytic scaling model: 6 -> 1,536 GPUs, TSM vs I3D, what-ifs"),
    "large-batch": ("tsm_ds.cli.bench_large_batch", "accuracy against the global batch in the paper's regime "
                    "(8 -> 256 clips), SGD linear rule / LARS / LAMB via the trainer (not in 'all': ~6 h on 2 cores)"),
    "multigrid": ("tsm_ds.cli.bench_multigrid", "multigrid shape schedule against the base recipe on the large-batch "
                  "study's task: top-1, training time, time to the base's top-1 (not in 'all': hours on one core)"),
}


def _usage() -> str:
    width = max(len(n) for n in BENCHES)
    lines = ["usage: tsm-ds bench <bench> [options]", "", "benches:"]
    lines += [f"  {n.ljust(width)}  {h}" for n, (_, h) in BENCHES.items()]
    lines += [f"  {'all'.ljust(width)}  every bench above but large-batch and multigrid (--quick on CPU, full size "
              "on a GPU), then summary.md and the PNG plots",
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


def _command() -> Command:
    """``tsm-ds bench all``'s :class:`~tsm_ds.config.fields.Command`
    (:data:`tsm_ds.config.tools.BENCH_ALL`) with the list of benches as its description."""
    return dataclasses.replace(BENCH_ALL, description=_usage())


def build_parser() -> argparse.ArgumentParser:
    """The ``tsm-ds bench all`` argument parser (generated from :data:`tsm_ds.config.tools.BENCH_ALL`)."""
    return build_parser_for(_command(), Config)


def run_all(argv: Sequence[str]) -> int:
    """``tsm-ds bench all``: every bench in its own process, then summary and plots.

    Returns 0 when every bench succeeded, 1 otherwise (the summary is written either way), 2 for
    an unknown bench in ``--only``.

    Raises:
        SystemExit: bad options (argparse), ``--quick`` with ``--full``.
    """
    cfg, _ = parse(_command(), Config, list(argv))
    a = cfg.bench_all
    if a.quick and a.full:
        build_parser().error("argument --full: not allowed with argument --quick")
    names = list(a.only)
    unknown = [n for n in names if n not in BENCHES]
    if unknown:
        print(f"tsm-ds bench all: unknown bench(es) {unknown}; choose from {sorted(BENCHES)}", file=sys.stderr)
        return 2
    if (a.quick or a.full) and names == ["scale"]:
        has_gpu = False                           # the model needs neither torch nor a GPU
    else:
        import torch

        has_gpu = torch.cuda.is_available()
    quick = a.quick if (a.quick or a.full) else not has_gpu
    env = dict(os.environ)
    if not has_gpu:
        env.setdefault("DS_ACCELERATOR", "cpu")   # DeepSpeed's CPU accelerator for bench comm
    jobs = [BenchJob(n, skip=f"{BENCHES[n][0]} not present") if importlib.util.find_spec(BENCHES[n][0]) is None
            else BenchJob(n, tuple(bench_argv(n, a.out_dir, quick=quick))) for n in names]
    done = run_benches(a.out_dir, jobs, quick=quick, time_limit_scale=a.time_limit_scale, env=env,
                       echo=sys.stdout.write)
    print(f"\nwrote {done.summary_md}")
    for r in done.results:
        print(f"  {r['bench']:7s} {r['status']} ({r['seconds']} s)")
    for k, v in done.plots.items():
        print(f"  plot {k}: {v}")
    return 0 if all(r["status"] == "ok" for r in done.results) else 1


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
    from tsm_ds.cli.process_exit import exit_process
    exit_process(main())
