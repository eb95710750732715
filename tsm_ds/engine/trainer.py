"""The training loop around a DeepSpeed engine.

One optimizer step = ``gradient_accumulation_steps`` micro-batches per rank:
data wait (next batch from our DataLoader) -> engine forward -> cross-entropy -> engine.backward
-> at the accumulation boundary, the gradient all-reduce (timed on its own where DeepSpeed lets us
call it: ZeRO stage 0 without DeepSpeed's bf16 optimizer; or the ``tsm_ds.compression``
compressor) -> engine.step (clip, update, lr schedule).

After every epoch (and at the end of a run stopped by ``max_steps``): BatchNorm running statistics
are averaged over ranks, the validation set is scored once per sample
(``evaluate.gather_predictions``), a checkpoint is saved, and the best model is exported.

Data order is a pure function of (seed, epoch): ``DistributedSampler`` seeded per epoch, the dataset
deterministic under (seed, epoch, index) and the DataLoader's worker seeds from a generator seeded
per epoch (not the global RNG), so a run resumed from a mid-epoch checkpoint continues with the
same batches and the same dropout draws as an uninterrupted one.

Run guards (:mod:`tsm_ds.engine.guard`): a diverged step is not applied; the run stops or rolls
back to the last good checkpoint with lower lrs; nothing non-finite is saved or exported.
"""
from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F

from tsm_ds.data.bad_videos import BadVideoTracker
from tsm_ds.engine import config as cfgmod
from tsm_ds.engine import reshard
from tsm_ds.engine.dist import device, hosts, init_distributed
from tsm_ds.engine.checkpoint import (CheckpointManager, CheckpointSaveError, export_model, rng_state, set_rng_state,
                                      tag_for_step)
from tsm_ds.engine.evaluate import gather_predictions, sync_batchnorm_stats, topk_accuracy
from tsm_ds.engine.guard import DivergenceError, DivergenceGuard, EngineGuard
from tsm_ds.engine.model_prep import has_batchnorm, prepared_setup
from tsm_ds.engine.monitor import ScalarWriter
from tsm_ds.engine.optim import apply_group_lrs, build_client_optimizer, client_scheduler_factory
from tsm_ds.engine.preempt import Preempted, StopSignal
from tsm_ds.engine.settings import (ResumableDistributedSampler, StepStats, TrainSettings, build_loaders,
                                    run_summary, save_config_record, write_run_result)
from tsm_ds.engine.watchdog import watched_run, watched_setup
from tsm_ds.models.groups import parameter_groups

__all__ = ["ResumableDistributedSampler", "TrainSettings", "Trainer"]   # the first two from .settings

log = logging.getLogger("tsm_ds.train")


