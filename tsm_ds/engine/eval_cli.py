"""``tsm-ds eval``: multi-view evaluation of a checkpoint, on one process or many.

One process::

    tsm-ds eval --checkpoint runs/x/best_model.pt --data ../shared/data --split val \\
        --num-clips 10 --num-crops 3 --out results/x

Several processes (each video is scored once, by one rank; DistributedSampler padding is dropped by
:func:`tsm_ds.engine.evaluate.gather_predictions`)::

    deepspeed --num_gpus 2 tsm_ds/engine/eval_cli.py --checkpoint ... --data ... --out ...
    torchrun --nproc_per_node 2 tsm_ds/engine/eval_cli.py ...          # works the same

Checkpoints (:func:`load_for_inference`): the trainer's exported plain state dict
(``{"state_dict", "model_config", "class_names"}``), a DeepSpeed run/checkpoint directory, or an
official TSM checkpoint file (``TSM_kinetics_RGB_resnet50_shift8_blockres_avg_segment8_e50.pth``;
class names from ``--labels``, e.g. ``kinetics400_labels.txt``).

Views are averaged as logits by default (as the official ``test_models.py``; see
:mod:`tsm_ds.engine.views`); ``--average prob`` averages softmax probabilities.
Results (rank 0 writes them): see :mod:`tsm_ds.engine.eval_report`.
"""
from __future__ import annotations

import argparse
import os
import sys

if __name__ == "__main__" and sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    # run as a script (the deepspeed launcher runs a file): keep tsm_ds/engine/*.py (config.py,
    # evaluate.py, ...) from shadowing top-level modules of the same name
    sys.path.pop(0)
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch

# ---------------------------------------------------------------------------------------------
# checkpoints


@dataclass
class LoadedModel:
    """A model ready for inference (eval mode, float32, CPU) and what describes it.

    Attributes:
        model: the recognizer, float32 (N, T, 3, H, W) -> logits (N, K).
        class_names: K names (from the checkpoint, the ``labels`` file, or ``class_0..``).
        config: ``build_model`` keyword arguments (``model.config``).
        source: ``"state_dict"`` (our exported file), ``"deepspeed"`` (run directory) or ``"official"``.
        path: the checkpoint path given.
        notes: warnings worth printing (e.g. generic class names).
        img_size: crop side (pixels) the model was trained at, when the checkpoint records it
            (our exports and DeepSpeed run directories do; official files do not: None).
    """

    model: torch.nn.Module
    class_names: list[str]
    config: dict
    source: str
    path: str
    notes: list[str] = field(default_factory=list)
    img_size: int | None = None


def _resolve_class_names(names: Sequence[str] | None, labels: str | None, num_classes: int,
                         notes: list[str]) -> list[str]:
    if labels is not None:
        from tsm_ds.data.records import read_label_map

        if not Path(labels).is_file():
            raise FileNotFoundError(f"label map {labels} not found")
        names = read_label_map(labels)
        if len(names) != num_classes:
            raise ValueError(f"label map {labels} has {len(names)} names but the model has {num_classes} "
                             "classes; pass the label map the model was trained with")
        return list(names)
    if names:
        if len(names) != num_classes:
            raise ValueError(f"checkpoint lists {len(names)} class names for {num_classes} model outputs")
        return [str(n) for n in names]
    notes.append(f"no class names in the checkpoint and no --labels file: using class_0..class_{num_classes - 1}")
    return [f"class_{i}" for i in range(num_classes)]


def _torch_load(path: Path, *, trusted: bool = False) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=not trusted)
    except Exception as e:  # a corrupt or foreign file: say which and what it is expected to be
        raise ValueError(f"cannot read checkpoint {path}: {type(e).__name__}: {e}") from e


def _build(config: dict, overrides: dict) -> torch.nn.Module:
    from tsm_ds.models import build_model

    cfg = {**config, **overrides, "pretrained": None}  # weights come from the checkpoint
    return build_model(**cfg)


def _is_official(state: dict) -> bool:
    keys = list(state)
    return any(k.startswith(("module.base_model.", "base_model.")) for k in keys)


def _official_name(path: Path) -> bool:
    """True when the file name follows the official pattern (``TSM_kinetics_RGB_resnet50_...pth``)."""
    import warnings

    from tsm_ds.models import parse_official_name

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            parse_official_name(path)
        return True
    except ValueError as e:
        # an official name with an unsupported option (non-local, Flow): let the loader say so
        return "not an official" not in str(e)


