"""``tsm-ds demo``: TSM against TSN on clips whose classes differ only in temporal order
(:mod:`tsm_ds.bench.demo`).

Generates the motion-direction dataset, trains TSM and TSN on it through the ``deepspeed``
launcher (same backbone, data, seed and steps), prints both validation top-1 accuracies side by
side and writes ``<out>/demo_results.json`` / ``.md``.

    tsm-ds demo                         # ~1,000 clips, resnet18, 64 px, 8 frames, 2 ranks
    tsm-ds demo --epochs 2 --out /tmp/demo --models tsm
"""
from __future__ import annotations

import argparse
import sys

from tsm_ds.bench.demo import DEFAULT_RECIPE, MODELS, TrainSettings


def build_parser() -> argparse.ArgumentParser:
    """The ``tsm-ds demo`` command line."""
    p = argparse.ArgumentParser(prog="tsm-ds demo", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--out", default="runs/demo", help="dataset, runs and results go here")
    p.add_argument("--seed", type=int, default=0, help="dataset and training seed")
    p.add_argument("--models", default="tsm,tsn", help="comma-separated subset of tsm,tsn")
    d = p.add_argument_group("dataset (tsm_ds.data.synthetic.make_demo_dataset)")
    d.add_argument("--classes", default="moving_left,moving_right,moving_up,moving_down",
                   help="comma-separated names from tsm_ds.data.synthetic.ALL_CLASSES")
    d.add_argument("--train-per-class", type=int, default=200)
    d.add_argument("--val-per-class", type=int, default=50)
    d.add_argument("--num-frames", type=int, default=16,
                   help="frames per generated video; must exceed --num-segments (validation "
                        "samples segment centres, frame 0 only when there are too few frames)")
    d.add_argument("--speed", type=float, nargs=2, default=(1.5, 2.5), metavar=("LOW", "HIGH"),
                   help="object speed range, pixels per video frame (x2 between the frames of "
                        "a 16-frame video that an 8-segment clip samples)")
    d.add_argument("--radius", type=float, nargs=2, default=(8.0, 12.0), metavar=("LOW", "HIGH"),
                   help="object size range (half side / radius), pixels")
    d.add_argument("--distractor-prob", type=float, default=0.0,
                   help="probability of a static second shape in a clip")
    d.add_argument("--clutter", type=float, default=0.5,
                   help="background structure in [0, 1] (0: flat random colour)")
    d.add_argument("--contrast", type=float, default=0.4,
                   help="least brightness difference between object and background, in [0, 0.5) "
                        "(intensity units); low contrast left TSM at chance in the CPU budget")
    d.add_argument("--tint", type=float, default=0.25,
                   help="largest random RGB tint per channel of every colour (0: grey levels)")
    d.add_argument("--size", type=int, default=64, help="generated frame side in pixels")
    d.add_argument("--overwrite", action="store_true", help="regenerate the dataset")
    t = p.add_argument_group("training (the same for both models)")
    t.add_argument("--arch", default="resnet18")
    t.add_argument("--img-size", type=int, default=64, help="crop side fed to the network")
    t.add_argument("--num-segments", type=int, default=8, help="T, frames per clip")
    t.add_argument("--shift-div", type=int, default=8,
                   help="TSM shifts 1/shift_div of the channels each way (the paper's default 8)")
    t.add_argument("--epochs", type=int, default=6)
    t.add_argument("--batch-size", type=int, default=8, help="global batch (all ranks)")
    t.add_argument("--lr", type=float, default=3e-4,
                   help="AdamW lr for the global batch (1e-3 left TSM at chance for 300+ steps on "
                        "some seeds; 3e-4 escaped the plateau within ~100 steps on every seed tried)")
    t.add_argument("--warmup-steps", type=int, default=20)
    t.add_argument("--dropout", type=float, default=0.0,
                   help="before the fc; 0 here: trained from scratch for a few epochs")
    t.add_argument("--deepspeed-config", default=DEFAULT_RECIPE,
                   help="engine JSON: a file path or a shipped recipe name")
    t.add_argument("--nproc", type=int, default=2, help="ranks on this machine (--num_gpus of the launcher)")
    t.add_argument("--num-workers", type=int, default=1, help="DataLoader workers per rank")
    t.add_argument("--dry-run", action="store_true",
                   help="generate the data, print the launcher commands, train nothing")
    return p


def training_settings(args: argparse.Namespace) -> TrainSettings:
    """The :class:`~tsm_ds.bench.demo.TrainSettings` of parsed ``tsm-ds demo`` options."""
    return TrainSettings(arch=args.arch, img_size=args.img_size, num_segments=args.num_segments,
                         shift_div=args.shift_div, epochs=args.epochs, batch_size=args.batch_size,
                         lr=args.lr, warmup_steps=args.warmup_steps, dropout=args.dropout,
                         deepspeed_config=args.deepspeed_config, nproc=args.nproc,
                         num_workers=args.num_workers, seed=args.seed)


def main(argv: list[str] | None = None) -> int:
    """Run the demo. Returns 0; 1 when a training run fails (stderr names its log file and
    its first error lines); 2 for bad arguments."""
    args = build_parser().parse_args(argv)
    models = [m.strip().lower() for m in args.models.split(",") if m.strip()]
    if not models or any(m not in MODELS for m in models):
        print(f"tsm-ds demo: --models {args.models!r}: use a comma-separated subset of "
              f"{','.join(MODELS)}", file=sys.stderr)
        return 2
    if args.batch_size % args.nproc:
        print(f"tsm-ds demo: --batch-size {args.batch_size} is not divisible by --nproc {args.nproc}",
              file=sys.stderr)
        return 2
    if args.num_frames <= args.num_segments:
        print(f"tsm-ds demo: --num-frames {args.num_frames} must exceed --num-segments "
              f"{args.num_segments}: validation clips of videos with no more frames than segments "
              f"are frame 0 repeated (official TSN sampling), so they show no motion",
              file=sys.stderr)
        return 2
    from tsm_ds.bench.demo import run_demo

    dataset = dict(classes=args.classes.split(","), train_per_class=args.train_per_class,
                   val_per_class=args.val_per_class, num_frames=args.num_frames, size=args.size,
                   speed=tuple(args.speed), radius=tuple(args.radius),
                   distractor_prob=args.distractor_prob, clutter=args.clutter, contrast=args.contrast,
                   tint=args.tint, overwrite=args.overwrite)
    try:
        res = run_demo(args.out, models=models, training=training_settings(args), dataset=dataset,
                       dry_run=args.dry_run, record=vars(args), log=lambda s: print(s, flush=True))
    except RuntimeError as e:                 # a training run failed
        print(f"tsm-ds demo: {e}", file=sys.stderr)
        return 1
    except ValueError as e:                   # bad dataset parameters, no such engine JSON
        print(f"tsm-ds demo: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        for cmd in res["commands"].values():
            print(" ".join(cmd))
        return 0
    print("\n" + res["table"], flush=True)
    print(f"total {res['total_wall_s']:.0f} s; results in {res['results_md']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
