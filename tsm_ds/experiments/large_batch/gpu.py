"""The study's GPU version (``launch/gpu_large_batch.sh``): the same task and recipes to a global
batch of 4,096 on one GPU within 10 minutes (~7 by its own estimate; 5 runs, one seed, fixed lrs).

Lin, Gan, Han ("Training Kinetics in 15 Minutes", Sec. 5) train at 12,288 clips with 8 clips per
GPU; one GPU here holds the whole batch and normalises BatchNorm over groups of 8 clips (ghost
BatchNorm, :func:`tsm_ds.models.large_batch.use_ghost_bn`), in bf16 autocast, with the data held on
the device: the hard demo task (:data:`tsm_ds.data.synthetic.DIFFICULTIES`) rendered in memory by
CPU workers, then one uint8 tensor on the GPU (81,920 training clips of 16 frames of 64 px: 16 GB),
4 segments per clip (random within each segment for training, the centres for validation, as
TSN), resized to 32 px on the device. No DeepSpeed, no decoding: the loop is a plain PyTorch loop
so that the GPU, not the input, is what is measured.

Grid (defaults): batches 128 / 512 / 4,096 (32x), 15 epochs = 300 optimizer steps at 4,096 (20 per
epoch, the paper's regime), (a) SGD with the linear rule from ``sgd_lr`` per 8 clips and a 5-epoch
warm-up above the base batch (Goyal et al. 2017), (b) LARS and (c) LAMB (timm) at 4,096 with
their own lrs, cosine decay; the CPU study's pass rule (:func:`.study_report.pass_rule`, one seed).
Rows are appended to ``OUT/gpu_large_batch.jsonl`` as each run ends (a time-out loses nothing
before it); the estimate is printed before anything runs, from :data:`GPU_COST` (assumed H100
rates, not measured: no GPU was available), and again from the first run's measured rate.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Sequence

__all__ = ["GpuSettings", "GPU_COST", "SMOKE", "DRY", "MAIN_KEYS", "gpu_plan", "gpu_estimate", "kwargs_of", "main"]


@dataclass(frozen=True)
class GpuSettings:
    """The GPU grid.

    Attributes:
        batches: global batches, ascending (the first is the base); the largest >= 4,096.
        micro_batch: clips per forward pass (accumulation above it); BatchNorm over ``ghost_bn_clips``.
        train_per_class, val_per_class: rendered clips per class (8 classes of the hard preset).
        epochs: every run's epochs (the same clips at every batch).
        warmup_epochs: linear warm-up above the base batch (Goyal et al. 2017, Sec. 2.2).
        sgd_lr: (a)'s lr per 8 clips (linear rule); lars_lr, lamb_lr: (b) / (c) at the largest batch.
        recipes: which of sgd / lars / lamb run at the largest batch ((a) also at every batch).
        zero_init_residual: Goyal et al.'s zero gamma (off, as the CPU study: it kept TSM from
            scratch at chance there, :class:`.grid.StudySettings`).
        seed, workers (CPU processes rendering the data), device, bf16.
    """

    batches: tuple[int, ...] = (128, 512, 4096)
    micro_batch: int = 1024
    ghost_bn_clips: int = 8
    train_per_class: int = 10240
    val_per_class: int = 250
    epochs: int = 15
    warmup_epochs: float = 5.0
    sgd_lr: float = 0.01
    lars_lr: float = 128.0
    lamb_lr: float = 0.04
    recipes: tuple[str, ...] = ("sgd", "lars", "lamb")
    zero_init_residual: bool = False
    seed: int = 0
    workers: int = 0
    device: str = "cuda"
    bf16: bool = True
    num_segments: int = 4
    img_size: int = 32

    @property
    def train_clips(self) -> int:
        """Training clips (8 classes)."""
        return 8 * self.train_per_class


#: ``--smoke`` (the <= 60 s box of launch/gpu_check.sh): 16,384 clips, batches 512 and 4,096, 2
#: epochs (8 steps at 4,096), (a) only
SMOKE = GpuSettings(batches=(512, 4096), train_per_class=2048, val_per_class=64, epochs=2, warmup_epochs=1.0,
                    recipes=("sgd",))
#: ``--dry-run`` on a CPU (the tests): tiny clips of the same code path
DRY = GpuSettings(batches=(8, 32), micro_batch=16, train_per_class=8, val_per_class=2, epochs=1, warmup_epochs=0.5,
                  recipes=("sgd", "lars", "lamb"), device="cpu", bf16=True, num_segments=2)

#: assumed H100 rates for the printed estimate (not measured here): ``clip_s`` training seconds per
#: clip of TSM-R18 T=4 32 px in bf16 (4e-5: 25,000 clips/s), ``step_s`` per optimizer step,
#: ``render_s`` one clip rendered on one CPU core (6.3 ms measured on the 2-core machine),
#: ``start_s`` CUDA start-up and the first batches
GPU_COST = {"clip_s": 4e-5, "step_s": 0.01, "render_s": 0.0063, "start_s": 20.0}


def gpu_plan(s: GpuSettings) -> list[dict[str, Any]]:
    """The runs in order: (a) at the base and the largest batch, (b), (c) at the largest, (a) in
    between. Each {"name", "recipe", "batch", "lr" (at this batch), "warmup_steps", "steps"}."""
    base, top = s.batches[0], s.batches[-1]
    order = [("sgd", base), ("sgd", top)] + [(r, top) for r in ("lars", "lamb") if r in s.recipes]
    order += [("sgd", b) for b in s.batches[1:-1]]
    runs = []
    for rc, b in order:
        if rc == "sgd" and "sgd" not in s.recipes:
            continue
        spe = s.train_clips // b
        lr = {"sgd": s.sgd_lr * b / 8, "lars": s.lars_lr, "lamb": s.lamb_lr}[rc]
        runs.append({"name": f"{rc}_b{b}", "recipe": rc, "batch": b, "seed": s.seed, "lr": lr, "steps": spe * s.epochs,
                     "warmup_steps": 0 if b == base else int(round(s.warmup_epochs * spe))})
    return runs


def gpu_estimate(s: GpuSettings, cost: dict[str, float] | None = None) -> dict[str, float]:
    """Seconds: {"data_s", "train_s", "total_s", "runs"} from :data:`GPU_COST` (or ``cost``)."""
    c = {**GPU_COST, **(cost or {})}
    workers = s.workers or os.cpu_count() or 1
    data = (s.train_clips + 8 * s.val_per_class) * c["render_s"] / workers
    runs = gpu_plan(s)
    train = sum(s.epochs * s.train_clips * c["clip_s"] + r["steps"] * c["step_s"] for r in runs)
    return {"data_s": data, "train_s": train, "total_s": data + train + c["start_s"], "runs": len(runs)}


def _render(job: tuple) -> Any:
    import numpy as np

    from tsm_ds.data.synthetic import DIFFICULTIES, render_clip, sample_clip
    from tsm_ds.data.synthetic.render import _CLASS_TO_PAIR

    seed, split, cls, j = job
    h = DIFFICULTIES["hard"]
    _, pair, reverse = _CLASS_TO_PAIR[cls]
    rng = np.random.default_rng((seed, split, list(h["classes"]).index(cls), j))
    spec = sample_clip(pair, rng, size=h["size"], num_frames=h["num_frames"], speed=h["speed"], radius=h["radius"],
                       noise=h["noise"], distractor_prob=h["distractor_prob"], clutter=h["clutter"],
                       contrast=h["contrast"], tint=h["tint"])
    return render_clip(spec, reverse=reverse)


def make_data(s: GpuSettings, device: Any) -> dict[str, Any]:
    """Render the hard task in memory (``workers`` processes) and move it to ``device``: {"train",
    "val": uint8 (N, 16, 64, 64, 3), "train_y", "val_y": int64 (N,)}."""
    import multiprocessing as mp

    import numpy as np
    import torch

    from tsm_ds.data.synthetic import DIFFICULTIES

    classes = DIFFICULTIES["hard"]["classes"]
    host: dict[str, Any] = {}
    workers = s.workers or os.cpu_count() or 1
    for split, n in (("train", s.train_per_class), ("val", s.val_per_class)):   # all on the CPU first: no
        jobs = [(s.seed, 0 if split == "train" else 1, c, j) for c in classes for j in range(n)]   # fork after CUDA
        if workers > 1:
            with mp.get_context("fork").Pool(workers) as pool:
                clips = pool.map(_render, jobs, chunksize=64)
        else:
            clips = [_render(j) for j in jobs]
        host[split] = np.stack(clips)
        host[f"{split}_y"] = np.array([classes.index(j[2]) for j in jobs], dtype=np.int64)
    return {k: torch.from_numpy(v).to(device) for k, v in host.items()}


def _frames(x: Any, idx: Any, s: GpuSettings, train: bool, gen: Any) -> Any:
    """Clips ``idx`` of uint8 (N, F, H, W, 3) as float (B, T, 3, S, S) in [0, 1] - mean 0.5: T segments
    (TSN: a random frame in each segment for training, the centre for validation), resized to S."""
    import torch
    import torch.nn.functional as F

    n_frames, t = x.shape[1], s.num_segments
    seg = n_frames / t
    if train:
        off = (torch.rand(len(idx), t, generator=gen, device=x.device) * seg).long()
    else:
        off = torch.full((len(idx), t), int(seg / 2), device=x.device)
    fi = (torch.arange(t, device=x.device) * seg).long()[None] + off
    clip = x[idx[:, None], fi]                                     # (B, T, H, W, 3)
    b = clip.shape[0]
    clip = clip.permute(0, 1, 4, 2, 3).reshape(b * t, 3, x.shape[2], x.shape[3]).float() / 255.0
    clip = F.interpolate(clip, size=(s.img_size, s.img_size), mode="bilinear", antialias=True, align_corners=False)
    return (clip - 0.5).reshape(b, t, 3, s.img_size, s.img_size)


def _optimizer(model: Any, recipe: str, lr: float) -> Any:
    """SGD momentum 0.9 / timm LARS (every group adapted, trust clip) / timm LAMB, weight decay 1e-4
    except on BatchNorm and biases (Goyal et al. 2017)."""
    import torch

    decay = [p for n, p in model.named_parameters() if p.ndim > 1]
    rest = [p for n, p in model.named_parameters() if p.ndim <= 1]
    groups = [{"params": decay, "weight_decay": 1e-4}, {"params": rest, "weight_decay": 0.0}]
    if recipe == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=0.9)
    from timm.optim import Lamb, Lars

    if recipe == "lars":
        return Lars(groups, lr=lr, momentum=0.9, trust_coeff=0.001, always_adapt=True, trust_clip=True)
    return Lamb(groups, lr=lr, betas=(0.9, 0.999), max_grad_norm=1.0)


def train_one(s: GpuSettings, run: dict[str, Any], data: dict[str, Any], log: Any = print) -> dict[str, Any]:
    """One run of :func:`gpu_plan` on the device; returns its row: the plan's fields and
    "val_top1" (%, every validation clip), "history" [{"step", "val_top1"}] (every epoch),
    "status" (completed / diverged), "train_s", "clips_s"."""
    import torch
    import torch.nn.functional as F

    from tsm_ds.models import build_model
    from tsm_ds.models.large_batch import use_ghost_bn, zero_init_residual

    dev = data["train"].device
    torch.manual_seed(s.seed)
    gen = torch.Generator(device=dev).manual_seed(s.seed)
    model = build_model("resnet18", 8, num_segments=s.num_segments, dropout=0.0).to(dev)
    if s.zero_init_residual:
        zero_init_residual(model)
    use_ghost_bn(model, s.ghost_bn_clips)
    opt = _optimizer(model, run["recipe"], run["lr"])
    total, warm, b = run["steps"], run["warmup_steps"], run["batch"]
    n = data["train"].shape[0]
    hist, status, t0, step = [], "completed", time.perf_counter(), 0
    amp = torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=s.bf16)
    for epoch in range(s.epochs):
        perm = torch.randperm(n, generator=gen, device=dev)
        model.train()
        for k in range(n // b):
            lr = run["lr"] * ((step + 1) / warm if step < warm else
                              0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, total - warm))))
            for g in opt.param_groups:
                g["lr"] = lr
            idx = perm[k * b:(k + 1) * b]
            loss_sum = 0.0
            for part in idx.split(s.micro_batch):
                with amp:
                    loss = F.cross_entropy(model(_frames(data["train"], part, s, True, gen)), data["train_y"][part])
                (loss * len(part) / b).backward()
                loss_sum += float(loss.detach()) * len(part) / b
            if not math.isfinite(loss_sum):
                status = "diverged"
                break
            if run["recipe"] == "sgd":
                torch.nn.utils.clip_grad_norm_(model.parameters(), 20.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            step += 1
        if status != "completed":
            break
        hist.append({"step": step, "val_top1": evaluate(s, model, data)})
    train_s = time.perf_counter() - t0
    row = {**run, "status": status, "diverged_at": step if status == "diverged" else None,
           "val_top1": hist[-1]["val_top1"] if hist and status == "completed" else None, "history": hist,
           "train_s": round(train_s, 2), "clips_s": round(step * b / max(train_s, 1e-9), 1)}
    log(f"{run['name']}: {status}, top-1 {row['val_top1']}, {step} steps, {row['clips_s']:.0f} clips/s, "
        f"{train_s:.1f} s")
    return row


def evaluate(s: GpuSettings, model: Any, data: dict[str, Any]) -> float:
    """Top-1 (%) on every validation clip (segment centres), bf16 autocast."""
    import torch

    model.eval()
    correct = 0
    with torch.no_grad(), torch.autocast(device_type=data["val"].device.type, dtype=torch.bfloat16, enabled=s.bf16):
        for part in torch.arange(data["val"].shape[0], device=data["val"].device).split(s.micro_batch):
            pred = model(_frames(data["val"], part, s, False, None)).argmax(1)
            correct += int((pred == data["val_y"][part]).sum())
    model.train()
    return 100.0 * correct / data["val"].shape[0]


#: the keywords of :func:`main` and their types (``launch/gpu_large_batch.sh`` passes ``KEY=VALUE`` to
#: :mod:`tsm_ds.cli.gpu_large_batch`)
MAIN_KEYS = {"out": str, "mode": str, "plan_only": lambda v: v in ("1", "true", "yes"), "budget_s": float,
             "workers": int, "sgd_lr": float, "lars_lr": float, "lamb_lr": float}


def main(out: str = "gpu_large_batch_out", mode: str = "full", plan_only: bool = False, budget_s: float = 600.0,
         workers: int | None = None, sgd_lr: float | None = None, lars_lr: float | None = None,
         lamb_lr: float | None = None) -> int:
    """``launch/gpu_large_batch.sh``: print the plan and the estimate, then run the grid.

    Args:
        out: output folder (``gpu_large_batch.jsonl``: a row per run as it ends; ``gpu_large_batch.json``).
        mode: "full" (:class:`GpuSettings`), "smoke" (:data:`SMOKE`, the gpu_check box) or "dry"
            (:data:`DRY`, a tiny CPU version).
        plan_only: print the plan and the estimate, run nothing.
        budget_s: refuse (return 2, nothing run) a grid whose estimate exceeds it (not in "dry").
        workers: CPU processes rendering the data (default: every core; the H100 machine has 16).
        sgd_lr, lars_lr, lamb_lr: replace :class:`GpuSettings`'s.

    Returns:
        0; 1 when no run completed; 2 over budget or an unknown mode.
    """
    from .study_report import pass_rule

    if mode not in ("full", "smoke", "dry"):
        print(f"gpu_large_batch: mode {mode!r}: full, smoke or dry", file=sys.stderr)
        return 2
    s = {"full": GpuSettings(), "smoke": SMOKE, "dry": DRY}[mode]
    s = replace(s, workers=workers or os.cpu_count() or 1,
                **{k: v for k, v in (("sgd_lr", sgd_lr), ("lars_lr", lars_lr), ("lamb_lr", lamb_lr)) if v is not None})
    plan, est = gpu_plan(s), gpu_estimate(s)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for r in plan:
        print(f"plan: {r['name']}: lr {r['lr']:g}, {r['steps']} steps, warm-up {r['warmup_steps']}")
    print(f"estimate (assumed H100 rates, tsm_ds.experiments.large_batch.gpu.GPU_COST): data {est['data_s']:.0f} s, "
          f"training {est['train_s']:.0f} s, total {est['total_s']:.0f} s for {est['runs']} runs "
          f"(budget {budget_s:.0f} s)", flush=True)
    if est["total_s"] > budget_s and mode != "dry":
        print("gpu_large_batch: the estimate exceeds the budget; nothing run", file=sys.stderr)
        return 2
    if plan_only:
        return 0
    import torch

    dev = torch.device(s.device if s.device == "cpu" or torch.cuda.is_available() else "cpu")
    t0 = time.perf_counter()
    data = make_data(s, dev)
    print(f"data: {data['train'].shape[0]} training, {data['val'].shape[0]} validation clips on {dev} "
          f"({time.perf_counter() - t0:.1f} s)", flush=True)
    rows = []
    with open(out / "gpu_large_batch.jsonl", "a") as f:
        for i, r in enumerate(plan):
            try:
                row = train_one(s, r, data)
            except ImportError as e:        # timm (LARS, LAMB) missing on this machine
                row = {**r, "status": "skipped", "val_top1": None, "history": [], "clips_s": None,
                       "reason": str(e)}
                print(f"{r['name']}: skipped ({e})", flush=True)
            rows.append(row)
            f.write(json.dumps(row) + "\n")
            f.flush()
            if i == 0 and row.get("clips_s"):
                left = sum(s.epochs * s.train_clips / row["clips_s"] for _ in plan[1:])
                print(f"measured: {row['clips_s']:.0f} clips/s; the other runs ~{left:.0f} s", flush=True)
    base = [rows[0]] if rows and rows[0]["status"] == "completed" else []
    verdicts = {r["name"]: pass_rule(base, [r], val_clips=data["val"].shape[0], chance=12.5)["text"]
                for r in rows[1:] if r["batch"] == s.batches[-1]}
    summary = {"settings": asdict(s), "estimate": est, "device": str(dev),
               "gpu": torch.cuda.get_device_name(0) if dev.type == "cuda" else None,
               "rows": [{k: v for k, v in r.items() if k != "history"} for r in rows], "verdicts": verdicts,
               "total_s": round(time.perf_counter() - t0, 1)}
    (out / "gpu_large_batch.json").write_text(json.dumps(summary, indent=2) + "\n")
    for name, text in verdicts.items():
        print(f"verdict {name}: {text}")
    print(f"gpu_large_batch: {len(rows)} runs in {summary['total_s']:.0f} s; {out / 'gpu_large_batch.json'}")
    return 0 if any(r["status"] == "completed" for r in rows) else 1


def kwargs_of(args: Sequence[str]) -> dict[str, Any]:
    """``KEY=VALUE`` words as :func:`main`'s keywords (ValueError: an unknown key or a bad value)."""
    kw = {}
    for word in args:
        key, sep, value = word.partition("=")
        if not sep or key not in MAIN_KEYS:
            raise ValueError(f"{word!r}: give KEY=VALUE with KEY one of {', '.join(MAIN_KEYS)}")
        kw[key] = MAIN_KEYS[key](value)
    return kw