def _deepspeed_model_states(path: Path) -> tuple[Path, dict]:
    """Find and read ``mp_rank_00_model_states.pt`` of a DeepSpeed save directory (or its ``latest`` tag)."""
    if (path / "checkpoints").is_dir() and not (path / "latest").is_file():
        path = path / "checkpoints"  # a trainer run directory: <run dir>/checkpoints/latest
    ckdir = path
    if (path / "latest").is_file():
        ckdir = path / (path / "latest").read_text().strip()
    f = ckdir / "mp_rank_00_model_states.pt"
    if not f.is_file():
        cands = sorted(path.glob("*/mp_rank_00_model_states.pt"), key=lambda p: p.stat().st_mtime)
        if not cands:
            raise FileNotFoundError(
                f"{path} is a directory but holds no DeepSpeed checkpoint (no 'latest' file and no "
                "*/mp_rank_00_model_states.pt); pass the run's checkpoint directory or an exported .pt file")
        f = cands[-1]
        ckdir = f.parent
    # our own trainer's file (DeepSpeed pickles its config and client state): trusted
    return ckdir, _torch_load(f, trusted=True)


def load_for_inference(path: str | os.PathLike, *, labels: str | None = None,
                       **overrides: Any) -> LoadedModel:
    """Load any checkpoint the tools accept, as an eval-mode float32 model on CPU.

    Args:
        path: (1) a file saved by the trainer's export, ``{"state_dict", "model_config",
            "class_names"}``; (2) a DeepSpeed save directory (with ``latest``, or a tag directory
            holding ``mp_rank_00_model_states.pt``; ZeRO-3 shards are consolidated with DeepSpeed's
            ``get_fp32_state_dict_from_zero_checkpoint``), whose client state carries
            ``model_config`` and ``class_names``; (3) an official TSM checkpoint (``state_dict``
            with ``module.base_model.*`` keys; the options come from the official file name, or
            from ``overrides`` with arch= and num_classes=), read by
            ``tsm_ds.models.load_official_checkpoint``.
        labels: label-map file; overrides the checkpoint's class names (needed for official files).
        **overrides: ``build_model`` arguments to change, e.g. ``num_segments=16`` (TSM weights do
            not depend on T) or ``shift="online"`` (a bidirectional checkpoint run uni-directionally
            is a different model: only for checkpoints trained online).

    Returns:
        :class:`LoadedModel`.

    Raises:
        FileNotFoundError: no such file/directory, or a directory without a DeepSpeed checkpoint.
        ValueError: unreadable file, unknown layout, missing ``model_config``, state dict keys that
            do not match the rebuilt model, or class names that do not match the outputs.
        tsm_ds.models.weights.CheckpointError: an official file whose keys do not fit its name.
    """
    p = Path(path)
    notes: list[str] = []
    img_size = None
    if p.is_dir():
        ckdir, states = _deepspeed_model_states(p)
        config = states.get("model_config") or (states.get("client_state") or {}).get("model_config")
        names = states.get("class_names") or (states.get("client_state") or {}).get("class_names")
        img_size = states.get("img_size") or (states.get("client_state") or {}).get("img_size")
        if not config:
            raise ValueError(f"DeepSpeed checkpoint {ckdir} has no 'model_config' in its client state; "
                             "use the run's exported best-model file instead")
        state = states.get("module")
        if not state or any(getattr(v, "numel", lambda: 1)() == 0 for v in state.values()):
            # ZeRO-3 keeps the parameters partitioned in the optimizer shards
            from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
            state = get_fp32_state_dict_from_zero_checkpoint(str(ckdir.parent), tag=ckdir.name)
        model = _build(dict(config), overrides)
        _load_state(model, state, ckdir)
        source = "deepspeed"
    elif p.is_file() and _official_name(p):
        from tsm_ds.models import load_official_checkpoint

        model = load_official_checkpoint(str(p), **overrides)
        names, source = None, "official"
    elif p.is_file():
        payload = _torch_load(p)
        if not isinstance(payload, dict) or "state_dict" not in payload:
            raise ValueError(f"{p}: expected a dict with a 'state_dict' key (tsm_ds export or official TSM "
                             f"checkpoint), found {type(payload).__name__} with keys "
                             f"{sorted(payload)[:8] if isinstance(payload, dict) else '-'}")
        names = payload.get("class_names")
        img_size = payload.get("img_size")
        if "model_config" in payload:
            model = _build(dict(payload["model_config"]), overrides)
            _load_state(model, payload["state_dict"], p)
            source = "state_dict"
        elif _is_official(payload["state_dict"]):
            from tsm_ds.models import load_official_checkpoint

            model = load_official_checkpoint(str(p), **overrides)
            source = "official"
        else:
            raise ValueError(f"{p}: a 'state_dict' without 'model_config', and not an official TSM "
                             "checkpoint (keys module.base_model.*): the model cannot be rebuilt")
    else:
        raise FileNotFoundError(f"checkpoint {p} not found")
    config = dict(getattr(model, "config", {}) or {})
    num_classes = int(config.get("num_classes") or _num_outputs(model))
    class_names = _resolve_class_names(names, labels, num_classes, notes)
    model = model.float().eval()
    return LoadedModel(model=model, class_names=class_names, config=config, source=source,
                       path=str(path), notes=notes, img_size=int(img_size) if img_size else None)


