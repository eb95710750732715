"""Distributed evaluation core: every dataset sample scored exactly once, whatever the world size.

``DistributedSampler`` pads the index list with repeated samples so that every rank gets the
same count (ceil(N / world size)); counting those twice would bias top-1. Each batch carries the
dataset ``index`` of each sample, so ranks all-gather (index, scores, label) and keep the first
occurrence of each index. The multi-view evaluation (:mod:`tsm_ds.inference.evaluate`) plugs its view averaging in
through ``forward``.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist

from tsm_ds.data.bad_videos import parse_bad_files
from tsm_ds.data.transforms import IMAGENET_MEAN, IMAGENET_STD, normalize_batch


def _default_forward(model, clip: torch.Tensor) -> torch.Tensor:
    """model(clip) with the clip moved to the model's device and floating dtype (bf16/fp16 engines)."""
    p = next((p for p in model.parameters() if p.is_floating_point()), None)
    if p is None:
        return model(clip)
    return model(clip.to(device=p.device, dtype=p.dtype))


def _world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _comm_device() -> torch.device:
    """CPU for gloo; the current CUDA device for NCCL (:func:`tsm_ds.engine.comm.dist.collective_device`)."""
    from tsm_ds.engine.comm.dist import collective_device

    return collective_device()


def _gather_varlen(t: torch.Tensor) -> torch.Tensor:
    """all_gather tensors whose first dimension differs per rank; concat in rank order (on CPU)."""
    rank, world = _world()
    if world == 1:
        return t
    dev = _comm_device()
    t = t.to(dev)
    n = torch.tensor([t.shape[0]], dtype=torch.int64, device=dev)
    sizes = [torch.zeros_like(n) for _ in range(world)]
    dist.all_gather(sizes, n)
    sizes = [int(s) for s in sizes]
    pad = torch.zeros((max(sizes),) + tuple(t.shape[1:]), dtype=t.dtype, device=dev)
    pad[: t.shape[0]] = t
    out = [torch.zeros_like(pad) for _ in range(world)]
    dist.all_gather(out, pad.contiguous())
    return torch.cat([o[:s] for o, s in zip(out, sizes)]).cpu()


