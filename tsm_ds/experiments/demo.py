"""``tsm-ds demo``, the library half: TSM against TSN on clips whose classes differ only in
temporal order.

1. Generates the motion-direction dataset (``tsm_ds.data.synthetic.make_demo_dataset``): an object
   moving left / right / up / down over random shapes, colours, backgrounds and noise, each
   "left" clip the time reversal of a "right" clip, so a single frame carries no label.
2. Trains TSM (temporal shift, ``--shift bidirectional``) and TSN (the same network without the
   shift, ``--shift none``) with the same backbone, data, seed, optimizer and number of steps,
   each through the ``deepspeed`` launcher running ``--module tsm_ds.train`` (``nproc`` ranks;
   DeepSpeed's CPU accelerator with gloo when there is no GPU).
3. Returns both validation top-1 accuracies side by side with wall times, and writes them to
   ``<out>/demo_results.json`` and ``<out>/demo_results.md`` (:func:`run_demo`).

What it is built to show is the TSM paper's claim (Lin, Gan, Han, ICCV 2019, Sec. 3; Table 1,
TSN vs TSM on Something-Something): a 2D CNN that shifts a quarter of its channels along time can
model temporal order at no extra computation, while averaging per-frame scores (TSN) cannot tell
a clip from its time reversal (chance within each left/right and up/down pair).

The videos have 16 frames for 8-segment clips (``num_frames`` must exceed ``num_segments``):
validation clips take the official TSN segment centres, which are frame 0 repeated T times when
a video has no more frames than segments. With the former 8-frame videos every validation clip
was a still image, so TSM (and TSN) scored exactly chance (25.0% top-1, 100% top-5) whatever the
training did.

Measured with the defaults on a 2-core CPU (13 min 17 s in all): TSM 100.0 % validation top-1
(94.0 % after 200 of its 600 steps), TSN 30.5 % (chance 25 %), 390 s and 394 s of training.
The command line is :mod:`tsm_ds.cli.demo`.
"""
from __future__ import annotations

import json
import logging
import os
import re
import site
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from tsm_ds.config import Config, field_infos, to_argv
from tsm_ds.config.commands import TRAIN
from tsm_ds.config.tools import DEMO, DEMO_RECIPE
from tsm_ds.engine.comm.dist import free_port, launcher_command

__all__ = ["MODELS", "TRAIN_MODULE", "DEFAULT_RECIPE", "DemoSettings",
           "train_command", "child_env", "run_training", "format_table", "run_demo"]

_LOG = logging.getLogger(__name__)
MODELS = {  # name -> train.py --shift
    "tsm": "bidirectional",
    "tsn": "none",
}
#: what the launcher runs on every rank (``deepspeed --module tsm_ds.train``): an import name, so
#: it works from an installed package as well as from a source checkout
TRAIN_MODULE = "tsm_ds.train"
#: the engine recipe of the demo (found by name: :func:`tsm_ds.engine.config.recipes.resolve_recipe`)
DEFAULT_RECIPE = DEMO_RECIPE


def _default(path: str) -> Any:
    """``tsm-ds demo``'s default of a field (:data:`tsm_ds.config.tools.DEMO`, else the tree's)."""
    return DEMO.defaults[path] if path in DEMO.defaults else field_infos(Config)[path].default