def load_from_args(args: argparse.Namespace, prog: str) -> LoadedModel | None:
    """Load ``--checkpoint`` for a command-line tool (predict, export).

    Applies ``--labels`` and the build overrides, and sets ``args.img_size`` to the size to run at
    (:func:`resolve_img_size`). Returns None after printing ``"{prog}: <reason>"`` to stderr for a
    missing, unreadable or mismatched checkpoint.
    """
    from tsm_ds.models.weights import CheckpointError

    try:
        loaded = load_for_inference(args.checkpoint, labels=args.labels, **checkpoint_overrides(args))
    except (FileNotFoundError, ValueError, CheckpointError) as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return None
    args.img_size = resolve_img_size(args.img_size, loaded)
    return loaded


def resolve_img_size(requested: int | None, loaded: LoadedModel) -> int:
    """The crop side to run a model at: ``--img-size`` when given, else the size the checkpoint was
    trained at (recorded by the trainer), else 224 (the official test size)."""
    if requested:
        return int(requested)
    return int(loaded.img_size or 224)


def _num_outputs(model: torch.nn.Module) -> int:
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    if not linears:
        raise ValueError("cannot tell the number of classes: model.config has no num_classes and no Linear layer")
    return linears[-1].out_features


def _load_state(model: torch.nn.Module, state: dict, where: Path) -> None:
    state = {k[len("module."):] if k.startswith("module.") else k: v for k, v in state.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"{where}: state dict does not match the model rebuilt from its model_config: "
                         f"missing {missing[:5]}{'...' if len(missing) > 5 else ''}, "
                         f"unexpected {unexpected[:5]}{'...' if len(unexpected) > 5 else ''}")


def add_official_args(p: argparse.ArgumentParser) -> None:
    """``--arch`` / ``--num-classes`` for official checkpoints whose file name no longer carries them."""
    g = p.add_argument_group("official checkpoints renamed from TSM_<dataset>_RGB_<arch>_shift8_..._segment8_e50.pth")
    g.add_argument("--arch", default=None, help="backbone (resnet50, mobilenet_v2, ...)")
    g.add_argument("--num-classes", type=int, default=None, help="classes of the checkpoint's head")


def checkpoint_overrides(args: argparse.Namespace) -> dict:
    """``build_model`` overrides from ``--num-segments``, ``--arch``, ``--num-classes`` (those given)."""
    pairs = (("num_segments", getattr(args, "num_segments", None)), ("arch", getattr(args, "arch", None)),
             ("num_classes", getattr(args, "num_classes", None)))
    return {k: v for k, v in pairs if v is not None}


# ---------------------------------------------------------------------------------------------
# data


def _norm(name: str) -> str:
    from tsm_ds.data.records import normalize_class_name

    return normalize_class_name(name).lower()


def map_labels(dataset_classes: Sequence[str] | None, model_classes: Sequence[str]) -> list[int] | None:
    """Map dataset label i to the model's class index by name (``tai_chi`` == ``tai chi``; names
    compared after the official folder-name normalisation, ``normalize_class_name``, and lower case).

    Args:
        dataset_classes: the dataset's class names in label order, or None (a list file with integer
            labels: they are taken to be the model's indices already).
        model_classes: the checkpoint's K class names.

    Returns:
        ``mapping[i]`` = model index of dataset class i, or None when no mapping is needed (same
        names in the same order, or no dataset names).

    Raises:
        ValueError: a dataset class that the model does not know (named in the message).
    """
    if dataset_classes is None or list(dataset_classes) == list(model_classes):
        return None
    index = {_norm(n): i for i, n in enumerate(model_classes)}
    missing = [c for c in dataset_classes if _norm(c) not in index]
    if missing:
        raise ValueError(f"dataset classes {missing} are not among the checkpoint's {len(model_classes)} "
                         "classes; evaluate on the classes the model was trained on (or pass --labels)")
    mapping = [index[_norm(c)] for c in dataset_classes]
    return None if mapping == list(range(len(model_classes))) else mapping