class Trainer:
    """Train a clip classifier with DeepSpeed.

    Args:
        model: ``nn.Module`` mapping (N, T, 3, H, W) float32 -> logits (N, num_classes); its
            ``config`` dict (``build_model`` arguments) is exported with the weights.
        train_set, val_set: datasets with items ``{"clip", "label", "index", "bad"}``
            (``VideoClipDataset``'s format); ``set_epoch(epoch)`` is called when present.
            ``val_set`` may be None (no validation).
        engine_json: the recipe dict (``config.load_config``), with ``"auto"`` values.
        settings: ``TrainSettings``.
        param_groups: ``f(model, weight_decay) -> [{"params", "weight_decay", "lr_mult", "name"}]``;
            default ``tsm_ds.models.parameter_groups`` (fc x5, bias x10, no decay on bias/BN).

    Raises (from ``fit``):
        ConfigError before the first step for a recipe that cannot work (see ``config``).
        DivergenceError: the run diverged (non-finite or exploding loss, non-finite gradient norm,
            a run of skipped updates, non-finite weights before a save) and ``on_divergence`` is
            ``"stop"`` or the rollbacks are used up; nothing non-finite was saved or exported.
        CheckpointSaveError: a checkpoint could not be written (disk full...); the previous one
            is intact.
    """

    def __init__(self, model, train_set, val_set, engine_json: dict, settings: TrainSettings,
                 param_groups: Callable | None = None):
        self.model = model
        self.train_set, self.val_set = train_set, val_set
        self.raw = engine_json
        self.s = settings
        self.param_groups = param_groups or (lambda m, wd: parameter_groups(m, weight_decay=wd))
        self.engine, self.global_step, self.best_top1, self.best_tag = None, 0, -1.0, None
        self.history: list[dict] = []
        self.lr_scale = 1.0   # product of the rollback lr factors so far (1: none)
        self.rollbacks = 0
        self.guard: EngineGuard | None = None
        self.resolve_count = 0   # engine-JSON resolutions of this start (one, unless the world size changed)

    # ------------------------------------------------------------------ setup
    def _init_distributed(self):
        self.rank, self.world = init_distributed(timeout_s=self.s.dist_timeout, hosts=list(self.s.hosts) or None)
        self.device = device()
        self.device_name = self.device.type

    def _resolve(self, world: int, device: str) -> None:
        """Resolve (``"auto"`` values) and validate the engine JSON for ``world`` ranks: the one
        config pass of a start (``self.resolve_count`` counts them). Raises ConfigError."""
        probe = [g for g in self.param_groups(self.model, 0.0) if len(list(g["params"]))]
        raw, flags, self.reshard_plan = reshard.resume_engine_inputs(   # another world size: batch kept
            self.raw, self.s.flags, run_dir=self.s.run_dir, resume=self.s.resume, world=world)
        self.resolved = cfgmod.resolve_config(
            raw, world_size=world, train_samples=len(self.train_set), epochs=self.s.epochs,
            max_steps=self.s.max_steps, lr_mults=[float(g.get("lr_mult", 1.0)) for g in probe], flags=flags)
        reshard.annotate_filled(self.resolved[2], self.reshard_plan)
        cfgmod.validate_config(self.resolved[0], self.resolved[1], device=device,
                               has_batchnorm=has_batchnorm(self.model))
        self.resolved_world = world
        self.resolve_count += 1

    @watched_setup    # the hang watchdog's start-up limit covers set-up (tsm_ds.engine.watchdog)
    @prepared_setup   # --channels-last / --compile around deepspeed.initialize (tsm_ds.engine.model_prep)
    def setup(self):
        """Resolve and validate the engine JSON, build the engine, loaders, checkpoints, writer."""
        import deepspeed
        from deepspeed.accelerator import get_accelerator
        from deepspeed.runtime.base_optimizer import ZeROOptimizer
        self.stop = StopSignal(tuple(self.s.stop_signals)).install()   # caught from now on (preempt.py)
        # before DeepSpeed starts its communication backend (which may JIT-compile ops for minutes):
        # a recipe that cannot work on this device stops at once; the world size is the launcher's
        self._resolve(dist.get_world_size() if dist.is_initialized() else int(os.environ.get("WORLD_SIZE", "1")),
                      get_accelerator().device_name())
        self._init_distributed()
        s = self.s
        s.run_dir = Path(s.run_dir)
        if self.rank == 0:
            s.run_dir.mkdir(parents=True, exist_ok=True)
        if self.resolved_world != self.world:   # WORLD_SIZE unset (e.g. an MPI launch): the real world size
            self._resolve(self.world, self.device_name)
        ds_cfg, tsm, filled, spe = self.resolved
        src, otype, oblock = cfgmod.optimizer_kind({**ds_cfg, "tsm_ds": tsm})
        tb_dir = s.run_dir / "tensorboard"
        for mon in ("tensorboard", "csv_monitor"):
            if isinstance(ds_cfg.get(mon), dict) and ds_cfg[mon].get("output_path") == cfgmod.AUTO:
                ds_cfg[mon]["output_path"] = str(tb_dir)
        self.ds_config, self.tsm, self.filled, self.steps_per_epoch = ds_cfg, tsm, filled, spe
        self.micro = ds_cfg["train_micro_batch_size_per_gpu"]
        self.accum = ds_cfg["gradient_accumulation_steps"]
        self.global_batch = ds_cfg["train_batch_size"]
        self.total_steps = spe * s.epochs if s.max_steps is None else min(spe * s.epochs, s.max_steps)

        params = oblock["params"]
        groups = [g for g in self.param_groups(self.model, float(params["weight_decay"])) if len(list(g["params"]))]
        groups = apply_group_lrs(groups, float(params["lr"]))
        self.group_names = [g.get("name", f"group{i}") for i, g in enumerate(groups)]
        client_opt = build_client_optimizer(oblock, groups) if src == "client" else None
        sched = client_scheduler_factory(tsm["lr_schedule"]) if tsm.get("lr_schedule") else None
        self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=self.model, model_parameters=None if client_opt else groups, optimizer=client_opt,
            lr_scheduler=sched, config=ds_cfg)
        eng = self.engine
        self.input_dtype = torch.bfloat16 if eng.bfloat16_enabled() else (
            torch.float16 if eng.fp16_enabled() else torch.float32)

        self.compressor = None
        comp_cfg = tsm.get("compression")
        if comp_cfg and comp_cfg != "none" and not (isinstance(comp_cfg, dict) and comp_cfg.get("type") == "none"):
            from tsm_ds.engine.compression import build_compressor
            self.compressor = build_compressor(comp_cfg, eng)
        self.manual_comm = self.compressor is not None or not isinstance(eng.optimizer, ZeROOptimizer)
        if self.manual_comm:
            eng.enable_backward_allreduce = False

        # data (settings.build_loaders: the sampler, the loaders and their seeds)
        self.sampler, self.loader_gen, self.loader, self.val_loader = build_loaders(
            self.train_set, self.val_set, micro=self.micro, world=self.world, rank=self.rank, seed=s.seed,
            num_workers=s.num_workers, eval_batch_size=s.eval_batch_size)
        self.ckpt = CheckpointManager(s.run_dir / "checkpoints", keep_last=s.keep_last, rank=self.rank,
                                      world_size=self.world, trust=s.trust_checkpoint)
        self.writer = ScalarWriter(tb_dir / "tsm_ds", enabled=self.rank == 0)
        self.bad = BadVideoTracker(self.train_set, rank=self.rank, world_size=self.world)   # distinct files, once
        num_classes = len(s.class_names) or int((getattr(self.model, "config", None) or {}).get("num_classes", 2))
        self.guard = EngineGuard(eng, DivergenceGuard(s.guard, num_classes), manual_comm=self.manual_comm,
                                 reduce=self._reduce, last_good=self._last_good)

        run_hosts = hosts()   # a collective: every rank
        if self.rank == 0:
            for k, v in filled.items():
                log.info("engine JSON auto: %s = %s", k, v)
            log.info("world size %d, micro-batch %d, accumulation %d, global batch %d, %d optimizer steps per "
                     "epoch, %d steps planned; gradient all-reduce %s", self.world, self.micro, self.accum,
                     self.global_batch, spe, self.total_steps,
                     "timed separately" if self.manual_comm else "inside DeepSpeed's ZeRO/bf16 optimizer "
                     "(time/comm_s not logged)")
            save_config_record(s, self.raw, ds_cfg, tsm, filled, world=self.world, steps_per_epoch=spe,
                               total_steps=self.total_steps, groups=list(zip(self.group_names, groups)),
                               hosts=run_hosts)

    # ------------------------------------------------------------------ state
    def _client_state(self, epoch: int, micro_in_epoch: int) -> dict:
        return {"epoch": epoch, "micro_in_epoch": micro_in_epoch, "step": self.global_step,
                "best_top1": self.best_top1, "best_tag": self.best_tag, "class_names": list(self.s.class_names),
                "model_config": getattr(self.model, "config", None), "history": self.history,
                "bad_videos": self.bad.state_dict(), "img_size": self._img_size(), "lr_scale": self.lr_scale,
                "rollbacks": self.rollbacks, "guard": self.guard.state_dict() if self.guard else None}

    def _img_size(self) -> int | None:
        """Crop side (pixels) the model was trained at, from the datasets; None when unknown."""
        for ds in (self.val_set, self.train_set):
            if getattr(ds, "img_size", None):
                return int(ds.img_size)
        return None

    def _rank_state(self, epoch: int, micro_in_epoch: int) -> dict:
        st = {"rng": rng_state(), "epoch": epoch, "micro_in_epoch": micro_in_epoch,
              "samples_in_epoch": micro_in_epoch * self.micro, "rank": self.rank}
        if self.compressor is not None:
            st["compressor"] = self.compressor.state_dict()
        return st

    def _current_lrs(self) -> dict[str, float]:
        return {n: lr * self.lr_scale for n, lr in zip(self.group_names, self.engine.get_lr())}

    def _last_good(self) -> str | None:
        tag = self.ckpt.latest_tag()
        return str(self.ckpt.dir / tag) if tag else None

    def save(self, epoch: int, micro_in_epoch: int) -> str:
        """Save a checkpoint positioned at (epoch, micro-batches done in it); BN stats synced first.

        Raises DivergenceError (nothing written) when the weights are not finite, and
        CheckpointSaveError when the write fails (the previous checkpoint stays the latest).
        """
        sync_batchnorm_stats(self.engine.module)
        self.guard.check_weights(f"saving the checkpoint of step {self.global_step}", step=self.global_step,
                                 lrs=self._current_lrs())
        tag = self.ckpt.save(self.engine, step=self.global_step,
                             client_state=self._client_state(epoch, micro_in_epoch),
                             rank_state=self._rank_state(epoch, micro_in_epoch), best_tag=self.best_tag,
                             meta=reshard.manifest_fields(self, epoch, micro_in_epoch))
        self._last_saved = self.global_step
        self.watchdog.beat("checkpoint")
        return tag

    def _load(self, tag: str) -> tuple[int, int]:
        """Load checkpoint ``tag`` into the engine and the trainer; returns (epoch, micro-batch)."""
        client, rank_state = reshard.load(self, tag)   # any world size (tsm_ds.engine.reshard)
        self.global_step = int(client["step"])
        self.best_top1 = float(client.get("best_top1", -1.0))
        self.best_tag = client.get("best_tag")
        self.history = list(client.get("history", []))
        self.bad.load_state_dict(client.get("bad_videos"))
        self.lr_scale = float(client.get("lr_scale", 1.0))
        self.rollbacks = int(client.get("rollbacks", 0))
        if client.get("guard"):
            self.guard.load_state_dict(client["guard"])
        if self.compressor is not None and "compressor" in rank_state:
            self.compressor.load_state_dict(rank_state["compressor"])
        set_rng_state(rank_state["rng"])
        self.engine.zero_grad()
        self.engine.micro_steps = 0   # the accumulation boundary counts from the checkpoint, as in a new process
        self._last_saved = self.global_step
        return int(rank_state["epoch"]), int(rank_state["micro_in_epoch"])

    def _resume(self) -> tuple[int, int]:
        if not self.s.resume:
            return 0, 0
        tag = self.ckpt.pick_resume_tag(self.s.resume, warn=log.warning if self.rank == 0 else None)
        if tag is None:
            if self.rank == 0:
                log.info("--resume auto: no checkpoint in %s yet, starting fresh", self.ckpt.dir)
            return 0, 0
        epoch, micro = self._load(tag)
        if self.rank == 0:
            log.info("resumed from %s: epoch %d, %d micro-batches into it, optimizer step %d",
                     self.ckpt.dir / tag, epoch, micro, self.global_step)
        return epoch, micro

    # ------------------------------------------------------------------ loop
    def _reduce(self, values: list[float]) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64)
        if self.world > 1:
            if dist.get_backend() == "nccl":
                t = t.to(self.device)
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t.cpu().tolist()

    def evaluate(self) -> dict:
        """BN sync, then top-1/top-5 on the validation set, each clip counted once; {} without one."""
        if self.val_loader is None:
            return {}
        sync_batchnorm_stats(self.engine.module)
        if hasattr(self.val_set, "set_epoch"):
            self.val_set.set_epoch(0)
        _, scores, labels = gather_predictions(self.engine, self.watchdog.beating(self.val_loader, "eval"))
        res = topk_accuracy(scores, labels, ks=(1, 5))
        if len(labels):
            res["loss"] = float(F.cross_entropy(scores, labels))
        return res

    def _rollback(self, err: DivergenceError) -> tuple[int, int]:
        """Reload the last good checkpoint with lower lrs (``--on-divergence rollback``)."""
        tag = self.ckpt.latest_tag()
        scale, count = self.lr_scale * self.s.rollback_lr_factor, self.rollbacks + 1
        if self.rank == 0:
            log.warning("%s\nrollback %d of %d: reloading %s, every lr x %g from now on (x%g in all)",
                        err.describe(), count, self.s.max_rollbacks, self.ckpt.dir / tag,
                        self.s.rollback_lr_factor, scale)
        epoch, micro = self._load(tag)
        self.lr_scale, self.rollbacks = scale, count   # the checkpoint's own values are older
        self.writer.scalars({"train/rollbacks": count, "train/lr_scale": scale}, self.global_step)
        return epoch, micro

    def summary(self, result: dict) -> dict:
        """The run's result in one flat dict (what ``<run>/result.json`` and the ``RESULT`` line hold)."""
        return run_summary(result, self.s.run_dir, getattr(self, "last_metrics", {}))

    def _write_result(self, status: str, fields: dict) -> None:
        """``<run>/result.json`` on rank 0 (see :func:`tsm_ds.engine.settings.write_run_result`)."""
        if self.rank == 0:
            write_run_result(self.s.run_dir, status, {"rollbacks": self.rollbacks, "lr_scale": self.lr_scale,
                                                      **fields}, log=log)

    @watched_run
    def fit(self) -> dict:
        """Train; returns ``{"step", "epoch", "val": last validation, "best_top1", "history",
        "rollbacks", "lr_scale"}``. Raises DivergenceError / CheckpointSaveError (see the class)."""
        from tqdm import tqdm
        if self.engine is None:
            self.setup()
        self._last_saved = -1
        start_epoch, skip_micro = self._resume()
        self._start_step = self.global_step
        self.bar = tqdm(total=self.total_steps, initial=self.global_step, disable=self.rank != 0 or not self.s.progress,
                        desc="train", unit="step", dynamic_ncols=True, file=sys.stderr)
        try:
            while True:
                try:
                    result = self._run(start_epoch, skip_micro)
                    self._write_result("completed", self.summary(result))
                    return result
                except DivergenceError as e:
                    if (self.s.on_divergence != "rollback" or self.rollbacks >= self.s.max_rollbacks
                            or self.ckpt.latest_tag() is None):
                        if self.s.on_divergence == "rollback":
                            e.context.append(f"rollbacks used: {self.rollbacks} of {self.s.max_rollbacks}"
                                             + ("" if self.ckpt.latest_tag() else "; no checkpoint to roll back to"))
                        e.narrow_fixes(clip=float(self.ds_config.get("gradient_clipping") or 0.0),
                                       rollback=self.s.on_divergence == "rollback",
                                       has_checkpoint=self.ckpt.latest_tag() is not None)
                        raise
                    start_epoch, skip_micro = self._rollback(e)
                    self.bar.n = self.global_step
        except DivergenceError as e:
            self._write_result("diverged", {"step": e.step, "reason": e.reason, "loss": e.loss,
                                            "grad_norm": e.grad_norm, "lrs": e.lrs, "last_good": e.last_good,
                                            "report": e.describe()})
            raise
        except CheckpointSaveError as e:
            self._write_result("save_failed", {"error": str(e)})
            raise
        except Preempted as e:
            self._write_result("preempted", {"step": e.step, "checkpoint": str(self.ckpt.dir / e.tag),
                                             "signal": e.signal_name})
            raise
        finally:
            self.stop.restore()
            self.bar.close()
            self.writer.close()

    def _run(self, start_epoch: int, skip_micro: int) -> dict:
        """The epoch loop from a position (epoch, micro-batches done in it); see :meth:`fit`."""
        s, eng, bar = self.s, self.engine, self.bar
        start_step = self._start_step
        micro_per_epoch = self.steps_per_epoch * self.accum
        if skip_micro >= micro_per_epoch:
            start_epoch, skip_micro = start_epoch + 1, 0
        params = [p for p in eng.module.parameters() if p.requires_grad]
        val, epoch, micro_i = {}, start_epoch, skip_micro
        t_step = time.perf_counter()
        acc = StepStats()   # this rank's sums over the step's micro-batches
        for epoch in range(start_epoch, s.epochs):
            if self.global_step >= self.total_steps:
                break
            micro_i = skip_micro if epoch == start_epoch else 0
            eng.train()  # the model's own train() (partial BN / frozen BN overrides apply)
            self.sampler.set_epoch(epoch)
            self.sampler.skip = micro_i * self.micro
            if hasattr(self.train_set, "set_epoch"):
                self.train_set.set_epoch(epoch)
            self.loader_gen.manual_seed(s.seed * 100_003 + epoch)
            it = iter(self.loader)
            while micro_i < micro_per_epoch and self.global_step < self.total_steps:
                t0 = time.perf_counter()
                batch = next(it)
                t1 = time.perf_counter()
                clip = batch["clip"].to(self.device, dtype=self.input_dtype)
                label = torch.as_tensor(batch["label"]).long().to(self.device)
                logits = eng(clip)
                loss = F.cross_entropy(logits.float(), label)
                if s.inject_nan_step == self.global_step + 1 and self.rank == s.inject_nan_rank \
                        and self.rollbacks == 0:
                    loss = loss * float("nan")   # test hook (TrainSettings.inject_nan_step), before any rollback
                boundary = eng.is_gradient_accumulation_boundary()
                eng.backward(loss)
                t2 = time.perf_counter()
                if boundary and self.manual_comm:
                    if self.compressor is not None:
                        self.compressor.allreduce(params)
                    else:
                        eng.allreduce_gradients()
                t3 = time.perf_counter()
                n = label.numel()
                acc.loss_sum += float(loss.detach()) * n
                acc.clips += n
                if boundary:
                    step_lrs = self._current_lrs()   # the lrs this update uses (the schedule steps inside)
                    self.guard.before_update(acc.loss_sum, acc.clips, params, step=self.global_step + 1, lrs=step_lrs)
                    self.guard.scaled_step(self.lr_scale)
                    self.guard.after_update(step=self.global_step + 1, lrs=step_lrs)
                else:
                    eng.step()
                t4 = time.perf_counter()
                with torch.no_grad():
                    top = logits.float().topk(min(5, logits.shape[1]), dim=1).indices
                    hit = top == label.view(-1, 1)
                acc.correct1 += float(hit[:, :1].any(1).sum())
                acc.correct5 += float(hit.any(1).sum())
                acc.bad_videos += self.bad.add(batch)   # encounters; its files wait for the step's exchange
                acc.data_s += t1 - t0
                acc.compute_s += (t2 - t1) + (t4 - t3)
                acc.comm_s += t3 - t2
                micro_i += 1
                if not boundary:
                    continue
                self.global_step += 1
                acc.bad_files_new = self.bad.num_pending()
                sums = self._reduce(acc.as_list() + [self.stop.flag])   # sums over ranks; any rank signalled?
                r, stop_now = StepStats.from_list(sums[:-1]), sums[-1] > 0
                acc = StepStats()
                now = time.perf_counter()
                bad_files, bad_total = self.bad.sync(r.bad_files_new, r.bad_videos)   # distinct, encounters
                metrics = {"train/loss": r.loss_sum / r.clips, "train/top1": 100 * r.correct1 / r.clips,
                           "train/top5": 100 * r.correct5 / r.clips, "perf/clips_per_s": r.clips / max(now - t_step, 1e-9),
                           "time/data_wait_s": r.data_s / self.world, "time/compute_s": r.compute_s / self.world,
                           "time/comm_s": r.comm_s / self.world if self.manual_comm else None,
                           "train/skipped_steps": eng.skipped_steps, "data/bad_videos": bad_files, "data/bad_video_encounters": bad_total,
                           "train/grad_norm": self.guard.grad_norm}
                t_step = now
                for name, lr in step_lrs.items():
                    metrics[f"lr/{name}"] = lr
                if self.compressor is not None:
                    for k, v in self.compressor.stats().items():
                        if isinstance(v, (int, float)):
                            metrics[f"comm/{k}"] = v
                self.writer.scalars(metrics, self.global_step)
                bar.update(1)
                bar.set_postfix(epoch=epoch, loss=f"{metrics['train/loss']:.3f}",
                                clips_s=f"{metrics['perf/clips_per_s']:.1f}")
                self.last_metrics = metrics
                self.watchdog.beat("step", self.global_step)
                if s.step_callback is not None:
                    s.step_callback(self, self.global_step)
                if s.save_every_steps and self.global_step % s.save_every_steps == 0 \
                        and micro_i < micro_per_epoch and self.global_step < self.total_steps:
                    # (the end of an epoch or of the run saves after validation instead)
                    self.save(epoch, micro_i)
                if stop_now:   # a stop signal (SLURM's time-limit warning) on some rank: save here, stop
                    end = micro_i >= micro_per_epoch
                    tag = (tag_for_step(self.global_step) if self._last_saved == self.global_step
                           else self.save(epoch + 1 if end else epoch, 0 if end else micro_i))
                    raise Preempted(self.global_step, tag, self.stop.received or "a stop signal on another rank")
            del it
            done = micro_i >= micro_per_epoch
            val = self.evaluate()
            if val:
                rec = {"epoch": epoch, "step": self.global_step, "val_top1": val["top1"], "val_top5": val["top5"],
                       "val_clips": val["count"]}
                self.history.append(rec)
                self.writer.scalars({"val/top1": val["top1"], "val/top5": val["top5"], "val/clips": val["count"],
                                     "val/loss": val.get("loss")}, self.global_step)
                if self.rank == 0:
                    bar.write(f"epoch {epoch}: step {self.global_step}, val top-1 {val['top1']:.1f}% top-5 "
                              f"{val['top5']:.1f}% on {val['count']} clips")
                if val["top1"] > self.best_top1:
                    self.guard.check_weights("exporting best_model.pt", step=self.global_step, lrs=self._current_lrs())
                    self.best_top1 = val["top1"]
                    self.best_tag = tag_for_step(self.global_step)
                    if self.rank == 0:
                        export_model(s.run_dir / "best_model.pt", eng.module, class_names=s.class_names,
                                     extra={"epoch": epoch, "step": self.global_step, "val_top1": val["top1"],
                                            "img_size": self._img_size()})
            self.writer.flush()
            self.save(epoch + 1 if done else epoch, 0 if done else micro_i)
        if not val and self.global_step == start_step:
            if self.rank == 0:
                log.info("nothing left to train (step %d of %d): evaluating the checkpoint", self.global_step,
                         self.total_steps)
            val = self.evaluate()
        if self._last_saved != self.global_step:
            self.save(epoch, micro_i)
        self.guard.check_weights("exporting last_model.pt", step=self.global_step, lrs=self._current_lrs())
        if self.rank == 0:
            export_model(s.run_dir / "last_model.pt", eng.module, class_names=s.class_names,
                         extra={"step": self.global_step, "img_size": self._img_size()})
        return {"step": self.global_step, "epoch": epoch, "val": val, "best_top1": self.best_top1,
                "history": self.history, "rollbacks": self.rollbacks, "lr_scale": self.lr_scale}
