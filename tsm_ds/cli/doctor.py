"""``tsm-ds doctor``: which bottleneck binds on this machine and this data (:mod:`tsm_ds.doctor`).

Usage::

    tsm-ds doctor [--data DIR] [--deepspeed_config R] [--arch A] [--num-segments T] [--img-size S]
                  [--channels-last] [--compile] [--out DIR] [--quick]
    deepspeed --num_gpus 2 --module tsm_ds.cli.doctor ...     # + the gradient all-reduce
    tsm-ds doctor --recipes                                      # every recipe for this device, 3 steps

Options: :data:`tsm_ds.config.tools.DOCTOR` (sections ``doctor`` and ``cluster``; the model, recipe,
data and micro-batch are training's fields, unset = this device's default). Writes ``doctor.json``,
``doctor.md`` and ``doctor.png`` under ``--out`` and prints the verdict. Exit status 1 when a check
failed (a section's status ``failed``), 2 for bad options.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

from tsm_ds.config import Config, parse
from tsm_ds.config.fields import build_parser as build_parser_for
from tsm_ds.config.tools import DOCTOR

if TYPE_CHECKING:
    from tsm_ds.doctor import DoctorSettings

#: the fields this command uses
COMMAND = DOCTOR


def build_parser() -> argparse.ArgumentParser:
    """The options of ``tsm-ds doctor`` (generated from :data:`COMMAND`)."""
    return build_parser_for(COMMAND, Config)


def doctor_settings(cfg: Config) -> "DoctorSettings":
    """The :class:`tsm_ds.doctor.DoctorSettings` of a parsed command line (the cluster
    section's options in its ``extra``: :func:`tsm_ds.cli._doctor_cluster.apply_cluster_options`)."""
    from tsm_ds.cli._doctor_cluster import apply_cluster_options
    from tsm_ds.doctor import DoctorSettings

    d, m = cfg.doctor, cfg.model
    settings = DoctorSettings(
        data=cfg.data.data, recipe=cfg.engine.deepspeed_config, arch=m.arch, num_segments=m.num_segments,
        img_size=cfg.data.img_size, micro_batch=cfg.schedule.micro_batch_size, num_classes=m.num_classes,
        channels_last=m.channels_last, compile=m.compile, precisions=tuple(d.precisions),
        workers=None if d.workers is None else tuple(d.workers), reencode_clips=d.reencode_clips,
        short_side=cfg.prepare.short_side, keyint=cfg.prepare.keyint, comm_methods=tuple(d.comm_methods),
        recipes=d.recipes, recipe_names=None if d.recipe_names is None else tuple(d.recipe_names),
        recipe_steps=d.recipe_steps, recipe_arch=d.recipe_arch, quick=d.quick,
        only=None if d.only is None else tuple(d.only), out=d.out)
    apply_cluster_options(settings, cfg.cluster)
    return settings


def main(argv: list[str] | None = None) -> int:
    """Run the doctor; returns 0, 1 when a check failed, 2 for bad options.

    Raises:
        SystemExit: bad options (argparse).
    """
    # an empty variable is an unset one (MASTER_PORT= exported by a script), as before the tree
    env = {k: v for k, v in os.environ.items() if v}
    try:
        cfg, _ = parse(COMMAND, Config, argv, env=env)
    except ValueError as e:               # a variable that does not convert ($MASTER_PORT=abc)
        print(f"tsm-ds doctor: {e}", file=sys.stderr)
        return 2
    from tsm_ds.doctor import run_doctor
    from tsm_ds.doctor.compute import PRECISIONS
    from tsm_ds.engine.config.recipes import ConfigError

    bad = [p for p in cfg.doctor.precisions if p not in PRECISIONS]
    if bad:
        print(f"tsm-ds doctor: --precisions {','.join(bad)}: use {','.join(PRECISIONS)}", file=sys.stderr)
        return 2
    settings = doctor_settings(cfg)
    from tsm_ds.cli._doctor_cluster import print_cluster_failures
    try:
        report, paths = run_doctor(settings, progress=cfg.logging.progress)
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
    from tsm_ds.cli.process_exit import exit_process
    exit_process(main())
