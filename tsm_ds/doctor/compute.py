"""Doctor section ``compute``: training clips/s per device on synthetic input, at the recipe's precision.

One training step = zero_grad, forward (N, T, 3, H, W) -> logits, cross-entropy, backward, SGD
(momentum) step: what the trainer's engine does per micro-batch without the data wait and without
the gradient all-reduce (measured by the ``data`` and ``communication`` sections). The model is
``build_model(arch, num_classes, num_segments=T)`` on random clips of ``img_size`` px, ``micro_batch``
clips per step, on this rank's device with this rank's threads (under the launcher every rank
measures at once, as they would train).

Precision (from the recipe, :func:`recipe_precision`): ``fp32``; ``bf16`` / ``fp16`` (DeepSpeed's
bf16 / fp16 engines train the module in that dtype: the model and the input are cast); ``autocast_bf16``
/ ``autocast_fp16`` (``torch_autocast``: fp32 weights, the forward under ``torch.autocast``).
Variants measured beside it, interleaved (:mod:`.timing`), each a fresh model with the same seed:
``--channels-last`` (``model.to(memory_format=torch.channels_last)``, the clip's frames converted
with :func:`to_channels_last_clip`), ``--compile`` (``torch.compile(model)``; the compile time is the
first step's, reported as ``first_step_s``), both, every extra ``--precisions`` entry, and on CPU
with more than one torch thread when the load average is at least the core count, ``threads_1``
(the step with one thread: OpenMP threads sharing cores with other busy processes can be many
times slower than one). fp16 needs CUDA (skipped on
CPU with a note). ``values["speedup_<variant>"]`` = base median step time /
variant median step time: the factor the verdict quotes.
"""
from __future__ import annotations

import contextlib
import time
from typing import Any

from tsm_ds.doctor.core import Context, section_result
from tsm_ds.doctor.timing import interleaved, summary

__all__ = ["PRECISIONS", "recipe_precision", "micro_batch", "to_channels_last_clip", "TrainStep", "run"]

#: precisions compute can be measured at
PRECISIONS = ("fp32", "bf16", "fp16", "autocast_bf16", "autocast_fp16")


def recipe_precision(raw: dict) -> str:
    """The training precision a recipe asks for: ``fp16`` / ``bf16`` (DeepSpeed's engines),
    ``autocast_bf16`` / ``autocast_fp16`` (``torch_autocast`` block; its ``dtype``), else ``fp32``."""
    if (raw.get("fp16") or {}).get("enabled"):
        return "fp16"
    if (raw.get("bf16") or {}).get("enabled"):
        return "bf16"
    ac = raw.get("torch_autocast") or {}
    if ac.get("enabled"):
        dt = str(ac.get("dtype", "bfloat16")).lower().split(".")[-1]
        return "autocast_fp16" if dt in ("float16", "fp16", "half") else "autocast_bf16"
    return "fp32"


def micro_batch(ctx: Context, raw: dict | None = None) -> int:
    """Clips per device per step: ``--micro-batch``, else the recipe's fixed
    ``train_micro_batch_size_per_gpu``, else 8 on CUDA (the official 8 per GPU) and 2 on CPU
    (1 with ``--quick``): a CPU step at 224 px takes seconds per clip."""
    if ctx.settings.micro_batch:
        return int(ctx.settings.micro_batch)
    fixed = (raw or {}).get("train_micro_batch_size_per_gpu")
    if isinstance(fixed, int) and fixed > 0:
        return fixed
    if ctx.cuda:
        return 8
    return 1 if ctx.settings.quick else 2


def to_channels_last_clip(x):
    """Clips (N, T, C, H, W) with each frame in ``torch.channels_last`` layout: the (N*T, C, H, W)
    view the 2D backbone gets is channels-last (strides (H*W*C, 1, W*C, C)); same values and shape."""
    import torch

    n, t = x.shape[:2]
    return x.flatten(0, 1).contiguous(memory_format=torch.channels_last).view(n, t, *x.shape[2:])