@dataclass(frozen=True)
class DemoSettings:
    """The training run both models get (only ``--shift`` and ``--run-name`` differ). Defaults:
    ``tsm-ds demo``'s (:data:`tsm_ds.config.tools.DEMO`).

    Attributes:
        arch: backbone; img_size: crop side in pixels; num_segments: T, frames per clip;
        shift_div: TSM shifts 1/shift_div of the channels each way; epochs: passes over the data;
        batch_size: global batch (all ranks; must be divisible by ``nproc``); lr: AdamW lr for the
        global batch; warmup_steps: linear warm-up steps; dropout: before the fc;
        deepspeed_config: engine JSON path or shipped recipe name; nproc: ranks on this machine;
        num_workers: DataLoader workers per rank; seed: training seed.
    """

    arch: str = _default("model.arch")
    img_size: int = _default("data.img_size")
    num_segments: int = _default("model.num_segments")
    shift_div: int = _default("model.shift_div")
    epochs: int = _default("schedule.epochs")
    batch_size: int = _default("schedule.batch_size")
    lr: float = _default("schedule.lr")
    warmup_steps: int = _default("schedule.warmup_steps")
    dropout: float = _default("model.dropout")
    deepspeed_config: str = _default("engine.deepspeed_config")
    nproc: int = _default("demo.nproc")
    num_workers: int = _default("data.num_workers")
    seed: int = _default("schedule.seed")


def train_command(model: str, settings: DemoSettings, data: Mapping[str, Any], run_root: Path) -> list[str]:
    """The launcher command line training ``model`` ("tsm" or "tsn") on the demo data.

    Both models get identical arguments except ``--shift`` and ``--run-name``; horizontal flip
    is off (``--no-flip``: a flip turns "moving_left" into "moving_right"). ``data`` is what
    ``make_demo_dataset`` returned (``train_list``, ``val_list``, ``root``); the recipe is passed
    as the file :func:`~tsm_ds.engine.config.recipes.resolve_recipe` finds. The training arguments are
    written by :func:`tsm_ds.config.to_argv` from the training command
    (:data:`tsm_ds.config.commands.TRAIN`).

    Raises:
        KeyError: an unknown ``model``.
        tsm_ds.engine.config.recipes.ConfigError: ``settings.deepspeed_config`` is neither a file nor a
            shipped recipe.
    """
    from tsm_ds.engine.config.recipes import resolve_recipe

    s = settings
    values = {
        "engine.deepspeed_config": str(resolve_recipe(s.deepspeed_config).resolve()),
        "data.train_list": str(data["train_list"]), "data.val_list": str(data["val_list"]),
        "data.classes": str(Path(data["root"]) / "classes.txt"), "data.flip": False,
        "model.arch": s.arch, "model.num_segments": s.num_segments, "data.img_size": s.img_size,
        "model.shift": MODELS[model], "model.shift_div": s.shift_div, "model.dropout": s.dropout,
        "schedule.epochs": s.epochs, "schedule.batch_size": s.batch_size,
        "schedule.micro_batch_size": s.batch_size // s.nproc, "schedule.lr": s.lr,
        "schedule.warmup_steps": s.warmup_steps, "schedule.seed": s.seed,
        "data.num_workers": s.num_workers, "output.output_dir": str(run_root), "output.run_name": model,
        "logging.progress": False}
    return [*launcher_command(), "--num_gpus", str(s.nproc), "--master_port", str(free_port()),
            "--module", TRAIN_MODULE, *to_argv(TRAIN, Config, values, only_changed=False)]


