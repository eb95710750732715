"""The training loop around a DeepSpeed engine.

One optimizer step = ``gradient_accumulation_steps`` micro-batches per rank: data wait -> forward
-> cross-entropy -> backward -> at the accumulation boundary the gradient all-reduce (timed on its
own where DeepSpeed lets us call it, or the 1-bit compressor) -> the guard's checks -> update.
Validation (BN statistics averaged over ranks, each clip once, best model exported) when the hooks'
cadence says (default: every epoch's end), always at the run's end (whole set); a checkpoint per epoch.

Data order is a pure function of (seed, epoch): a run resumed mid-epoch continues with the same
batches and dropout draws. Parts: :mod:`.build`, :mod:`.state`, :mod:`.hooks`, :mod:`.position`, :mod:`.guard`.
"""
from __future__ import annotations

import logging
import sys
import time
from typing import Callable

import torch
import torch.nn.functional as F

from tsm_ds.data.bad_videos import DataLossError, check_data_loss, describe_loss, run_loss_reports
from tsm_ds.engine.checkpoint.manager import CheckpointSaveError, save_weights_export, tag_for_step
from tsm_ds.engine.checkpoint.position import load_position, resume_position, save_position
from tsm_ds.engine.guards.divergence import DivergenceError, decide_rollback
from tsm_ds.engine.guards.preempt import Preempted
from tsm_ds.engine.loop.build import build_engine
from tsm_ds.engine.loop.components import default_hooks
from tsm_ds.engine.loop.evaluate import precise_bn_stats, validate
from tsm_ds.engine.loop.hooks import Hooks
from tsm_ds.engine.loop.loaders import ResumableDistributedSampler
from tsm_ds.engine.loop.metrics import StepStats, step_metrics
from tsm_ds.engine.loop.result import run_summary, stopped_record, write_run_result
from tsm_ds.engine.loop.settings import TrainSettings
from tsm_ds.engine.loop.state import RunState
from tsm_ds.models.groups import head_mults_on, parameter_groups

__all__ = ["ResumableDistributedSampler", "TrainSettings", "Trainer"]   # the first two from .settings

log = logging.getLogger("tsm_ds.train")


def next_timed(it) -> tuple:
    """(the next item of ``it``, seconds waited for it): the data-wait time of a micro-batch."""
    t0 = time.perf_counter()
    item = next(it)
    return item, time.perf_counter() - t0


