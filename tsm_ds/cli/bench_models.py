"""``tsm-ds bench models``: throughput, cost and gradient size of TSM against its baselines
(:mod:`tsm_ds.bench.models`). Writes models.json/.md, shift_overhead.* and shift_op.* to ``--out``.
"""
from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    """The ``tsm-ds bench models`` argument parser."""
    p = argparse.ArgumentParser(prog="tsm-ds bench models", description=(
        "Throughput, cost and gradient size of TSM against its baselines: model zoo (TSM/TSN/I3D/"
        "torchvision video models), TSM/TSN step-time overhead, the shift op alone."))
    p.add_argument("--img-size", type=int, default=224, help="model-zoo frame size (px)")
    p.add_argument("--batch", type=int, default=2, help="clips per step")
    p.add_argument("--frames", type=int, default=8, help="TSM/TSN frames per clip")
    p.add_argument("--video-frames", type=int, default=16,
                   help="frames per clip for r2plus1d_18 / r3d_18 / s3d")
    p.add_argument("--reps", type=int, default=5, help="interleaved repetitions (median of these)")
    p.add_argument("--shift-sizes", default="112,224",
                   help="comma-separated image sizes of the TSM/TSN shift-overhead comparison")
    p.add_argument("--shift-batch", type=int, default=None, help="batch of that comparison "
                   "(default --batch)")
    p.add_argument("--num-classes", type=int, default=400)
    p.add_argument("--models", default=None, help="comma-separated subset of the zoo labels")
    p.add_argument("--skip", default="", help="comma-separated parts to skip: zoo,overhead,op")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: "
                   "torch's). On a shared CPU use 1: busy-waiting OpenMP threads that lose their "
                   "core made a 2-thread ResNet-50 step 4-9x slower than 1 thread here")
    p.add_argument("--out-dir", "--out", dest="out", default="bench_out", help="output directory")
    p.add_argument("--quick", action="store_true",
                   help="reduced size for a CPU (~2-3 min): 112 px zoo, batch 1, 8-frame video "
                        "models, shift overhead at 112 and 224 px with batch 1 (5 reps), model "
                        "zoo with 3 reps, 1 thread")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the models benchmark; writes models.json/.md, shift_overhead.*, shift_op.* to --out.

    Returns 0, or 2 for an unknown ``--models`` label.

    Raises:
        SystemExit: bad options (argparse).
    """
    args = build_parser().parse_args(argv)
    from tsm_ds.bench.models import run_models_bench, zoo_labels

    models = args.models.split(",") if args.models else None
    unknown = [m for m in models or () if m not in zoo_labels()]
    if unknown:
        print(f"tsm-ds bench models: unknown --models {unknown}; choose from {','.join(zoo_labels())}",
              file=sys.stderr)
        return 2
    run_models_bench(args.out, img_size=args.img_size, batch=args.batch, frames=args.frames,
                     video_frames=args.video_frames, reps=args.reps,
                     shift_sizes=[int(s) for s in args.shift_sizes.split(",") if s],
                     shift_batch=args.shift_batch, num_classes=args.num_classes, models=models,
                     skip=[s for s in args.skip.split(",") if s], threads=args.threads,
                     quick=args.quick, log=print)
    print(f"reports written to {args.out}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
