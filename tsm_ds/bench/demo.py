"""``tsm-ds demo``: TSM against TSN on clips whose classes differ only in temporal order.

1. Generates the motion-direction dataset (``tsm_ds.data.synthetic.make_demo_dataset``): an object
   moving left / right / up / down over random shapes, colours, backgrounds and noise, each
   "left" clip the time reversal of a "right" clip, so a single frame carries no label.
2. Trains TSM (temporal shift, ``--shift bidirectional``) and TSN (the same network without the
   shift, ``--shift none``) with the same backbone, data, seed, optimizer and number of steps,
   each through the ``deepspeed`` launcher running ``tsm_ds/train.py`` (``--nproc`` ranks;
   DeepSpeed's CPU accelerator with gloo when there is no GPU).
3. Prints both validation top-1 accuracies side by side with wall times, and writes them to
   ``<out>/demo_results.json`` and ``<out>/demo_results.md``.

What it is built to show is the TSM paper's claim (Lin, Gan, Han, ICCV 2019, Sec. 3; Table 1,
TSN vs TSM on Something-Something): a 2D CNN that shifts a quarter of its channels along time can
model temporal order at no extra computation, while averaging per-frame scores (TSN) cannot tell
a clip from its time reversal (chance within each left/right and up/down pair).

The videos have 16 frames for 8-segment clips (``--num-frames`` must exceed ``--num-segments``):
validation clips take the official TSN segment centres, which are frame 0 repeated T times when
a video has no more frames than segments. With the former 8-frame videos every validation clip
was a still image, so TSM (and TSN) scored exactly chance (25.0% top-1, 100% top-5) whatever the
training did.

Measured with the defaults on a 2-core CPU (13 min 17 s in all): TSM 100.0 % validation top-1
(94.0 % after 200 of its 600 steps), TSN 30.5 % (chance 25 %), 390 s and 394 s of training.

    tsm-ds demo                         # ~1,000 clips, resnet18, 64 px, 8 frames, 2 ranks
    tsm-ds demo --epochs 2 --out /tmp/demo --models tsm
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TRAIN_SCRIPT = Path(__file__).resolve().parent / "train.py"
DEFAULT_CONFIG = REPO / "ds_configs" / "cpu_demo_adamw.json"
MODELS = {  # name -> train.py --shift
    "tsm": "bidirectional",
    "tsn": "none",
}


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
    t.add_argument("--deepspeed-config", default=str(DEFAULT_CONFIG), help="engine JSON")
    t.add_argument("--nproc", type=int, default=2, help="ranks on this machine (--num_gpus of the launcher)")
    t.add_argument("--num-workers", type=int, default=1, help="DataLoader workers per rank")
    t.add_argument("--dry-run", action="store_true",
                   help="generate the data, print the launcher commands, train nothing")
    return p


def launcher_command() -> list[str]:
    """The ``deepspeed`` launcher of this interpreter's environment.

    The console script next to ``sys.executable`` when present (a venv's ``bin/deepspeed``), else
    the same code as a module: ``python -m deepspeed.launcher.runner``.
    """
    exe = Path(sys.executable).parent / "deepspeed"
    if exe.is_file():
        return [str(exe)]
    found = shutil.which("deepspeed")
    return [found] if found else [sys.executable, "-m", "deepspeed.launcher.runner"]


def free_port() -> int:
    """An unused TCP port on localhost for the launcher's rendezvous (others may hold 29500)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def train_command(model: str, args: argparse.Namespace, data: dict, run_root: Path) -> list[str]:
    """The launcher command line training ``model`` ("tsm" or "tsn") on the demo data.

    Both models get identical arguments except ``--shift`` and ``--run-name``; horizontal flip
    is off (``--no-flip``: a flip turns "moving_left" into "moving_right").
    """
    return [
        *launcher_command(), "--num_gpus", str(args.nproc), "--master_port", str(free_port()),
        str(TRAIN_SCRIPT),
        "--deepspeed_config", str(args.deepspeed_config),
        "--train-list", data["train_list"], "--val-list", data["val_list"],
        "--classes", str(Path(data["root"]) / "classes.txt"), "--no-flip",
        "--arch", args.arch, "--num-segments", str(args.num_segments), "--img-size", str(args.img_size),
        "--shift", MODELS[model], "--shift-div", str(args.shift_div), "--dropout", str(args.dropout),
        "--epochs", str(args.epochs), "--batch-size", str(args.batch_size),
        "--micro-batch-size", str(args.batch_size // args.nproc), "--lr", str(args.lr),
        "--warmup-steps", str(args.warmup_steps), "--seed", str(args.seed),
        "--num-workers", str(args.num_workers), "--output-dir", str(run_root), "--run-name", model,
        "--no-progress",
    ]


_EPOCH_LINE = re.compile(r"epoch \d+: step \d+, val top-1")


def run_training(cmd: list[str], log_path: Path, tag: str, env: dict) -> tuple[dict, float]:
    """Run one launcher command; echo its epoch lines; return (RESULT dict, wall seconds).

    The full output (both ranks, the launcher) goes to ``log_path``.

    Raises:
        RuntimeError: the launcher exits non-zero or prints no ``RESULT`` line (names the log).
    """
    t0 = time.perf_counter()
    result, errors = None, []
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=env, cwd=REPO, bufsize=1)
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            if line.startswith("RESULT "):
                result = json.loads(line[len("RESULT "):])
            elif _EPOCH_LINE.search(line):
                print(f"[{tag}] {line.rstrip()}", flush=True)
            elif "ERROR" in line or "Error" in line:
                errors.append(line.rstrip())
        code = proc.wait()
    wall = time.perf_counter() - t0
    if code != 0 or result is None:
        first = "\n".join(dict.fromkeys(errors[:5]))  # the first distinct error lines (ranks repeat them)
        raise RuntimeError(f"{tag}: the deepspeed launcher exited with status {code}"
                           f"{'' if result else ' without a RESULT line'}; see {log_path}"
                           + (f"\n{first}" if first else ""))
    return result, wall


def format_table(rows: list[dict], num_classes: int) -> str:
    """Markdown table of the side-by-side results (one row per model)."""
    lines = ["| model | temporal shift | val top-1 (last epoch) | best val top-1 | val clips | "
             "optimizer steps | wall time |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model'].upper()} | {r['shift']} | {r['val_top1']:.1f}% | {r['best_val_top1']:.1f}% | "
                     f"{r['val_clips']} | {r['steps']} | {r['wall_s']:.0f} s |")
    lines.append(f"\nChance: {100 / num_classes:.1f}% ({num_classes} classes). Wall time includes the "
                 "launcher, DeepSpeed start-up, evaluation and checkpoints.")
    return "\n".join(lines)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    """Run the demo. Returns 0; 1 when a training run fails (stderr names its log file and
    its first error lines); 2 for bad arguments."""
    args = build_parser().parse_args(argv)
    models = [m.strip().lower() for m in args.models.split(",") if m.strip()]
    bad = [m for m in models if m not in MODELS]
    if bad or not models:
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
    if not Path(args.deepspeed_config).is_file():
        print(f"tsm-ds demo: --deepspeed-config {args.deepspeed_config}: no such file", file=sys.stderr)
        return 2
    from tsm_ds.data.synthetic import make_demo_dataset

    out = Path(args.out).resolve()
    t0 = time.perf_counter()
    try:
        data = make_demo_dataset(out / "data", seed=args.seed, classes=args.classes.split(","),
                                 train_per_class=args.train_per_class, val_per_class=args.val_per_class,
                                 num_frames=args.num_frames, size=args.size, speed=tuple(args.speed), radius=tuple(args.radius),
                                 distractor_prob=args.distractor_prob, clutter=args.clutter,
                                 contrast=args.contrast, tint=args.tint, workers=args.nproc,
                                 overwrite=args.overwrite)
    except ValueError as e:
        print(f"tsm-ds demo: {e}", file=sys.stderr)
        return 2
    gen_s = time.perf_counter() - t0
    n_cls = len(data["classes"])
    print(f"demo data: {data['root']} ({n_cls} classes: {', '.join(data['classes'])}; "
          f"{args.train_per_class} train + {args.val_per_class} val clips per class; {gen_s:.0f} s)", flush=True)

    env = dict(os.environ)
    try:
        import torch
        has_cuda = torch.cuda.is_available()
    except ImportError:  # pragma: no cover - torch is a core dependency
        has_cuda = False
    if not has_cuda:
        env.setdefault("DS_ACCELERATOR", "cpu")
        # one rank per core group: 2 unpinned ranks on 2 cores ran ~10x slower (ds_cpu_notes.md)
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        env.setdefault("OMP_NUM_THREADS", str(max(1, cores // args.nproc)))
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])

    run_root = out / "runs"
    rows = []
    for model in models:
        cmd = train_command(model, args, data, run_root)
        if args.dry_run:
            print(" ".join(cmd))
            continue
        print(f"training {model.upper()} ({args.arch}, {args.num_segments} frames, {args.img_size} px, "
              f"{args.epochs} epochs, {args.nproc} ranks) ...", flush=True)
        try:
            res, wall = run_training(cmd, out / "logs" / f"{model}.log", model, env)
        except RuntimeError as e:
            print(f"tsm-ds demo: {e}", file=sys.stderr)
            return 1
        rows.append({"model": model, "shift": MODELS[model], "val_top1": float(res["val_top1"]),
                     "best_val_top1": float(res["best_val_top1"]), "val_clips": int(res["val_clips"]),
                     "steps": int(res["steps"]), "wall_s": round(wall, 1), "run_dir": res["run_dir"]})
    if args.dry_run:
        return 0
    table = format_table(rows, n_cls)
    print("\n" + table, flush=True)
    report = {"rows": rows, "classes": data["classes"], "chance_top1": 100 / n_cls,
              "data": data["root"], "generate_s": round(gen_s, 1),
              "total_wall_s": round(time.perf_counter() - t0, 1), "args": vars(args)}
    _write_atomic(out / "demo_results.json", json.dumps(report, indent=2))
    _write_atomic(out / "demo_results.md", "# tsm-ds demo\n\n" + table + "\n")
    print(f"total {report['total_wall_s']:.0f} s; results in {out / 'demo_results.md'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