def load_records(args: argparse.Namespace) -> tuple[list, list[str] | None]:
    """The evaluation records and the dataset's class names (None for list files) from the CLI flags.

    ``--list FILE [--root DIR]``: a video list (``path label`` lines); ``--data DIR``: class folders,
    all videos, or with ``--split val|train`` the manifest-based split of ../shared/data/videos.
    Raises ValueError when neither is given or nothing is found.
    """
    from tsm_ds.data import records as rec

    if args.list:
        records = rec.read_video_list(args.list, root=args.root)
        names = None
    elif args.data:
        if args.split:
            train, val, names = rec.split_by_source_group(args.data)
            records = val if args.split == "val" else train
        else:
            records, names = rec.read_class_folders(args.data)
    else:
        raise ValueError("give the videos to evaluate: --data DIR (class folders) or --list FILE")
    if not records:
        raise ValueError(f"no videos found in {args.list or args.data}")
    return list(records), (list(names) if names is not None else None)


# ---------------------------------------------------------------------------------------------
# distributed


def init_distributed_from_env() -> tuple[int, int]:
    """Join the process group when launched by ``deepspeed`` / ``torchrun`` / mpirun (world size > 1).

    Uses ``deepspeed.init_distributed`` (gloo on CPU, nccl on CUDA) and pins each rank to its
    LOCAL_RANK GPU when there are GPUs; on CPU without OMP_NUM_THREADS each rank takes
    cpu_count // local ranks threads. Returns (rank, world size); (0, 1) for a plain process.
    """
    # torchrun / deepspeed's pdsh launcher set WORLD_SIZE; --launcher openmpi sets OMPI_* (then
    # deepspeed.init_distributed discovers ranks through mpi4py)
    world = int(os.environ.get("WORLD_SIZE") or os.environ.get("OMPI_COMM_WORLD_SIZE") or "1")
    if world <= 1:
        return 0, 1
    import torch.distributed as dist

    if not dist.is_initialized():
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        elif "OMP_NUM_THREADS" not in os.environ:
            # ranks sharing a CPU must split its cores (ds_cpu_notes.md: ~10x slower otherwise)
            local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, local)))
        import deepspeed

        deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo")
        from tsm_ds.engine.trainer import release_cpu_shm_at_exit
        release_cpu_shm_at_exit()
    return dist.get_rank(), dist.get_world_size()


# ---------------------------------------------------------------------------------------------
# the command


def build_parser() -> argparse.ArgumentParser:
    """The ``tsm-ds eval`` argument parser."""
    p = argparse.ArgumentParser(prog="tsm-ds eval", description=__doc__.split("\n\n")[0].replace("``", ""),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True,
                   help="exported state dict file, DeepSpeed checkpoint directory, or official TSM .pth")
    p.add_argument("--labels", default=None,
                   help="label map (one class name a line), e.g. kinetics400_labels.txt; "
                        "needed for official checkpoints, overrides the checkpoint's names")
    d = p.add_argument_group("data")
    d.add_argument("--data", default=None,
                   help="class-folder root (<root>/<class>/<video>); with --split, a root holding "
                        "manifest.csv and videos/ (../shared/data)")
    d.add_argument("--split", choices=["train", "val"], default=None,
                   help="with --data: the source-video split of manifest.csv (tsm_ds.data.records."
                        "split_by_source_group)")
    d.add_argument("--list", default=None, help="video list file: '<path> <label>' lines")
    d.add_argument("--root", default=None, help="root that --list paths are relative to")
    v = p.add_argument_group("test protocol")
    v.add_argument("--num-clips", type=int, default=1, choices=[1, 2, 10],
                   help="clips per video: 1 uniform, 2 twice-sample, 10 dense (default 1)")
    v.add_argument("--num-crops", type=int, default=1, choices=[1, 3, 10],
                   help="crops per clip: 1 centre, 3 full-res, 10 corners+centre+flips (default 1)")
    v.add_argument("--sampling", choices=["tsn", "dense"], default=None,
                   help="override the protocol's sampling (default: dense for 10 clips, else tsn)")
    v.add_argument("--num-segments", type=int, default=None, help="T (default: the checkpoint's)")
    v.add_argument("--img-size", type=int, default=None, help="crop size, pixels (default: the size the checkpoint was trained at, else 224)")
    v.add_argument("--average", choices=["logits", "prob"], default="logits",
                   help="average views as logits (default, as the official test code) or probabilities")
    r = p.add_argument_group("run")
    r.add_argument("--batch-size", type=int, default=1, help="videos per rank per step (default 1)")
    r.add_argument("--workers", type=int, default=0, help="DataLoader worker processes per rank")
    r.add_argument("--max-clips", type=int, default=None,
                   help="clips per model call, to bound memory with many views (default: all)")
    r.add_argument("--out", required=True, help="results directory")
    r.add_argument("--no-plot", action="store_true", help="skip confusion.png")
    r.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    add_official_args(p)
    return p