@torch.no_grad()
def gather_predictions(model, loader, *, forward: Callable | None = None, normalization: tuple | None = None,
                       lost: dict | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Score a (distributed) loader and gather every sample exactly once on every rank.

    Args:
        model: an ``nn.Module`` or DeepSpeed engine; put in eval mode for the pass and restored.
        loader: yields dicts with ``"clip"`` (N, T, 3, H, W) uint8 (or (N, V, T, 3, H, W) with
            views, for a ``forward`` that handles them; a floating clip is taken as normalised),
            ``"label"`` (N,) int and ``"index"`` (N,) int, the dataset index of each sample
            (``VideoClipDataset``'s items). Each batch's clip is moved to the model's device and
            normalised there in float32 (:func:`tsm_ds.data.transforms.normalize_batch`).
        forward: ``forward(model, clip) -> scores (N, num_classes)``, ``clip`` float32 on the
            model's device; default casts the clip to the model's parameter dtype and calls ``model(clip)``.
        normalization: (mean, std); default the loader's dataset's ``normalization``, else ImageNet.
        lost: a dict filled with what was left out, the same on every rank: ``"items"`` (sorted
            dataset indices whose file was unreadable), ``"files"`` (path -> reason of every
            unreadable file those items named, over all ranks; the data-loss budget's numerator)
            and ``"total"`` (distinct indices seen: scored + left out; its denominator).

    Returns:
        (indices int64 (M,), scores float32 (M, num_classes), labels int64 (M,)), sorted by index,
        identical on every rank; M = number of distinct dataset samples seen (the dataset size
        when the sampler covers it), less the items whose file was unreadable (``batch["bad"]`` >
        0: the dataset replaced their clip and label by another video's): those are left out, and a
        RuntimeWarning on rank 0 names them (``lost`` gets them all).

    Raises:
        KeyError: a batch without ``"index"`` (padding could not be removed).
    """
    forward = forward or _default_forward
    mean, std = normalization or getattr(getattr(loader, "dataset", None), "normalization",
                                         (IMAGENET_MEAN, IMAGENET_STD))
    param = next((p for p in model.parameters() if p.is_floating_point()), None)
    dev = param.device if param is not None else None
    was_training = model.training
    model.eval()
    idx_l, sc_l, lab_l = [], [], []
    left: dict[int, dict[str, str]] = {}   # dataset index -> {path: reason} of its unreadable files
    try:
        for batch in loader:
            if "index" not in batch:
                raise KeyError("evaluation batches need an 'index' entry (the dataset index of each "
                               "sample) so that DistributedSampler padding is not counted twice")
            scores = forward(model, normalize_batch(batch["clip"], mean, std, dev)).detach().float().cpu()
            index = torch.as_tensor(batch["index"]).long().reshape(-1)
            label = torch.as_tensor(batch["label"]).long().reshape(-1)
            # an item whose file was unreadable holds another video's clip and label (the dataset's
            # replacement): it is left out, so that no video is scored twice or under another's name
            ok = torch.as_tensor(batch.get("bad", torch.zeros_like(index))).reshape(-1) == 0
            if not bool(ok.all()):
                names = batch.get("bad_files", [""] * len(ok))
                for i, f, o in zip(index.tolist(), [names] if isinstance(names, str) else names, ok.tolist()):
                    if not o:
                        left[int(i)] = parse_bad_files(f) or {f"item {int(i)}": "unreadable (not named)"}
            idx_l.append(index[ok])
            sc_l.append(scores[ok])
            lab_l.append(label[ok])
    finally:
        model.train(was_training)
    if sc_l:
        idx, sc, lab = torch.cat(idx_l), torch.cat(sc_l), torch.cat(lab_l)
    else:
        idx, sc, lab = torch.zeros(0, dtype=torch.int64), torch.zeros(0, 0), torch.zeros(0, dtype=torch.int64)
    # ranks with no batch still need the class count to take part in the gather
    rank, world = _world()
    if world > 1:   # the class count, and whether any rank left an item out (then their names are exchanged)
        c = torch.tensor([sc.shape[1] if sc.numel() else 0, len(left)], dtype=torch.int64, device=_comm_device())
        dist.all_reduce(c, op=dist.ReduceOp.MAX)
        c = c.cpu()
        if sc.shape[1] != int(c[0]):
            sc = torch.zeros(0, int(c[0]))
        if int(c[1]) > 0:
            parts: list = [None] * world
            dist.all_gather_object(parts, left)
            left = {i: f for part in parts for i, f in (part or {}).items()}
    idx, sc, lab = _gather_varlen(idx), _gather_varlen(sc), _gather_varlen(lab)
    order = torch.argsort(idx, stable=True)
    idx, sc, lab = idx[order], sc[order], lab[order]
    keep = torch.ones_like(idx, dtype=torch.bool)
    keep[1:] = idx[1:] != idx[:-1]
    idx, sc, lab = idx[keep], sc[keep], lab[keep]
    files = {p: r for i in sorted(left) for p, r in left[i].items()}
    if left and rank == 0:
        import warnings

        named = "; ".join(f"{i}: {p} ({r})" for i in sorted(left)[:5] for p, r in list(left[i].items())[:1])
        warnings.warn(f"evaluation: {len(left)} item(s) of {len(files)} unreadable file(s) are left out of the "
                      f"scores (index: file (reason) ...): {named}", RuntimeWarning, stacklevel=2)
    if lost is not None:
        lost.update(items=sorted(left), files=files, total=len(set(idx.tolist()) | set(left)))
    return idx, sc, lab


def topk_accuracy(scores: torch.Tensor, labels: torch.Tensor, ks=(1, 5)) -> dict:
    """Top-k accuracy in percent.

    Args:
        scores: (M, num_classes) float.
        labels: (M,) int64.
        ks: the k values; k larger than num_classes counts every sample as correct.

    Returns:
        ``{"top1": float, "top5": float, ..., "count": M}`` (percent in [0, 100]; 0.0 when M == 0).
    """
    m = int(labels.numel())
    out: dict = {"count": m}
    for k in ks:
        if m == 0:
            out[f"top{k}"] = 0.0
            continue
        kk = min(k, scores.shape[1])
        top = scores.topk(kk, dim=1).indices
        out[f"top{k}"] = 100.0 * float((top == labels.view(-1, 1)).any(dim=1).float().mean())
    return out


def sync_batchnorm_stats(module: torch.nn.Module) -> int:
    """All-reduce (mean) the running mean/var of every BatchNorm layer across ranks, in place.

    DeepSpeed broadcasts parameters once and never syncs buffers, so each rank's BN statistics
    drift apart on its own shard; this averages them before evaluation and saving.

    Returns:
        Number of BatchNorm layers synchronised (0 when not distributed).
    """
    rank, world = _world()
    if world == 1:
        return 0
    bufs = [b for m in module.modules()
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.track_running_stats
            and m.running_mean is not None for b in (m.running_mean, m.running_var)]
    if not bufs:
        return 0
    flat = torch.cat([b.detach().float().reshape(-1) for b in bufs])  # one all-reduce
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    flat /= world
    off = 0
    for b in bufs:
        b.copy_(flat[off: off + b.numel()].view_as(b).to(b.dtype))
        off += b.numel()
    return len(bufs) // 2


def precise_bn_stats(module: torch.nn.Module, batches, num_batches: int) -> int:
    """Recompute every BatchNorm layer's running mean / var as the plain average over ``num_batches``
    training batches (PySlowFast's precise BN, ``slowfast/utils/bn_helper.py``, after fvcore's
    ``update_bn_stats``: Wu et al. 2020 evaluate multigrid-trained models with it), in train mode
    without gradients; the layers' momentum is restored afterwards. torch's cumulative average
    (``momentum=None``) does the averaging. Layers the model keeps in eval mode in training (partial
    BN, frozen BatchNorm) are left as they are.

    Args:
        module: the model; batches: an iterable of its inputs, e.g. base-shape clips (N, T, 3, H, W)
            on its device; num_batches: how many to use (fewer when ``batches`` ends first).

    Returns:
        The batches used (0: no BatchNorm layer, or no batch; nothing changed).
    """
    was_training = module.training
    module.train()   # the model's own train(): BatchNorm it keeps frozen (partial BN) stays in eval mode, untouched
    bns = [m for m in module.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)
           and m.training and m.track_running_stats and m.running_mean is not None]
    if not bns or num_batches < 1:
        module.train(was_training)
        return 0
    momenta = [m.momentum for m in bns]
    saved = [(m.running_mean.clone(), m.running_var.clone(), m.num_batches_tracked.clone()) for m in bns]
    for m in bns:
        m.reset_running_stats()
        m.momentum = None   # cumulative average over the batches below
    used = 0
    with torch.no_grad():
        for x in batches:
            if used >= num_batches:
                break
            module(x)
            used += 1
    for m, mom, (mean, var, n) in zip(bns, momenta, saved):
        m.momentum = mom
        if not used:   # nothing seen: the statistics as they were
            m.running_mean.copy_(mean)
            m.running_var.copy_(var)
            m.num_batches_tracked.copy_(n)
    module.train(was_training)
    return used


def validate(engine, loader, dataset=None, *, progress=lambda items: items, select=None) -> dict:
    """BatchNorm statistics averaged over ranks, then top-1 / top-5 (%) and the mean loss of
    ``engine`` on ``loader``, each sample counted once over all ranks; {} without a loader.

    Args:
        engine: the DeepSpeed engine (or a module); loader: the validation loader or None.
        dataset: set to epoch 0 first when it has ``set_epoch`` (deterministic views); its
            ``normalization`` (mean, std) normalises the uint8 clips (default: the loader's dataset's).
        progress: wraps the loader (the trainer's hooks beat per batch).
        select: dataset indices (ints) of the clips ``best_model.pt`` is chosen on
            (:mod:`tsm_ds.engine.loop.cadence`), or None: all the scored clips.

    Returns:
        ``{"top1", "top5", "count", "loss", "select_top1", "lost"}`` (:func:`topk_accuracy`;
        ``select_top1``: the top-1 (%) on the scored clips among ``select``, or ``top1``; ``lost``:
        the unreadable items and files left out, :func:`gather_predictions`), or {}.
    """
    import torch.nn.functional as F

    if loader is None:
        return {}
    sync_batchnorm_stats(getattr(engine, "module", engine))
    if hasattr(dataset, "set_epoch"):
        dataset.set_epoch(0)
    norm = getattr(dataset, "normalization", None) or getattr(getattr(loader, "dataset", None), "normalization", None)
    lost: dict = {}
    idx, scores, labels = gather_predictions(engine, progress(loader), normalization=norm, lost=lost)
    res = topk_accuracy(scores, labels, ks=(1, 5))
    res["lost"] = lost
    if len(labels):
        res["loss"] = float(F.cross_entropy(scores, labels))
    res["select_top1"] = res["top1"]
    if select is not None and len(labels):
        keep = torch.isin(idx, torch.as_tensor(list(select), dtype=torch.int64))
        res["select_top1"] = topk_accuracy(scores[keep], labels[keep], ks=(1,))["top1"]
    return res
