"""``tsm-ds demo``: TSM against TSN on clips whose classes differ only in temporal order
(:mod:`tsm_ds.experiments.demo`).

Generates the motion-direction dataset, trains TSM and TSN on it through the ``deepspeed``
launcher (same backbone, data, seed and steps), prints both validation top-1 accuracies side by
side and writes ``<out>/demo_results.json`` / ``.md``. Options: :data:`tsm_ds.config.tools.DEMO`
(section ``demo``: the dataset and the launch; the training flags are training's own, with the
demo's defaults).

    tsm-ds demo                         # ~1,000 clips, resnet18, 64 px, 8 frames, 2 ranks
    tsm-ds demo --epochs 2 --out /tmp/demo --models tsm
"""
from __future__ import annotations

import argparse
import sys

from tsm_ds.config import Config, parse
from tsm_ds.config.fields import build_parser as build_parser_for
from tsm_ds.config.tools import DEMO, command_values
from tsm_ds.experiments.demo import MODELS, DemoSettings

#: the fields this command uses
COMMAND = DEMO


def build_parser() -> argparse.ArgumentParser:
    """The ``tsm-ds demo`` command line (generated from :data:`COMMAND`)."""
    return build_parser_for(COMMAND, Config)


def demo_settings(cfg: Config) -> DemoSettings:
    """The :class:`~tsm_ds.experiments.demo.DemoSettings` (the run both models get) of a parsed
    ``tsm-ds demo`` command line."""
    m, d, sch = cfg.model, cfg.data, cfg.schedule
    return DemoSettings(arch=m.arch, img_size=d.img_size, num_segments=m.num_segments, shift_div=m.shift_div,
                        epochs=sch.epochs, batch_size=sch.batch_size, lr=sch.lr, warmup_steps=sch.warmup_steps,
                        dropout=m.dropout, deepspeed_config=cfg.engine.deepspeed_config, nproc=cfg.demo.nproc,
                        num_workers=d.num_workers, seed=sch.seed)


def dataset_options(cfg: Config) -> dict:
    """The keyword arguments of :func:`tsm_ds.data.synthetic.make_demo_dataset` of a parsed
    ``tsm-ds demo`` command line (``seed`` and ``workers`` are added by
    :func:`tsm_ds.experiments.demo.run_demo`)."""
    g = cfg.demo
    return dict(classes=list(g.classes), train_per_class=g.train_per_class, val_per_class=g.val_per_class,
                num_frames=g.num_frames, size=g.size, speed=tuple(g.speed), radius=tuple(g.radius),
                distractor_prob=g.distractor_prob, clutter=g.clutter, contrast=g.contrast, tint=g.tint,
                overwrite=g.overwrite)


def main(argv: list[str] | None = None) -> int:
    """Run the demo. Returns 0; 1 when a training run fails (stderr names its log file and
    its first error lines); 2 for bad arguments.

    Raises:
        SystemExit: bad options (argparse).
    """
    cfg, _ = parse(COMMAND, Config, argv)
    g, sch = cfg.demo, cfg.schedule
    models = [m.strip().lower() for m in g.models if m.strip()]
    if not models or any(m not in MODELS for m in models):
        print(f"tsm-ds demo: --models {','.join(g.models)!r}: use a comma-separated subset of "
              f"{','.join(MODELS)}", file=sys.stderr)
        return 2
    if sch.batch_size % g.nproc:
        print(f"tsm-ds demo: --batch-size {sch.batch_size} is not divisible by --nproc {g.nproc}",
              file=sys.stderr)
        return 2
    if g.num_frames <= cfg.model.num_segments:
        print(f"tsm-ds demo: --num-frames {g.num_frames} must exceed --num-segments "
              f"{cfg.model.num_segments}: validation clips of videos with no more frames than segments "
              f"are frame 0 repeated (official TSN sampling), so they show no motion",
              file=sys.stderr)
        return 2
    from tsm_ds.experiments.demo import run_demo

    try:
        res = run_demo(g.out, models=models, training=demo_settings(cfg), dataset=dataset_options(cfg),
                       dry_run=g.dry_run, record=command_values(COMMAND, cfg), log=lambda s: print(s, flush=True))
    except RuntimeError as e:                 # a training run failed
        print(f"tsm-ds demo: {e}", file=sys.stderr)
        return 1
    except ValueError as e:                   # bad dataset parameters, no such engine JSON
        print(f"tsm-ds demo: {e}", file=sys.stderr)
        return 2
    if g.dry_run:
        for cmd in res["commands"].values():
            print(" ".join(cmd))
        return 0
    print("\n" + res["table"], flush=True)
    print(f"total {res['total_wall_s']:.0f} s; results in {res['results_md']}", flush=True)
    return 0


if __name__ == "__main__":
    from tsm_ds.cli.process_exit import exit_process
    exit_process(main())