def evaluate(args: argparse.Namespace) -> dict | None:
    """Run the evaluation described by parsed ``tsm-ds eval`` arguments.

    Returns the metrics dict on rank 0 (also written to ``args.out``), None on other ranks.
    Raises ValueError / FileNotFoundError for bad checkpoints or data (see :func:`load_for_inference`).
    """
    from torch.utils.data import DataLoader
    from torch.utils.data.distributed import DistributedSampler

    from tsm_ds.data.dataset import VideoClipDataset
    from tsm_ds.engine.eval_report import write_eval_results
    from tsm_ds.engine.evaluate import gather_predictions
    from tsm_ds.engine.views import MultiViewForward, view_protocol

    rank, world = init_distributed_from_env()
    protocol = view_protocol(args.num_clips, args.num_crops, args.sampling)
    loaded = load_for_inference(args.checkpoint, labels=args.labels, **checkpoint_overrides(args))
    if torch.cuda.is_available():
        loaded.model.cuda()
    num_segments = int(loaded.config.get("num_segments", args.num_segments or 8))
    args.img_size = resolve_img_size(args.img_size, loaded)
    records, ds_names = load_records(args)
    mapping = map_labels(ds_names, loaded.class_names)
    dataset = VideoClipDataset(records, num_segments=num_segments, img_size=args.img_size,
                               **protocol.dataset_kwargs())
    sampler = DistributedSampler(dataset, shuffle=False) if world > 1 else None
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, shuffle=False,
                        num_workers=args.workers)
    if rank == 0:
        for note in loaded.notes:
            print(f"note: {note}", file=sys.stderr)
        print(f"eval: {len(records)} videos, {protocol.describe()}, T={num_segments}, "
              f"{args.img_size}px, average={args.average}, world size {world}", flush=True)
    forward = MultiViewForward(protocol.num_views, args.average, max_clips=args.max_clips)
    indices, scores, labels = gather_predictions(loaded.model, loader, forward=forward)
    if len(indices) != len(dataset):
        raise RuntimeError(f"scored {len(indices)} of {len(dataset)} videos")
    metrics = None
    if rank == 0:
        labels_np = labels.numpy()
        if mapping is not None:
            labels_np = [mapping[i] for i in labels_np]
        meta = {"checkpoint": str(args.checkpoint), "checkpoint_kind": loaded.source,
                "model_config": loaded.config, "protocol": protocol.describe(),
                "num_clips": protocol.num_clips, "num_crops": protocol.num_crops,
                "sampling": protocol.sampling, "num_segments": num_segments, "img_size": args.img_size,
                "world_size": world, "data": args.list or args.data, "split": args.split}
        metrics = write_eval_results(args.out, scores=scores.numpy(), labels=labels_np,
                                     class_names=loaded.class_names,
                                     paths=[str(records[i].path) for i in indices.tolist()],
                                     indices=indices.numpy(), average=args.average, meta=meta,
                                     plot=not args.no_plot)
    if world > 1:
        import torch.distributed as dist

        dist.barrier()
    return metrics


def main(argv: list[str]) -> int:
    """``tsm-ds eval``; returns 0 on success, 2 on bad arguments/checkpoint/data (message on stderr)."""
    args = build_parser().parse_args(argv)
    from tsm_ds.models.weights import CheckpointError

    try:
        metrics = evaluate(args)
    except (FileNotFoundError, ValueError, CheckpointError) as e:
        print(f"tsm-ds eval: {e}", file=sys.stderr)
        return 2
    if metrics is not None:
        print(f"top-1 {metrics['top1']:.2f}%  top-5 {metrics['top5']:.2f}%  "
              f"mean class accuracy {metrics['mean_class_accuracy']:.2f}%  ({metrics['videos']} videos)")
        print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
