"""Doctor section ``recipes`` (``tsm-ds doctor --recipes``): does every shipped recipe train here?

Every recipe of ``ds_configs/`` meant for this device (``cpu_*`` on CPU, ``gpu_*`` on CUDA) runs
``recipe_steps`` optimizer steps through the real :class:`tsm_ds.engine.loop.trainer.Trainer` (engine
JSON resolution and validation, DeepSpeed engine, guards, compressor, checkpoint at the end, in a
temporary folder) on synthetic clips, with a small model: ``recipe_arch`` (resnet18),
num_segments, 64 px on CPU / 112 px on CUDA, micro-batch 2 per rank: a smoke test, not a benchmark.
Statuses per recipe (rows):

- ``ok``: the steps ran and the checkpoint written at the end loads weights-only, as ``--resume``
  and the checkpoint readers load it (:mod:`tsm_ds.engine.checkpoint.safe_load`); the last step's loss, the
  seconds per step after the first (``s_per_step``, ``clips_per_s`` over all ranks) and the whole
  run's ``seconds`` (engine set-up included) are reported;
- ``refused``: the engine JSON was refused before the first step (the message, which names the key
  and the fix, is the row's ``message``): a refusal is an answer, not a failure;
- ``not run``: meant for the other device; resolved and validated for this one (a refusal is
  reported the same way);
- ``resolved``: ``gpu_kinetics_1536`` is resolved at its world size of 1,536 ranks only (its fixed
  global batch of 12,288 clips at 8 per GPU cannot run on fewer ranks): micro-batch, accumulation
  and the lr the linear rule gives;
- ``failed``: anything else raised (the exception), or the recipe's checkpoint asks to unpickle a
  global outside :data:`tsm_ds.engine.checkpoint.safe_load.SAFE_GLOBALS` (every later ``--resume`` and
  read of it would be refused without ``--trust-checkpoint``: the allowlist needs that entry);
  the section fails and the command exits 1.
"""
from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from torch.utils.data import Dataset

from tsm_ds.doctor.core import Context, section_result

__all__ = ["KINETICS_1536", "SMOKE_IMG_SIZE", "SyntheticClips", "recipe_device", "run"]

#: the paper's 1,536-GPU recipe: resolved only
KINETICS_1536 = ("gpu_kinetics_1536", 1536)
#: the smoke's crop size in px per device
SMOKE_IMG_SIZE = {"cpu": 64, "cuda": 112}


class SyntheticClips(Dataset):
    """``n`` random clips (T, 3, S, S) float32 in VideoClipDataset's item format, label i % classes;
    the clip is a pure function of (epoch, index)."""

    def __init__(self, n: int, num_segments: int, img_size: int, classes: int):
        self.n, self.t, self.s, self.k, self.epoch = n, num_segments, img_size, classes, 0

    def set_epoch(self, epoch: int) -> None:
        """The epoch whose clips items return (the trainer calls it)."""
        self.epoch = epoch

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        import torch

        g = torch.Generator().manual_seed(self.epoch * 100_003 + i)
        return {"clip": torch.randn(self.t, 3, self.s, self.s, generator=g), "label": i % self.k,
                "index": i, "bad": 0}


def recipe_device(name: str) -> str:
    """``"cuda"`` for ``gpu_*`` recipes, ``"cpu"`` for the others."""
    return "cuda" if name.startswith("gpu_") else "cpu"


def _flags(raw: dict, micro: int, world: int) -> dict[str, int]:
    """Batch fields (``schedule.*``) for the keys the recipe leaves ``"auto"`` (a flag for a fixed key
    is refused)."""
    flags = {}
    if raw.get("train_micro_batch_size_per_gpu", "auto") == "auto":
        flags["schedule.micro_batch_size"] = micro
    if raw.get("train_batch_size", "auto") == "auto":
        flags["schedule.batch_size"] = micro * world
    return flags