def child_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The launcher's environment: ``base`` (default ``os.environ``), plus without a GPU
    DeepSpeed's CPU accelerator (each rank takes cores / ranks threads itself), plus the
    folder holding the ``tsm_ds`` package on ``PYTHONPATH`` when it is not a site-packages folder
    (a source checkout used without installing it: the ranks import ``tsm_ds.train``).
    """
    env = dict(os.environ if base is None else base)
    try:
        import torch
        has_cuda = torch.cuda.is_available()
    except ImportError:  # pragma: no cover - torch is a core dependency
        has_cuda = False
    if not has_cuda:
        env.setdefault("DS_ACCELERATOR", "cpu")   # threads per rank: train.py's set_threads (cores / ranks)
    root = Path(__file__).resolve().parents[2]          # the folder that contains tsm_ds/
    site_dirs = {Path(p).resolve() for p in [*site.getsitepackages(), site.getusersitepackages()]}
    if root not in site_dirs:
        env["PYTHONPATH"] = os.pathsep.join([str(root), *filter(None, [env.get("PYTHONPATH")])])
    return env


_EPOCH_LINE = re.compile(r"epoch \d+: step \d+, val top-1")


def run_training(cmd: list[str], log_path: Path, tag: str, env: dict,
                 log: Callable[[str], Any] = _LOG.info, *, result_path: Path | None = None) -> tuple[dict, float]:
    """Run one launcher command; pass its epoch lines to ``log`` (prefixed ``[tag]``); return
    (the run's result, wall seconds).

    The result is read from ``result_path`` (the run's ``result.json``, written by the trainer)
    when given, else from the ``RESULT`` line of the output. The full output (both ranks, the
    launcher) goes to ``log_path``. The command runs in the current directory (every path in it is
    absolute).

    Raises:
        RuntimeError: the launcher exits non-zero, or no result was written (names the log).
    """
    if result_path is not None and result_path.exists():
        result_path.unlink()   # a result of an earlier run must not pass for this one's
    t0 = time.perf_counter()
    result, errors = None, []
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as logf:
        logf.write("$ " + " ".join(cmd) + "\n")
        logf.flush()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=env, bufsize=1)
        assert proc.stdout is not None
        for line in proc.stdout:
            logf.write(line)
            if line.startswith("RESULT "):
                result = json.loads(line[len("RESULT "):])
            elif _EPOCH_LINE.search(line):
                log(f"[{tag}] {line.rstrip()}")
            elif "ERROR" in line or "Error" in line:
                errors.append(line.rstrip())
        code = proc.wait()
    wall = time.perf_counter() - t0
    if result_path is not None:
        try:
            result = json.loads(result_path.read_text())
        except (OSError, ValueError):
            result = None
        if result is not None and result.get("status") != "completed":
            errors.insert(0, f"{result_path}: status {result.get('status')}: "
                             f"{result.get('reason') or result.get('error')}")
            result = None
    if code != 0 or result is None:
        first = "\n".join(dict.fromkeys(errors[:5]))  # the first distinct error lines (ranks repeat them)
        raise RuntimeError(f"{tag}: the deepspeed launcher exited with status {code}"
                           f"{'' if result else ' without a result'}; see {log_path}"
                           + (f"\n{first}" if first else ""))
    return result, wall


def format_table(rows: list[dict], num_classes: int) -> str:
    """Markdown table of the side-by-side results (one row per model: ``model``, ``shift``,
    ``val_top1`` / ``best_val_top1`` in %, ``val_clips``, ``steps``, ``wall_s`` in seconds), plus
    the chance level of ``num_classes`` classes."""
    lines = ["| model | temporal shift | val top-1 (last epoch) | best val top-1 | val clips | "
             "optimizer steps | wall time |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model'].upper()} | {r['shift']} | {r['val_top1']:.1f}% | {r['best_val_top1']:.1f}% | "
                     f"{r['val_clips']} | {r['steps']} | {r['wall_s']:.0f} s |")
    lines.append(f"\nChance: {100 / num_classes:.1f}% ({num_classes} classes). Wall time includes the "
                 "launcher, DeepSpeed start-up, evaluation and checkpoints.")
    return "\n".join(lines)


def run_demo(out: str | os.PathLike, *, models: Sequence[str] = ("tsm", "tsn"),
             training: DemoSettings = DemoSettings(), dataset: Mapping[str, Any] | None = None,
             dry_run: bool = False, record: Mapping[str, Any] | None = None,
             log: Callable[[str], Any] = _LOG.info) -> dict[str, Any]:
    """Generate the demo data under ``out/data`` and train each of ``models`` on it.

    Args:
        out: folder of the dataset, the runs (``runs/<model>``), the logs (``logs/<model>.log``)
            and the results (``demo_results.json`` / ``.md``).
        models: subset of :data:`MODELS`, in training order.
        training: the run both models get.
        dataset: keyword arguments of ``make_demo_dataset`` (``classes``, ``train_per_class``,
            ``num_frames``, ...); ``seed`` and ``workers`` default to ``training.seed`` /
            ``training.nproc``.
        dry_run: generate the data and return the launcher commands, train nothing.
        record: stored as ``args`` in ``demo_results.json`` (e.g. the command-line options).
        log: progress lines (data generated, each model's start and epoch lines).

    Returns:
        {"rows" (one per model: model, shift, val_top1, best_val_top1, val_clips, steps, wall_s,
        run_dir), "table" (:func:`format_table`), "classes", "chance_top1", "data", "generate_s",
        "total_wall_s", "args", "commands", "results_md"}; with ``dry_run`` only "commands",
        "data" and "classes".

    Raises:
        ValueError: an unknown model, ``batch_size`` not divisible by ``nproc``, ``num_frames``
            not above ``num_segments``, bad dataset parameters.
        tsm_ds.engine.config.recipes.ConfigError: (a ValueError) no such engine JSON or recipe.
        RuntimeError: a training run failed (the message names its log file).
    """
    from tsm_ds.data.synthetic import make_demo_dataset
    from tsm_ds.engine.config.recipes import resolve_recipe
    from tsm_ds.utils.io import atomic_write_text

    models = [m.strip().lower() for m in models if m.strip()]
    bad = [m for m in models if m not in MODELS]
    if bad or not models:
        raise ValueError(f"models {models}: use a non-empty subset of {','.join(MODELS)}")
    if training.batch_size % training.nproc:
        raise ValueError(f"batch size {training.batch_size} is not divisible by {training.nproc} ranks")
    ds = {"seed": training.seed, "workers": training.nproc, **(dataset or {})}
    if ds.get("num_frames", 16) <= training.num_segments:
        raise ValueError(f"{ds.get('num_frames', 16)} frames per video must exceed {training.num_segments} "
                         "segments (validation clips would show no motion)")
    resolve_recipe(training.deepspeed_config)          # a missing recipe fails before the data
    out = Path(out).resolve()
    t0 = time.perf_counter()
    data = make_demo_dataset(out / "data", **ds)
    gen_s = time.perf_counter() - t0
    n_cls = len(data["classes"])
    log(f"demo data: {data['root']} ({n_cls} classes: {', '.join(data['classes'])}; "
        f"{ds.get('train_per_class', '?')} train + {ds.get('val_per_class', '?')} val clips per class; "
        f"{gen_s:.0f} s)")
    env = child_env()
    run_root = out / "runs"
    commands = {m: train_command(m, training, data, run_root) for m in models}
    if dry_run:
        return {"commands": commands, "data": data["root"], "classes": data["classes"]}
    rows = []
    for model in models:
        log(f"training {model.upper()} ({training.arch}, {training.num_segments} frames, {training.img_size} px, "
            f"{training.epochs} epochs, {training.nproc} ranks) ...")
        res, wall = run_training(commands[model], out / "logs" / f"{model}.log", model, env, log=log,
                                 result_path=run_root / model / "result.json")
        rows.append({"model": model, "shift": MODELS[model], "val_top1": float(res["val_top1"]),
                     "best_val_top1": float(res["best_val_top1"]), "val_clips": int(res["val_clips"]),
                     "steps": int(res["steps"]), "wall_s": round(wall, 1), "run_dir": res["run_dir"]})
    table = format_table(rows, n_cls)
    report = {"rows": rows, "classes": data["classes"], "chance_top1": 100 / n_cls,
              "data": data["root"], "generate_s": round(gen_s, 1),
              "total_wall_s": round(time.perf_counter() - t0, 1),
              "args": dict(record) if record is not None else {"training": asdict(training), "dataset": ds}}
    atomic_write_text(out / "demo_results.json", json.dumps(report, indent=2, default=str))
    md = atomic_write_text(out / "demo_results.md", "# tsm-ds demo\n\n" + table + "\n")
    return {**report, "table": table, "commands": commands, "results_md": md}