class TrainStep:
    """One model + optimizer at one precision / memory format, stepping on clips.

    Args:
        ctx: the doctor context (arch, num_segments, img_size, num_classes, device).
        precision: one of :data:`PRECISIONS`.
        channels_last / compiled: see the module docstring.
        batch: clips per step (N).
        threads: torch intra-op threads during the step (None: the process's setting).

    ``prepare(x)`` moves clips (N, T, 3, H, W) float32 to the device in the step's dtype and
    layout; ``step(x, y)`` runs one training step on prepared clips and int64 labels (N,) and
    returns its wall seconds (CUDA synchronised); ``synthetic()`` steps on a fixed random batch.

    Raises:
        ValueError: an unknown precision, or fp16 without CUDA.
    """

    def __init__(self, ctx: Context, precision: str, *, channels_last: bool = False,
                 compiled: bool = False, batch: int = 1, threads: int | None = None):
        import torch

        from tsm_ds.models import build_model

        if precision not in PRECISIONS:
            raise ValueError(f"precision {precision!r}: use one of {', '.join(PRECISIONS)}")
        if "fp16" in precision and not ctx.cuda:
            raise ValueError("fp16 training needs CUDA (DeepSpeed refuses fp16 on CPU)")
        s = ctx.settings
        self.device, self.cuda = ctx.device, ctx.cuda
        self.channels_last = channels_last
        self.threads = threads
        self.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
        self.autocast = ({"autocast_bf16": torch.bfloat16, "autocast_fp16": torch.float16}
                         .get(precision))
        torch.manual_seed(0)
        model = build_model(s.arch, s.num_classes, num_segments=s.num_segments).to(self.device)
        model = model.to(self.dtype)
        if channels_last:
            model = model.to(memory_format=torch.channels_last)
        self.module = model
        self.grad_numel = sum(p.numel() for p in model.parameters() if p.requires_grad)
        self.opt = torch.optim.SGD(model.parameters(), lr=1e-6, momentum=0.9)
        self.model = torch.compile(model) if compiled else model
        g = torch.Generator().manual_seed(0)
        self.x = self.prepare(torch.randn(batch, s.num_segments, 3, s.img_size, s.img_size, generator=g))
        self.y = torch.randint(0, s.num_classes, (batch,), generator=g).to(self.device)
        self.model.train()

    def prepare(self, x, normalization=None):
        """Clips (N, T, 3, H, W) -> the device, the step's dtype and memory layout: uint8 clips (a
        loader's batch) are moved, normalised there in float32 with ``normalization`` (mean, std;
        default ImageNet) and cast as the trainer does (:func:`tsm_ds.data.transforms.normalize_batch`);
        float32 clips (the synthetic batch) are moved and cast."""
        from tsm_ds.data.transforms import IMAGENET_MEAN, IMAGENET_STD, normalize_batch

        x = normalize_batch(x, *(normalization or (IMAGENET_MEAN, IMAGENET_STD)), self.device, self.dtype)
        return to_channels_last_clip(x) if self.channels_last else x

    def step(self, x, y) -> float:
        """One training step on prepared clips; returns its seconds."""
        import torch
        import torch.nn.functional as F

        if self.cuda:
            torch.cuda.synchronize(self.device)
        old = torch.get_num_threads()
        if self.threads:
            torch.set_num_threads(self.threads)
        t = time.perf_counter()
        self.opt.zero_grad(set_to_none=True)
        ac = (torch.autocast(self.device.type, dtype=self.autocast) if self.autocast
              else contextlib.nullcontext())
        with ac:
            out = self.model(x)
        F.cross_entropy(out.float(), y).backward()
        self.opt.step()
        if self.cuda:
            torch.cuda.synchronize(self.device)
        dt = time.perf_counter() - t
        torch.set_num_threads(old)
        return dt

    def synthetic(self) -> float:
        """One step on the fixed random batch; returns its seconds."""
        return self.step(self.x, self.y)


def _busy() -> bool:
    """The 1-minute load average is at least the number of cores (other processes want them)."""
    import os

    return hasattr(os, "getloadavg") and os.getloadavg()[0] >= (os.cpu_count() or 1)