def _smoke(ctx: Context, name: str, raw: dict, tmp: str) -> dict[str, Any]:
    from tsm_ds.config import tree_with
    from tsm_ds.engine.config.recipes import ConfigError
    from tsm_ds.engine.loop.trainer import Trainer, TrainSettings
    from tsm_ds.models import build_model

    s = ctx.settings
    micro, classes, img = 2, 4, SMOKE_IMG_SIZE["cuda" if ctx.cuda else "cpu"]
    model = build_model(s.recipe_arch, classes, num_segments=s.num_segments)
    data = SyntheticClips(s.recipe_steps * micro * ctx.world, s.num_segments, img, classes)
    stamps: list[float] = []
    config = tree_with({"schedule.epochs": 1, "schedule.max_steps": s.recipe_steps, "data.num_workers": 0,
                        "logging.progress": False, "output.keep_last": 1, **_flags(raw, micro, ctx.world)})
    settings = TrainSettings(run_dir=f"{tmp}/{name}", config=config, class_names=[f"c{i}" for i in range(classes)],
                             step_callback=lambda step, info: stamps.append(time.perf_counter()))
    t0 = time.perf_counter()
    try:
        result = Trainer(model, data, None, raw, settings).fit()
    except ConfigError as e:
        return {"status": "refused", "message": str(e)}
    dt = time.perf_counter() - t0
    from tsm_ds.engine.checkpoint.safe_load import UntrustedCheckpointError, check_files

    ck_dir = Path(tmp) / name / "checkpoints"
    tag = (ck_dir / "latest").read_text().strip() if (ck_dir / "latest").is_file() else None
    steps = result["step"]
    try:   # the files --resume and the readers will load, as they load them
        check_files(sorted((ck_dir / tag).rglob("*.pt")) if tag else [])
    except UntrustedCheckpointError as e:
        return {"status": "failed", "steps": steps, "seconds": dt,
                "message": f"its checkpoint does not load weights-only: {e}"}
    loss = (result.get("last_metrics") or {}).get("train/loss")
    # steps after the first (engine set-up, first-step allocations and op builds are not in it)
    per = (stamps[-1] - stamps[0]) / (len(stamps) - 1) if len(stamps) > 1 else None
    return {"status": "ok", "steps": steps, "loss": loss, "seconds": dt, "s_per_step": per,
            "clips_per_s": micro * ctx.world / per if per else None,
            "message": (f"{steps} steps, micro-batch {micro} x {ctx.world} rank(s), {img} px, "
                        f"loss {loss:.3f}" if loss is not None else f"{steps} steps")
            + (", checkpoint loads weights-only" if tag else "")}


def _validate(name: str, raw: dict, device: str, world: int) -> dict[str, Any]:
    from tsm_ds.engine.config.checks import validate_config
    from tsm_ds.engine.config.recipes import ConfigError
    from tsm_ds.engine.config.resolve import resolve_config

    try:
        ds, tsm, filled, _ = resolve_config(raw, world_size=world, train_samples=10 ** 7, epochs=1)
        validate_config(ds, tsm, device=device, has_batchnorm=True)
    except ConfigError as e:
        return {"status": "refused", "message": str(e)}
    return {"ds": ds, "tsm": tsm, "filled": filled}


def run(ctx: Context, results: dict) -> dict:
    """The ``recipes`` section (see the module docstring); every rank calls it."""
    from tsm_ds.engine.config.recipes import load_config, optimizer_kind, recipe_names

    s = ctx.settings
    here = "cuda" if ctx.cuda else "cpu"
    names = list(s.recipe_names or recipe_names())
    rows = []
    with tempfile.TemporaryDirectory(prefix="recipes_", dir=ctx.out) as tmp:
        for name in names:
            ctx.progress.note(name)
            row: dict[str, Any] = {"recipe": name, "meant_for": recipe_device(name)}
            try:
                raw = load_config(name)
                if name == KINETICS_1536[0]:
                    got = _validate(name, raw, "cuda", KINETICS_1536[1])
                    if "ds" in got:
                        ds, tsm = got["ds"], got["tsm"]
                        _, _, ob = optimizer_kind({**ds, "tsm_ds": tsm})
                        got = {"status": "resolved", "message": (
                            f"resolved at world size {KINETICS_1536[1]} only: global batch {ds['train_batch_size']}, "
                            f"micro-batch {ds['train_micro_batch_size_per_gpu']}, accumulation "
                            f"{ds['gradient_accumulation_steps']}, lr {ob['params']['lr']:g}")}
                elif recipe_device(name) == here:
                    got = _smoke(ctx, name, raw, tmp)
                else:
                    got = _validate(name, raw, here, ctx.world)
                    if "ds" in got:
                        got = {"status": "not run", "message": f"meant for {recipe_device(name)}; valid on {here}"}
                    else:
                        got["message"] = f"meant for {recipe_device(name)}; on {here}: {got['message']}"
            except Exception as e:  # a crash is a failed check: reported, the next recipe still runs
                got = {"status": "failed", "message": f"{type(e).__name__}: {e}"[:500]}
            row.update(got)
            rows.append(row)
    counts = {k: sum(r["status"] == k for r in rows) for k in ("ok", "refused", "not run", "resolved", "failed")}
    failed = [r["recipe"] for r in rows if r["status"] == "failed"]
    line = ", ".join(f"{v} {k}" for k, v in counts.items() if v) + f" of {len(rows)} recipes on {here}"
    cols = ("recipe", "meant_for", "status", "steps", "loss", "s_per_step", "clips_per_s", "seconds", "message")
    return section_result("recipes", title="Recipes", status="failed" if failed else "ok",
                          summary=(f"failed: {', '.join(failed)}; " if failed else "") + line,
                          values={**{f"recipes_{k.replace(' ', '_')}": v for k, v in counts.items()},
                                  "steps_per_recipe": s.recipe_steps, "device": here,
                                  # the smoke's model (what the report's header names)
                                  "arch": s.recipe_arch, "num_segments": s.num_segments,
                                  "img_size": SMOKE_IMG_SIZE["cuda" if ctx.cuda else "cpu"]},
                          rows=[{c: r.get(c) for c in cols} for r in rows])