class Trainer:
    """Train a clip classifier with DeepSpeed.

    Args:
        model: ``nn.Module`` (N, T, 3, H, W) float32 -> logits (N, num_classes); its ``config``
            dict (``build_model`` arguments) is exported with the weights.
        train_set, val_set: datasets with items ``{"clip", "label", "index", "bad"}``;
            ``set_epoch(epoch)`` is called when present. ``val_set`` may be None.
        engine_json: the recipe dict (``config.load_config``), with ``"auto"`` values.
        settings: :class:`TrainSettings`.
        param_groups: ``f(model, weight_decay) -> [param group dicts]``; default the official
            recipe's groups (no decay on bias/BN; fc x5 / bias x10 when ``--head-lr-mults`` says so:
            :func:`tsm_ds.models.groups.head_mults_on`).
        hooks: the run's components (:mod:`tsm_ds.engine.loop.hooks`); default
            :func:`tsm_ds.engine.loop.components.default_hooks` of ``settings``.

    Raises (from ``fit``): ConfigError (a recipe that cannot work, before the first step),
    DataLossError (more unreadable files than ``--max-bad-fraction`` allows: stops within the epoch),
    DivergenceError (the run diverged and stops; nothing non-finite saved), CheckpointSaveError (a
    write failed; the previous checkpoint is intact), Preempted (a stop signal: saved, stopped).
    """

    def __init__(self, model, train_set, val_set, engine_json: dict, settings: TrainSettings,
                 param_groups: Callable | None = None, hooks: Hooks | None = None):
        self.model, self.train_set, self.val_set, self.raw, self.s = model, train_set, val_set, engine_json, settings
        self.c = c = settings.config   # the run's tree: each part reads its own section
        head = head_mults_on(c.schedule.head_lr_mults, pretrained=bool(c.model.pretrained), tune_from=c.model.tune_from)
        self.param_groups = param_groups or (lambda m, wd: parameter_groups(m, weight_decay=wd, head_mults=head))
        self.hooks = hooks if hooks is not None else default_hooks(settings)
        self.state, self.parts = RunState(), None
        self._lr_factor, self._n_micro, self._shape = 1.0, 0, None   # the epoch's (multigrid: its stage's)
        self._t_fit, self._c_fit = time.perf_counter(), time.process_time()   # fit() resets them (history times)

    def setup(self) -> None:
        """Build the engine and everything around it (:func:`tsm_ds.engine.loop.build.build_engine`)."""
        self.hooks.on_setup_start(self.s.run_dir)
        try:
            self.parts = build_engine(self.model, self.train_set, self.val_set, self.raw, self.s,
                                      param_groups=self.param_groups)
        except BaseException:
            self.hooks.on_end()   # a caller that catches the error must not be stopped later
            raise
        self.hooks.on_setup_end(self.parts.layout.rank, self.parts.layout.world)

    # ------------------------------------------------------------------ position, validation
    def _lrs(self) -> dict[str, float]:
        p = self.parts
        scale = self.state.lr_scale * self._lr_factor
        return {n: lr * scale for n, lr in zip(p.group_names, p.engine.get_lr())}

    def _img_size(self) -> int | None:
        return next((int(d.img_size) for d in (self.val_set, self.train_set) if getattr(d, "img_size", None)), None)

    def save(self, epoch: int, micro: int) -> str:
        """Checkpoint at (epoch, micro-batches done in it) (:func:`tsm_ds.engine.checkpoint.position.save_position`)."""
        extra = {"class_names": list(self.s.class_names), "model_config": getattr(self.model, "config", None),
                 "img_size": self._img_size()}
        tag = save_position(self.parts, self.state, epoch=epoch, micro=micro, extra=extra, lrs=self._lrs())
        self.hooks.on_progress("checkpoint")
        return tag

    def evaluate(self, full: bool = True) -> dict:
        """Top-1/top-5, each clip once (:func:`.evaluate.validate`); not ``full``: the capped subset if any."""
        p, sub = self.parts, self.parts.val_subset
        return validate(p.engine, p.val_loader if full or sub is None else sub.loader, self.val_set,
                        progress=lambda items: self.hooks.beating(items, "eval"), select=sub and sub.indices)

    def fit(self) -> dict:
        """Train; returns ``{"step", "epoch", "val", "best_top1", "history", "rollbacks", "lr_scale",
        "last_metrics"}`` and writes ``<run>/result.json`` (rank 0). Raises as the class says."""
        from tqdm import tqdm
        try:
            if self.parts is None:
                self.setup()
            p, st, s = self.parts, self.state, self.s
            position = resume_position(p, st, self.c.output.resume, seed=self.c.schedule.seed)
            self.bar = tqdm(total=p.layout.total_steps, initial=st.step,
                            disable=p.layout.rank != 0 or not self.c.logging.progress,
                            desc="train", unit="step", dynamic_ncols=True, file=sys.stderr)
            start_step, self._t_fit, self._c_fit = st.step, time.perf_counter(), time.process_time()
            while True:
                try:
                    result = self._run(*position, start_step)
                    lost = any(rep["count"] for rep in result["data_lost"].values())
                    self._write_result("completed_with_data_loss" if lost else "completed",
                                       run_summary(result, s.run_dir, st.last_metrics))
                    return result
                except DivergenceError as e:
                    has_ckpt = p.ckpt.latest_tag() is not None
                    g = self.c.guard
                    if not decide_rollback(e, policy=g.on_divergence, rollbacks=st.rollbacks, has_checkpoint=has_ckpt,
                                           max_rollbacks=g.max_rollbacks,
                                           clip=float(p.ds_config.get("gradient_clipping") or 0.0)):
                        raise
                    position = self._rollback(e)
        except (DivergenceError, CheckpointSaveError, Preempted, DataLossError) as e:   # result.json: how it ended
            self._write_result(*stopped_record(e, self.parts.ckpt.dir))
            raise
        finally:
            self.hooks.on_end()
            if getattr(self, "bar", None) is not None:
                self.bar.close()

    def _rollback(self, err: DivergenceError) -> tuple[int, int]:
        """Reload the last good checkpoint with every lr x ``rollback_lr_factor`` from now on."""
        st, ckpt = self.state, self.parts.ckpt
        g = self.c.guard
        tag, scale, count = ckpt.latest_tag(), st.lr_scale * g.rollback_lr_factor, st.rollbacks + 1
        if self.parts.layout.rank == 0:
            log.warning("%s\nrollback %d of %d: reloading %s, every lr x %g from now on (x%g in all)", err.describe(),
                        count, g.max_rollbacks, ckpt.dir / tag, g.rollback_lr_factor, scale)
        position = load_position(self.parts, st, tag, seed=self.c.schedule.seed)
        st.lr_scale, st.rollbacks = scale, count   # the checkpoint's own values are older
        self.hooks.on_rollback(st.step)
        self.hooks.on_metrics({"train/rollbacks": count, "train/lr_scale": scale}, st.step)
        self.bar.n = st.step
        return position

    def _write_result(self, status: str, fields: dict) -> None:
        if self.parts is not None and self.parts.layout.rank == 0:
            write_run_result(self.s.run_dir, status, {"rollbacks": self.state.rollbacks,
                                                      "lr_scale": self.state.lr_scale, **fields}, log=log)

    def _run(self, start_epoch: int, skip_micro: int, start_step: int) -> dict:
        """The epoch loop from a position (epoch, micro-batches done in it)."""
        p, st, lay, eng = self.parts, self.state, self.parts.layout, self.parts.engine
        if skip_micro >= lay.micro_in(start_epoch):
            start_epoch, skip_micro = start_epoch + 1, 0
        params = [q for q in eng.module.parameters() if q.requires_grad]
        val, epoch, micro_i = {}, start_epoch, skip_micro
        self._t_step, acc = time.perf_counter(), StepStats()   # this rank's sums over the step's micro-batches
        for epoch in range(start_epoch, lay.epochs):
            if st.step >= lay.total_steps:
                break
            micro_i = skip_micro if epoch == start_epoch else 0
            it = self._start_epoch(epoch, micro_i)
            while micro_i < self._n_micro and st.step < lay.total_steps:
                lrs = self._micro_step(next_timed(it), acc, params)
                micro_i += 1
                if lrs is not None:   # an optimizer step was taken
                    self._after_step(epoch, micro_i, acc, lrs)
                    acc = StepStats()
            del it
            val = self._epoch_end(epoch, micro_i)
        if not val and st.step == start_step:
            if lay.rank == 0:
                log.info("nothing left to train (step %d of %d): evaluating the checkpoint", st.step, lay.total_steps)
            val = self.evaluate()
        if st.last_saved != st.step:
            self.save(epoch, micro_i)
        self._export("last_model.pt", {"step": st.step})
        lost = run_loss_reports(p.bad.files, len(self.train_set), val and val["lost"])
        if lay.rank == 0 and any(rep["count"] for rep in lost.values()):
            log.warning("data lost within the budget (--max-bad-fraction %g): %s", self.c.data.max_bad_fraction,
                        " | ".join(describe_loss(k, rep) for k, rep in lost.items()))
        return {"step": st.step, "epoch": epoch, "val": val, "best_top1": st.best_top1, "history": st.history,
                "rollbacks": st.rollbacks, "lr_scale": st.lr_scale, "last_metrics": st.last_metrics,
                "data_lost": lost}

    def _start_epoch(self, epoch: int, micro_i: int):
        """Set the sampler, the dataset and the worker seeds to ``epoch`` (resumed after ``micro_i``
        micro-batches); returns the loader's iterator."""
        p, lay = self.parts, self.parts.layout
        p.engine.train()  # the model's own train() (partial BN / frozen BN overrides apply)
        p.sampler.set_epoch(epoch)
        p.sampler.resume_at(micro_i, lay.clips_before(epoch, micro_i))
        self._n_micro, self._lr_factor = lay.micro_in(epoch), lay.lr_factor(epoch)
        if hasattr(self.train_set, "set_epoch"):
            self.train_set.set_epoch(epoch)
        p.loader_gen.manual_seed(self.c.schedule.seed * 100_003 + epoch)
        return iter(p.loader)

    def _micro_step(self, timed_batch: tuple, acc: StepStats, params: list) -> dict | None:
        """Forward, backward and (at the accumulation boundary) the all-reduce, the guard's checks
        and the update of one micro-batch; sums into ``acc``. Returns the update's lrs at a
        boundary, else None."""
        p, st, lay, eng = self.parts, self.state, self.parts.layout, self.parts.engine
        batch, data_s = timed_batch
        t1 = time.perf_counter()
        clip = p.to_device(batch["clip"])   # uint8 -> device -> normalised fp32 -> input dtype
        label = torch.as_tensor(batch["label"]).long().to(p.device)
        logits = eng(clip)
        loss = self.hooks.on_loss(F.cross_entropy(logits.float(), label), st.step + 1, lay.rank)
        boundary = eng.is_gradient_accumulation_boundary()
        eng.backward(loss)
        t2 = time.perf_counter()
        if boundary and p.manual_comm and not p.skip_reduce:   # skip_reduce: one rank, the identity
            p.compressor.allreduce(params) if p.compressor is not None else eng.allreduce_gradients()
        t3 = time.perf_counter()
        acc.add_loss(loss, label.numel())   # a device tensor: read once per step, not per micro-batch
        lrs = None
        if boundary:
            lrs = self._lrs()   # the lrs this update uses (the schedule steps inside)
            p.guard.before_update(acc.loss_sum, acc.clips, params, step=st.step + 1, lrs=lrs)
            p.guard.scaled_step(st.lr_scale * self._lr_factor)
            p.guard.after_update(step=st.step + 1, lrs=lrs)
        else:
            eng.step()
        t4 = time.perf_counter()
        self._shape = tuple(clip.shape[:2]) + tuple(clip.shape[-1:])   # (clips, T, crop) of this micro-batch
        acc.add_batch(logits, label, bad=p.bad.add(batch), data_s=data_s, compute_s=(t2 - t1) + (t4 - t3),
                      comm_s=t3 - t2)
        return lrs

    def _after_step(self, epoch: int, micro_i: int, acc: StepStats, lrs: dict) -> None:
        """After an optimizer step: the sums over ranks, metrics, the data-loss budget, progress,
        mid-epoch validation and checkpoints as due, and the stop signal (raises Preempted)."""
        p, st, lay, eng = self.parts, self.state, self.parts.layout, self.parts.engine
        st.step += 1
        acc.bad_files_new = p.bad.num_pending()
        reason = self.hooks.stop_requested()
        sums = p.reduce(acc.as_list() + [1.0 if reason else 0.0])   # sums over ranks; any rank signalled?
        r, stop_now, now = StepStats.from_list(sums[:-1]), sums[-1] > 0, time.perf_counter()
        st.last_metrics = step_metrics(r, p.bad.sync(r.bad_files_new, r.bad_videos), lrs, now - self._t_step,
                                       eng=eng, world=lay.world, manual_comm=p.manual_comm, guard=p.guard,
                                       compressor=p.compressor)
        self._t_step = now
        if lay.schedule is not None:   # TensorBoard: the shape, batch and lr factor over time
            n, t, crop = self._shape
            st.last_metrics.update({"multigrid/frames": t, "multigrid/crop": crop, "multigrid/lr_factor":
                                    self._lr_factor, "multigrid/global_batch": n * lay.accum * lay.world})
        self.hooks.on_metrics(st.last_metrics, st.step)
        # the data-loss budget: the tracker's files are the same on every rank after sync
        check_data_loss("train", p.bad.files, len(self.train_set), self.c.data.max_bad_fraction, step=st.step)
        self.bar.update(1)
        self.bar.set_postfix(epoch=epoch, loss=f"{st.last_metrics['train/loss']:.3f}",
                             clips_s=f"{st.last_metrics['perf/clips_per_s']:.1f}")
        self.hooks.on_step(st.step, {"metrics": st.last_metrics, "lrs": list(eng.get_lr()), "rank": lay.rank,
                                     "world": lay.world, "epoch": epoch})
        mid_epoch = micro_i < self._n_micro and st.step < lay.total_steps   # (ends: in _epoch_end)
        if mid_epoch:
            self._validate(epoch, micro_i, last=False)
        if mid_epoch and self.hooks.checkpoint_due(st.step, micro_i // lay.accum, self._n_micro // lay.accum):
            self.save(epoch, micro_i)   # (an epoch's or the run's end saves after validation)
        if stop_now:   # a stop signal (SLURM's time-limit warning) on some rank: save here, stop
            end = micro_i >= self._n_micro
            tag = (tag_for_step(st.step) if st.last_saved == st.step
                   else self.save(epoch + 1 if end else epoch, 0 if end else micro_i))
            raise Preempted(st.step, tag, reason or "a stop signal on another rank")

    def _epoch_end(self, epoch: int, micro_i: int) -> dict:
        """Validate when due (at the run's end always, on the whole set); save when due (at the run's end
        always: the epoch's end, or the position where ``max_steps`` stopped it)."""
        st, lay = self.state, self.parts.layout
        last = st.step >= lay.total_steps
        val = self._validate(epoch, micro_i, last=last)
        self.hooks.on_epoch_end(epoch, st.step)
        done, steps = micro_i >= self._n_micro, self._n_micro // lay.accum
        if last or self.hooks.checkpoint_due(st.step, micro_i // lay.accum if not done else steps, steps):
            self.save(*((epoch + 1, 0) if done else (epoch, micro_i)))
        return val

    def _validate(self, epoch: int, micro_i: int, *, last: bool) -> dict:
        """If due (hooks' cadence; ``last``: always, whole set): validate, log, export the best ({}: not due)."""
        st, lay = self.state, self.parts.layout
        if not (last or self.hooks.validation_due(st.step, micro_i // lay.accum, self._n_micro // lay.accum)):
            return {}
        t0, c0 = time.perf_counter(), time.process_time()
        bn_s = self._precise_bn()
        val = self.evaluate(full=last)
        if val:   # the budget over the clips this evaluation covered (the same on every rank)
            check_data_loss("val", val["lost"]["files"], val["lost"]["total"], self.c.data.max_bad_fraction,
                            step=st.step)
            # times (s, this process): since fit() began at the evaluation's start, and the evaluation's own
            # (precise BatchNorm included): training time to here = wall_s - the earlier evaluations' eval_s;
            # the same in CPU seconds of this process (cpu_s, eval_cpu_s: what other processes on the cores
            # do not change)
            st.history.append({"epoch": epoch, "step": st.step, "val_top1": val["top1"], "val_top5": val["top5"],
                               "val_clips": val["count"], "wall_s": round(t0 - self._t_fit, 3),
                               "eval_s": round(time.perf_counter() - t0, 3), "precise_bn_s": bn_s,
                               "cpu_s": round(c0 - self._c_fit, 3),
                               "eval_cpu_s": round(time.process_time() - c0, 3)})
            self.hooks.on_metrics({"val/top1": val["top1"], "val/top5": val["top5"], "val/clips": val["count"],
                                   "val/loss": val.get("loss")}, st.step)
            if lay.rank == 0:
                self.bar.write(f"epoch {epoch}: step {st.step}, val top-1 {val['top1']:.1f}% top-5 "
                               f"{val['top5']:.1f}% on {val['count']} clips")
            if self.hooks.best_due(val["select_top1"], st.best_top1):
                self.parts.guard.check_weights("exporting best_model.pt", step=st.step, lrs=self._lrs())
                st.best_top1, st.best_tag = val["select_top1"], tag_for_step(st.step)
                self._export("best_model.pt", {"epoch": epoch, "step": st.step, "val_top1": val["top1"]}, check=False)
        return val

    def _precise_bn(self) -> float | None:
        """With a multigrid schedule (or ``--precise-bn-batches`` given): BatchNorm statistics recomputed at
        the base shape before an evaluation (:meth:`~tsm_ds.config.tree.ScheduleConfig.precise_bn`
        micro-batches; :func:`.evaluate.precise_bn_stats`), its time logged as ``val/precise_bn_s``.
        Returns those seconds (None: off)."""
        p = self.parts
        if p.bn_loader is None:
            return None
        t0 = time.perf_counter()
        p.bn_loader.sampler.set_epoch(self.state.step)   # other clips each time, the same on every rank
        used = precise_bn_stats(p.engine.module, (p.to_device(b["clip"]) for b in p.bn_loader),
                                self.c.schedule.precise_bn())
        secs = time.perf_counter() - t0
        if p.layout.rank == 0:
            log.info("precise BatchNorm at step %d: statistics of %d base-shape micro-batches per rank, %.1f s",
                     self.state.step, used, secs)
        self.hooks.on_metrics({"val/precise_bn_s": secs, "val/precise_bn_batches": used}, self.state.step)
        return round(secs, 3)

    def _export(self, name: str, extra: dict, *, check: bool = True) -> None:
        """Check the weights (every rank; DivergenceError), then export the module to ``<run>/<name>`` on rank 0."""
        p = self.parts
        if check:
            p.guard.check_weights(f"exporting {name}", step=self.state.step, lrs=self._lrs())
        if p.layout.rank == 0:
            save_weights_export(self.s.run_dir / name, p.engine.module, class_names=self.s.class_names,
                                extra={**extra, "img_size": self._img_size()})
