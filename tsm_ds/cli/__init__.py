"""The commands: ``tsm-ds <command>`` and the training entry point, one module per command.

Each module here holds a command's argument parser and ``main(argv) -> int`` only; the work is
done by the library layers below (utils <- data <- models <- engine <- inference <- bench), which
never parse argv or exit. ``tsm-ds train`` runs the training entry point (:mod:`tsm_ds.cli.train`)
in this process, one rank; the ``deepspeed`` launcher starts the same entry point on every rank
through ``tsm_ds/train.py`` (a shim). A command's module is imported only when called, so
``tsm-ds --help`` stays fast.
"""
from __future__ import annotations

import importlib
import sys

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("tsm_ds.cli.train", "train TSM in this process, one rank (several ranks: deepspeed tsm_ds/train.py, "
              "same flags)"),
    "models": ("tsm_ds.cli.models", "table of supported architectures: parameters, multiply-adds, FLOPs"),
    "eval": ("tsm_ds.cli.eval", "multi-view evaluation of a checkpoint (top-1/top-5, confusion matrix)"),
    "predict": ("tsm_ds.cli.predict", "top-k classes for video files (optionally streaming, online TSM)"),
    "export": ("tsm_ds.cli.export", "export a checkpoint to torch.export and ONNX"),
    "prepare": ("tsm_ds.cli.prepare", "prepare a video tree for training: packs (.jpack, the default), re-encoded "
                "video or JPEG frames; list files; --shards for litdata chunks"),
    "check-videos": ("tsm_ds.cli.check_videos", "scan a dataset and report unreadable videos"),
    "bench": ("tsm_ds.cli.bench", "benchmarks: models, data, comm, scale, large-batch, multigrid, all"),
    "config": ("tsm_ds.cli.config",
               "the engine JSON resolved for N ranks (\"auto\" filled), steps and lrs, without training"),
    "demo": ("tsm_ds.cli.demo", "generate the motion-direction demo dataset and train TSM vs TSN on it"),
    "doctor": ("tsm_ds.cli.doctor", "which bottleneck binds here (data, compute, communication) and what to change"),
}


def _usage() -> str:
    width = max(len(n) for n in COMMANDS)
    lines = ["usage: tsm-ds <command> [options]", "", "commands:"]
    lines += [f"  {name.ljust(width)}  {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "Several ranks: deepspeed --num_gpus N tsm_ds/train.py "
                  "--deepspeed_config <recipe name or JSON path> ...",
              "Run 'tsm-ds <command> --help' for a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Dispatch ``tsm-ds <command> ...`` to the command's module.

    Returns the command's exit status; 2 for an unknown command.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"tsm-ds: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    return int(module.main(rest) or 0)


def run() -> None:
    """The ``tsm-ds`` console script and ``python -m tsm_ds.cli``: :func:`main` on ``sys.argv``,
    then the process ends with its status (:func:`tsm_ds.cli.process_exit.exit_process`: the shutdown's
    garbage collections skip the objects of torch and DeepSpeed). Never returns (SystemExit)."""
    from tsm_ds.cli.process_exit import exit_process

    exit_process(main())


if __name__ == "__main__":
    run()