def _variants(ctx: Context, base: str) -> list[tuple[str, str, bool, bool, int | None]]:
    """(name, precision, channels_last, compiled, threads) of every measured variant, the base first."""
    import torch

    s = ctx.settings
    out = [("base", base, False, False, None)]
    if s.channels_last:
        out.append(("channels_last", base, True, False, None))
    if s.compile:
        out.append(("compile", base, False, True, None))
    if s.channels_last and s.compile:
        out.append(("channels_last_compile", base, True, True, None))
    for p in s.precisions:
        if p != base and p not in [v[0] for v in out]:
            out.append((p, p, False, False, None))
    if not ctx.cuda and torch.get_num_threads() > 1 and _busy():
        # OpenMP threads on cores other processes also want wait for each other at every barrier:
        # on a busy machine 1 thread can beat 2 by 10x (measured here, load 9 on 2 cores)
        out.append(("threads_1", base, False, False, 1))
    return out


def run(ctx: Context, results: dict) -> dict:
    """The ``compute`` section (see the module docstring)."""
    import torch

    from tsm_ds.engine.config.recipes import load_config

    s = ctx.settings
    raw = load_config(s.recipe)
    base = recipe_precision(raw)
    notes: list[str] = []
    if "fp16" in base and not ctx.cuda:
        notes.append(f"recipe {s.recipe} trains in {base}, which needs CUDA: measured fp32 instead")
        base = "fp32"
    batch = micro_batch(ctx, raw)
    steps: dict[str, TrainStep] = {}
    meta: dict[str, dict[str, Any]] = {}
    for name, prec, cl, comp, threads in _variants(ctx, base):
        ctx.progress.note(f"building {name}")
        try:
            steps[name] = TrainStep(ctx, prec, channels_last=cl, compiled=comp, batch=batch, threads=threads)
        except ValueError as e:
            notes.append(f"{name}: not measured ({e})")
            continue
        meta[name] = {"variant": name, "precision": prec, "channels_last": cl, "compile": comp,
                      "threads": threads or torch.get_num_threads()}
    if s.compile and not ctx.cuda:
        notes.append("torch.compile on CPU: compiling takes minutes (164 s for one ResNet block was "
                     "measured here); the first step holds it")
    ctx.progress.note(f"{len(steps)} variant(s), batch {batch}, {s.img_size} px")
    times, first = interleaved({k: v.synthetic for k, v in steps.items()}, budget_s=ctx.budget("compute"),
                               min_reps=2,
                               on_rep=lambda r: ctx.progress.note(f"rep {r}"))
    ctx.shared["train_step"] = steps["base"]          # warmed: the data section's pipeline trains it
    rows = []
    base_med = summary(times["base"])["median_s"]
    values: dict[str, Any] = {}
    for name, ts in times.items():
        st = summary(ts)
        row = {**meta[name], "batch": batch, "step_s": st["median_s"], "clips_per_s": batch / st["median_s"],
               "spread_pct": st["spread_pct"], "reps": st["reps"], "first_step_s": first[name],
               "speedup_vs_base": base_med / st["median_s"]}
        rows.append(row)
        if name != "base":
            values[f"speedup_{name}"] = row["speedup_vs_base"]
    b = rows[0]
    values.update({"precision": base, "micro_batch": batch, "clips_per_s": b["clips_per_s"],
                   "step_s": b["step_s"], "arch": s.arch, "num_segments": s.num_segments,
                   "img_size": s.img_size, "grad_numel": steps["base"].grad_numel,
                   "device": str(ctx.device), "torch_threads": torch.get_num_threads(), "world_size": ctx.world})
    if ctx.cuda:
        values["gpu_peak_memory_gb"] = torch.cuda.max_memory_allocated(ctx.device) / 1e9
    extra = "".join(f", {k[8:]} x{v:.2f}" for k, v in values.items() if k.startswith("speedup_"))
    summary_line = (f"{s.arch} {s.num_segments}x{s.img_size}, {base}, batch {batch}: "
                    f"{b['clips_per_s']:.3g} clips/s per device ({b['step_s']:.3g} s/step){extra}")
    return section_result("compute", title="Compute", summary=summary_line, values=values, rows=rows,
                          notes=notes)
