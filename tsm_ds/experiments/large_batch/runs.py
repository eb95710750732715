"""One run of the study: the ``tsm_ds.train`` command, the subprocess, and what is read back.

A run is ``python -m tsm_ds.train ...`` (the training command's own ``main``, world size 1, the
DeepSpeed engine) in its own process. What the study reports is read back from the files the
trainer writes, not from the command it was given: the global batch, micro-batch and
accumulation from ``<run>/config.json`` (``resolved_ds_config``), the lr of the base parameter
group (``param_groups``, ``lr_mult`` 1), the warm-up and planned steps, and the outcome from
``<run>/result.json``: ``completed`` (val top-1 of the last epoch), ``diverged`` (the divergence
guard stopped it before an update; exit status
:data:`~tsm_ds.engine.guards.divergence.EXIT_DIVERGED`: a result, "diverged at step k"), anything else
is ``failed`` (the row names the log).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from tsm_ds.engine.guards.divergence import EXIT_DIVERGED

from .grid import RunSpec, StudySettings

__all__ = ["TRAIN_MODULE", "train_command", "rule_lr", "portable", "run_env", "read_run", "run_one", "same_command"]

#: the training command every run executes (``python -m tsm_ds.train``)
TRAIN_MODULE = "tsm_ds.train"


def train_command(spec: RunSpec, settings: StudySettings, data: Mapping[str, Any], run_root: Path) -> list[str]:
    """The ``python -m tsm_ds.train`` command of run ``spec`` on the demo ``data``
    (``make_demo_dataset``'s result); its run folder is ``run_root / spec.name``. The arguments are
    written by :func:`tsm_ds.config.to_argv` from the training command
    (:data:`tsm_ds.config.commands.TRAIN`): horizontal flip off (the classes are directions), the
    global batch as micro-batch x accumulation at world size 1 (:meth:`StudySettings.micro_for`),
    ghost BatchNorm over ``ghost_bn_clips`` inside a larger micro-batch, ``spec.epochs_factor`` x
    the study's epochs, ``--warmup-epochs`` (:meth:`StudySettings.warmup_epochs_for`),
    ``--zero-init-residual`` (``settings.zero_init_residual``), ``--lr`` only
    for an isolation run with ``lr_mult`` != 1 (the rule's lr times it), the study's validation
    cadence (the last evaluation scores the whole validation set), one checkpoint kept."""
    from tsm_ds.config import Config, to_argv
    from tsm_ds.config.commands import TRAIN

    s = settings
    values = {
        "engine.deepspeed_config": str(spec.recipe_file),
        "data.train_list": str(data["train_list"]), "data.val_list": str(data["val_list"]),
        "data.classes": str(Path(data["root"]) / "classes.txt"), "data.flip": False,
        "model.arch": s.arch, "model.num_segments": s.num_segments, "data.img_size": s.img_size,
        "model.shift": "bidirectional", "model.shift_div": s.shift_div, "model.dropout": s.dropout,
        "model.ghost_bn_clips": s.ghost_for(spec.batch), "model.zero_init_residual": s.zero_init_residual,
        "schedule.epochs": s.epochs * spec.epochs_factor, "schedule.batch_size": spec.batch,
        "schedule.micro_batch_size": s.micro_for(spec.batch),
        "schedule.warmup_epochs": s.warmup_epochs_for(spec.batch), "schedule.seed": spec.seed,
        "schedule.eval_every": s.eval_every, "schedule.eval_max_clips": s.eval_max_clips,
        "data.num_workers": s.num_workers, "output.keep_last": 1,
        "output.output_dir": str(run_root), "output.run_name": spec.name, "logging.progress": False,
        "data.cache_decoded": bool(s.cache_decoded)}
    if spec.lr_mult != 1.0:
        values["schedule.lr"] = rule_lr(spec, settings) * spec.lr_mult
    return [sys.executable, "-m", TRAIN_MODULE, *to_argv(TRAIN, Config, values, only_changed=False)]


def rule_lr(spec: RunSpec, settings: StudySettings) -> float:
    """The lr the recipe's rule gives run ``spec`` at its batch
    (:func:`tsm_ds.engine.config.resolve.scaled_lr` from ``spec.lr`` at the batch the recipe is tuned at)."""
    from tsm_ds.engine.config.resolve import scaled_lr

    from .grid import RECIPES

    r = RECIPES[spec.recipe]
    at = settings.base_batch if r.tuned_at == "base" else settings.largest
    return scaled_lr(r.rule, spec.lr, at, spec.batch)


def run_env(settings: StudySettings, base: Mapping[str, str] | None = None,
            ops_dir: Path | None = None) -> dict[str, str]:
    """The runs' environment: :func:`tsm_ds.experiments.demo.child_env` (CPU accelerator without a
    GPU, this checkout on PYTHONPATH) with ``OMP_NUM_THREADS`` = ``settings.threads``: on a busy
    2-core machine one thread per run trained ~5x faster than two (OpenMP threads spinning on
    cores other processes hold). ``ops_dir``: DeepSpeed's op cache (``TORCH_EXTENSIONS_DIR``) of
    the study's own, unless the environment sets one: on 2026-12-05 another command line built the
    same op into the shared node-local cache between runs, and every run rebuilt it (~60-75 s)."""
    from tsm_ds.experiments.demo import child_env

    env = child_env(base)
    env["OMP_NUM_THREADS"] = str(settings.threads)
    if ops_dir is not None:
        env.setdefault("TORCH_EXTENSIONS_DIR", str(ops_dir))
    return env


def _base_lr(config: dict) -> float | None:
    """The resolved optimizer lr (the base parameter group's, before warm-up and decay).

    Read from the resolved optimizer block, not from ``param_groups``: the trainer writes those
    after the lr schedule's first step, i.e. the first warm-up lr (base x 1 / warmup_steps)."""
    for block in ((config.get("resolved_tsm_ds") or {}).get("optimizer"),
                  (config.get("resolved_ds_config") or {}).get("optimizer")):
        if isinstance(block, dict) and isinstance((block.get("params") or {}).get("lr"), (int, float)):
            return float(block["params"]["lr"])
    return None


def same_command(recorded: Sequence[str], cmd: Sequence[str]) -> bool:
    """Whether a recorded run's command is ``cmd``: the same arguments, run by the same interpreter
    of the same environment.

    The interpreter is compared by its folder (the venv's ``bin/``) and its resolved file, not by
    its spelling: ``sys.executable`` is ``.venv/bin/python3`` under the ``tsm-ds`` script (its
    shebang) and ``.venv/bin/python`` under ``python -m``, the same program; a recorded run must
    be reused by either. Another venv (another folder) is another environment, even where both
    resolve to one base interpreter.

    Args:
        recorded: the ``cmd`` of a row (a list of strings), or anything else (then False).
        cmd: the command this study would run now (:func:`train_command`).
    """
    if not isinstance(recorded, (list, tuple)) or len(recorded) != len(cmd) or not cmd:
        return False
    if list(recorded[1:]) != list(cmd[1:]):
        return False
    a, b = str(recorded[0]), str(cmd[0])
    return a == b or (os.path.dirname(os.path.abspath(a)) == os.path.dirname(os.path.abspath(b))
                      and os.path.realpath(a) == os.path.realpath(b))


def read_run(run_dir: Path) -> dict[str, Any]:
    """What a finished run wrote: {"status", "global_batch", "micro_batch", "accum", "world_size",
    "lr" (the resolved base lr), "lr_filled" (how "auto" was filled), "warmup_steps", "planned_steps", "steps",
    "clips_seen", "val_top1", "best_val_top1", "val_clips", "diverged_at", "reason", "history"}; values
    missing from the files are None (``status`` "failed" when result.json is missing). ``history``:
    the run's evaluations, ``[{"step", "val_top1" (%), "val_clips"}]`` in step order (empty for a run
    that did not complete: a diverged run's result.json has none); ``best_val_top1`` is the highest
    of them (intermediate evaluations may score a capped subset, the last one the whole set)."""
    out: dict[str, Any] = {k: None for k in ("global_batch", "micro_batch", "accum", "world_size", "lr",
                                             "lr_filled", "warmup_steps", "planned_steps", "steps", "clips_seen",
                                             "val_top1", "best_val_top1", "val_clips", "diverged_at", "reason")}
    out["history"] = []
    try:
        cfg = json.loads((run_dir / "config.json").read_text())
    except (OSError, ValueError):
        cfg = {}
    ds = cfg.get("resolved_ds_config") or {}
    sched = (cfg.get("resolved_tsm_ds") or {}).get("lr_schedule") or {}
    filled = cfg.get("auto_filled") or {}
    out.update(global_batch=ds.get("train_batch_size"), micro_batch=ds.get("train_micro_batch_size_per_gpu"),
               accum=ds.get("gradient_accumulation_steps"), world_size=cfg.get("world_size"), lr=_base_lr(cfg),
               lr_filled=next((v for k, v in filled.items() if k.endswith("params.lr")), None),
               warmup_steps=sched.get("warmup_steps"), planned_steps=cfg.get("total_steps"))
    try:
        res = json.loads((run_dir / "result.json").read_text())
    except (OSError, ValueError):
        return {**out, "status": "failed", "reason": f"no result.json in runs/{run_dir.name}"}
    status = res.get("status")
    if status == "completed":
        hist = [{"step": int(h["step"]), "val_top1": float(h["val_top1"]), "val_clips": h.get("val_clips")}
                for h in res.get("history") or [] if h.get("step") is not None and h.get("val_top1") is not None]
        best = max((h["val_top1"] for h in hist), default=res.get("best_val_top1"))
        out.update(steps=res.get("steps"), val_top1=res.get("val_top1"), best_val_top1=best,
                   val_clips=res.get("val_clips"), history=hist)
    elif status == "diverged":
        out.update(steps=res.get("step"), diverged_at=res.get("step"), reason=res.get("reason"))
    else:
        out.update(reason=res.get("reason") or res.get("error"))
    if out["steps"] is not None and out["global_batch"]:
        out["clips_seen"] = int(out["steps"]) * int(out["global_batch"])
    return {**out, "status": status if status in ("completed", "diverged") else "failed"}


def _tail(path: Path, n: int = 5) -> str:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return " | ".join(lines[-n:])


def portable(value: Any, out: Path | str | None = None) -> Any:
    """``value`` (a command, a row, a report: lists, tuples and dicts of strings, recursively) with
    no path of this machine: the Python interpreter (``sys.executable``, or any absolute path ending
    in ``/python`` or ``/python3[.x]``) becomes ``python``, and ``out`` + "/" is cut from the strings
    (paths become relative to the study's folder, where its runs are started), ``out`` itself
    becomes ".". The committed results hold this form (a test refuses absolute paths there)."""
    import re

    prefix = None if out is None else str(Path(out).resolve())
    interp = re.compile(r"^/\S*/python(3(\.\d+)?)?$")

    def one(v: Any) -> Any:
        if isinstance(v, str):
            if v == sys.executable or interp.match(v):
                return "python"
            if prefix:
                if v == prefix:
                    return "."
                v = v.replace(prefix + "/", "").replace(prefix, ".")
            return v
        if isinstance(v, dict):
            return {k: one(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [one(x) for x in v]
        return v

    return one(value)


def run_one(spec: RunSpec, cmd: list[str], out: Path, env: Mapping[str, str], *,
            keep_checkpoints: bool = False) -> dict[str, Any]:
    """Run one training process to its end in the study's folder ``out`` (its working directory:
    ``cmd``'s paths are relative to it); return its row.

    The row: ``name``, ``recipe``, ``stage``, ``role``, ``batch``, ``seed``, ``lr_swept`` (the
    recipe's swept lr), ``epochs_factor``, ``lr_mult``, ``exit_code``, ``wall_s`` (the whole
    process: start-up, decoding, training, validation, checkpoints), ``log`` (relative to ``out``),
    ``cmd`` (:func:`portable`) and :func:`read_run`'s fields. A diverged run is a row with
    ``status`` "diverged" and ``diverged_at``; a failed one has ``status`` "failed" and the log's
    last lines in ``reason``. Checkpoints and exported models are deleted afterwards unless
    ``keep_checkpoints`` (the study needs only config.json and result.json).

    Raises:
        OSError: the process could not be started or the log not written.
    """
    out = Path(out).resolve()
    run_dir = out / "runs" / spec.name
    if run_dir.exists():
        shutil.rmtree(run_dir)          # a partial earlier attempt must not be read back as this run
    log_path = out / "logs" / f"{spec.name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with open(log_path, "w") as logf:
        logf.write("$ " + " ".join(portable(cmd, out)) + "\n")
        logf.flush()
        code = subprocess.run(cmd, stdout=logf, stderr=subprocess.STDOUT, env=dict(env), cwd=str(out),
                              check=False).returncode
    wall = time.perf_counter() - t0
    row = {"name": spec.name, "recipe": spec.recipe, "stage": spec.stage, "role": spec.role, "batch": spec.batch,
           "seed": spec.seed, "lr_swept": spec.lr, "epochs_factor": spec.epochs_factor, "lr_mult": spec.lr_mult,
           "exit_code": code, "wall_s": round(wall, 1), "log": f"logs/{spec.name}.log",
           **read_run(run_dir), "cmd": portable(cmd, out)}
    if row["status"] == "completed" and code != 0:
        row.update(status="failed", reason=f"exit status {code} after result.json; see {row['log']}")
    if row["status"] == "diverged" and code != EXIT_DIVERGED:
        row["reason"] = f"{row['reason']} (exit status {code})"
    if row["status"] == "failed":
        row["reason"] = portable(f"exit status {code}: {row.get('reason') or ''} {_tail(log_path)}".strip(), out)
    if not keep_checkpoints:
        for p in (run_dir / "checkpoints", run_dir / "best_model.pt", run_dir / "last_model.pt"):
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            elif p.exists():
                os.unlink(p)
    return row
