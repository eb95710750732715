"""``tsm-ds doctor``: which bottleneck binds on this machine and this data (:mod:`tsm_ds.bench.doctor`).

Usage::

    tsm-ds doctor [--data DIR] [--deepspeed_config R] [--arch A] [--num-segments T] [--img-size S]
                  [--channels-last] [--compile] [--out DIR] [--quick]
    deepspeed --num_gpus 2 --module tsm_ds.cli.doctor ...     # + the gradient all-reduce
    tsm-ds doctor --recipes                                      # every recipe for this device, 3 steps

Writes ``doctor.json``, ``doctor.md`` and ``doctor.png`` under ``--out`` and prints the verdict.
Exit status 1 when a check failed (a section's status ``failed``), 2 for bad options.
"""
from __future__ import annotations

import argparse
import os
import sys


def _csv(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def build_parser() -> argparse.ArgumentParser:
    """The options of ``tsm-ds doctor``."""
    p = argparse.ArgumentParser(prog="tsm-ds doctor", description=(
        "Measure data loading, compute and communication on this machine and your data, say which "
        "one binds and what to change (with the measured effect). JSON + markdown + a plot under --out."))
    p.add_argument("--data", help="your clips, as training's --data (default: $TSM_DS_DATA, then "
                                  "../shared/data/videos)")
    p.add_argument("--deepspeed_config", "--recipe", dest="recipe",
                   help="recipe name or JSON path: its precision is measured (default: cpu_fp32 on CPU, "
                        "gpu_fp16 on CUDA, as training)")
    p.add_argument("--arch", help="model (default resnet50; --quick: resnet18)")
    p.add_argument("--num-segments", type=int, help="T, frames per clip (default 8)")
    p.add_argument("--img-size", type=int, help="crop side in px (default 224; --quick: 64)")
    p.add_argument("--micro-batch", type=int, help="clips per device per step (default: the recipe's, "
                                                   "else 8 on CUDA, 2 on CPU, 1 with --quick)")
    p.add_argument("--num-classes", type=int, default=400)
    p.add_argument("--channels-last", action="store_true", help="also measure compute in channels-last layout")
    p.add_argument("--compile", action="store_true", help="also measure compute under torch.compile")
    p.add_argument("--precisions", type=_csv, default=(),
                   help="more compute precisions, comma list of fp32,bf16,fp16,autocast_bf16,autocast_fp16")
    p.add_argument("--workers", type=lambda t: tuple(int(x) for x in _csv(t)),
                   help="DataLoader worker counts to measure, comma list (default 1,2,4,... up to the "
                        "cores per device)")
    p.add_argument("--reencode-clips", type=int,
                   help="clips re-encoded to measure the `tsm-ds prepare` advice (default 3, --quick 1; 0: off)")
    p.add_argument("--short-side", type=int, default=256, help="re-encoding: short side (tsm-ds prepare's)")
    p.add_argument("--keyint", type=int, default=16, help="re-encoding: keyframe interval")
    p.add_argument("--comm-methods", type=_csv, default=("fp32", "bf16", "onebit"),
                   help="all-reduce variants under the launcher: fp32,bf16,fp16,onebit")
    p.add_argument("--recipes", action="store_true",
                   help="recipe smoke: every ds_configs recipe for this device trains --recipe-steps steps")
    p.add_argument("--recipe-names", type=_csv, help="only these recipes (comma list)")
    p.add_argument("--recipe-steps", type=int, default=3)
    p.add_argument("--recipe-arch", default="resnet18", help="the recipe smoke's model")
    p.add_argument("--only", type=_csv, help="only these sections: environment,compute,data,communication,"
                                             "recipes,onebit,verdict")
    p.add_argument("--quick", action="store_true", help="short time boxes, small defaults (about a minute on 2 cores)")
    p.add_argument("--out", default="doctor_out", help="output folder (doctor.json / .md / .png)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--local_rank", type=int, default=0, help=argparse.SUPPRESS)   # the deepspeed launcher's
    from tsm_ds.cli._doctor_cluster import add_cluster_args
    add_cluster_args(p)   # --hostfile ...: the cluster preflight (tsm_ds/bench/doctor/cluster.py)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the doctor; returns 0, 1 when a check failed, 2 for bad options.

    Raises:
        SystemExit: bad options (argparse).
    """
    args = build_parser().parse_args(argv)
    from tsm_ds.bench.doctor import DoctorSettings, run_doctor
    from tsm_ds.bench.doctor.compute import PRECISIONS
    from tsm_ds.engine.config import ConfigError

    bad = [p for p in args.precisions if p not in PRECISIONS]
    if bad:
        print(f"tsm-ds doctor: --precisions {','.join(bad)}: use {','.join(PRECISIONS)}", file=sys.stderr)
        return 2
    settings = DoctorSettings(
        data=args.data, recipe=args.recipe, arch=args.arch, num_segments=args.num_segments,
        img_size=args.img_size, micro_batch=args.micro_batch, num_classes=args.num_classes,
        channels_last=args.channels_last, compile=args.compile, precisions=args.precisions,
        workers=args.workers, reencode_clips=args.reencode_clips, short_side=args.short_side,
        keyint=args.keyint, comm_methods=args.comm_methods, recipes=args.recipes,
        recipe_names=args.recipe_names, recipe_steps=args.recipe_steps, recipe_arch=args.recipe_arch,
        quick=args.quick, only=args.only, out=args.out)
    from tsm_ds.cli._doctor_cluster import apply_cluster_args, print_cluster_failures
    apply_cluster_args(settings, args)
    try:
        report, paths = run_doctor(settings, progress=not args.no_progress)
    except (ValueError, ConfigError) as e:
        print(f"tsm-ds doctor: {e}", file=sys.stderr)
        return 2
    if report is None:          # not rank 0
        return 0
    for sec in report["sections"].values():
        print(f"{sec['title']:<14} {sec['status']:<12} {sec['summary']}")
    print_cluster_failures(report)
    verdict = report["sections"].get("verdict")
    if verdict and verdict["status"] == "ok":
        print("\nVerdict: " + verdict["summary"])
        for item in verdict["values"]["advice"]:
            print(f"  - {item['text']}")
    print("\nwrote " + ", ".join(str(p) for p in paths.values()))
    if report["failed"]:
        print(f"failed checks: {', '.join(report['failed'])}", file=sys.stderr)
    return int(report["exit_status"])


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
