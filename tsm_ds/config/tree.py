"""The configuration tree: every option of every command, as typed sections of one dataclass.

A training run is the sections :data:`TRAIN_SECTIONS` (``<run>/config.json`` holds exactly them,
:mod:`tsm_ds.config.record`); the other sections belong to one command each (``eval``, ``predict``,
``export``, ``plan`` for ``tsm-ds config``, the tools of :mod:`tsm_ds.config.tools`). Fields shared by
several commands are defined once (``model.arch``, ``model.num_segments``, ``data.img_size``,
``engine.deepspeed_config``): a command that means something else by default (None = "what the
checkpoint says") says so in its :class:`~tsm_ds.config.fields.Command`, not with a second field.

Defaults are the official TSM Kinetics recipe (mit-han-lab/temporal-shift-module, ``opts.py``
and the paper, Sec. 4.1 / Appendix): resnet50, 8 segments, shift_div 8, blockres, dropout 0.5,
224 px, 50 epochs with x0.1 steps at epochs 20 and 40; engine-JSON values (batch, lr, weight decay,
clipping, warm-up) are None = "the recipe's, or its ``"auto"`` rule" (:mod:`tsm_ds.engine.config.resolve`).

Adding an option: docs/contributing.md, "Adding an option" (one :func:`~tsm_ds.config.fields.opt` field in
its section here, or in :mod:`tsm_ds.config.tools` for a tool's own option).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from tsm_ds.config.cadence import check_eval_every
from tsm_ds.config.fields import opt
from tsm_ds.config.tools import (
    BenchAllConfig,
    BenchCommConfig,
    BenchDataConfig,
    BenchLargeBatchConfig,
    BenchModelsConfig,
    BenchMultigridConfig,
    BenchScaleConfig,
    CheckVideosConfig,
    ClusterCheckConfig,
    DemoConfig,
    DoctorConfig,
    PrepareConfig,
)

__all__ = ["Config", "DataConfig", "ModelConfig", "EngineConfig", "ScheduleConfig", "GuardConfig",
           "DistributedConfig", "OutputConfig", "LoggingConfig", "DebugConfig", "CheckpointConfig",
           "ViewsConfig", "EvalConfig", "PredictConfig", "ExportConfig", "PlanConfig", "ModelsTableConfig",
           "TRAIN_SECTIONS", "SHIFT_CHOICES", "DATASET_CHOICES", "MULTIGRID_CHOICES"]

SHIFT_CHOICES = ("bidirectional", "online", "none")

#: ``--multigrid`` values (:data:`tsm_ds.engine.loop.multigrid.MODES`, tested equal; the config layer does not
#: import the engine)
MULTIGRID_CHOICES = ("none", "long", "short", "long+short")


def _multigrid_mode(text: str) -> str:
    """``--multigrid``'s converter: one of :data:`MULTIGRID_CHOICES`."""
    if text not in MULTIGRID_CHOICES:
        raise ValueError(f"--multigrid {text!r}: choose one of {', '.join(MULTIGRID_CHOICES)}")
    return text


#: ``--precise-bn-batches`` with ``--multigrid`` when not given (PySlowFast's ``BN.NUM_BATCHES_PRECISE``)
PRECISE_BN_DEFAULT = 200


def _at_least(flag: str, low: float, kind: type) -> object:
    def conv(text: str):
        v = kind(text)
        if not v >= low:
            raise ValueError(f"{flag} {text}: must be >= {low}")
        return v
    conv.__name__ = kind.__name__
    return conv


def _positive_float(text: str) -> float:
    v = float(text)
    if not v > 0:
        raise ValueError(f"--multigrid-epoch-factor {text}: must be > 0")
    return v


#: the ``--dataset`` names (:data:`tsm_ds.data.datasets.DATASET_NAMES`, tested equal; the config layer
#: does not import the data layer)
DATASET_CHOICES = ("somethingv1", "somethingv2", "jester", "ucf101", "hmdb51", "kinetics400", "kinetics600",
                   "kinetics700")


@dataclass
class DataConfig:
    """Where clips come from and how they are cut (:mod:`tsm_ds.data.splits`, :mod:`tsm_ds.data.dataset`)."""

    data: str | None = opt(None, "a folder holding manifest.csv (../shared/data) or its videos/ folder, class "
                           "folders under train/ + val/, or a class-per-folder tree (per-class hold-out); a shard "
                           "folder or s3://bucket/prefix (tsm-ds prepare --shards); with list "
                           "files, the root their paths are relative to; with --dataset, the dataset's folder (its "
                           "annotation files and videos, or a folder tsm-ds prepare --dataset wrote)",
                           env="TSM_DS_DATA")
    dataset: str | None = opt(None, "read a distributed dataset from its own annotation files under --data, with "
                              "its split and flip rule (docs/datasets.md)", choices=DATASET_CHOICES)
    dataset_split: int | None = opt(None, "the numbered split of --dataset ucf101 / hmdb51 (default 1)",
                                    choices=(1, 2, 3))
    frame_template: str | None = opt(None, "file name of frame N in the frame folders of --dataset somethingv1 / "
                                     "jester, a Python format of N (default {:05d}.jpg, as released)")
    train_list: str | None = opt(None, "list file of training clips: 'path label' per line")
    val_list: str | None = opt(None, "list file of validation clips")
    classes: str | None = opt(None, "class names, one per line (line = label): the names of list-file labels, "
                              "the label order of class folders, or the label map of --dataset kinetics400/600/700")
    val_fraction: float = opt(0.2, "per-class hold-out for --data trees without train/ val/ folders")
    img_size: int | None = opt(224, "crop side in pixels")
    flip: bool = opt(True, "no horizontal flip (direction-sensitive classes)", flag="--no-flip")
    num_workers: int | None = opt(None, "DataLoader worker processes per rank (default: 2 on the CPU; on GPUs the "
                                  "node's cores per local rank minus one, 2-12, with pinned memory and persistent "
                                  "workers)")
    index_cache: str | None = opt(None, "also keep the per-file frame indexes on disk in this folder, shared by "
                                  "workers and runs (default: in memory only)", env="TSM_DS_INDEX_CACHE")
    index_cache_size: int = opt(8192, "frame indexes kept in memory per process", env="TSM_DS_INDEX_CACHE_SIZE")
    malloc_trim: bool = opt(True, "return freed heap to the system after every item (glibc malloc_trim; "
                            "docs/performance.md: memory in long epochs)", flag="--no-malloc-trim",
                            env="TSM_DS_MALLOC_TRIM")
    cache_decoded: bool = opt(False, "decode every video once before training and keep its frames in memory "
                              "(frame sampling, crops and flips are still drawn per epoch); for small datasets")
    cache_decoded_max_mb: float = opt(4096.0, "size limit of --cache-decoded per rank (MiB of decoded frames); "
                                      "videos beyond it are decoded per clip")
    decode_device: str | None = opt(None, "decode packed JPEG frames in whole batches on this device (cpu: the main "
                                    "process; cuda: nvJPEG on the GPU) instead of in the DataLoader workers (default); "
                                    "packed data only (tsm-ds prepare)", choices=("cpu", "cuda"))
    shard_cache: str | None = opt(None, "local cache folder of remote shards (--data s3://...; default: a folder "
                                  "under the system's temporary folder named after the URL)")
    shard_cache_mb: float = opt(20480.0, "size bound of that cache in MiB (litdata evicts the oldest chunks beyond it)")
    max_bad_fraction: float = opt(0.01, "data-loss budget: the share of a split's files that may be unreadable "
                                  "(replaced by other samples in training, left out of evaluation); past it the run "
                                  "stops with exit 7 naming the files (0: any unreadable file stops it; 1: no limit)")
    demo_clips: int = opt(48, "training clips per class of the generated demo dataset (used only without data)")


@dataclass
class ModelConfig:
    """The recognizer (:func:`tsm_ds.models.build_model`)."""

    arch: str | None = opt("resnet50", "resnet18/34/50/101, mobilenet_v2, i3d_resnet50 (non-local paper / "
                           "mmaction2 layout), i3d_resnet50_release (released non-local code)")
    num_classes: int | None = opt(None, "classes of the fc head (training: from the data)")
    num_segments: int | None = opt(8, "T, frames per clip")
    shift: str | None = opt("bidirectional", "temporal shift (none = TSN)", choices=SHIFT_CHOICES)
    shift_div: int | None = opt(8, "1/shift_div of the channels move per direction")
    shift_place: str | None = opt("blockres", "where the shift sits in a residual block",
                                  choices=("blockres", "block"))
    temporal_pool: bool | None = opt(False, "temporal max pooling before layer2 (ResNets)")
    dropout: float | None = opt(0.5, "dropout before the head")
    partial_bn: bool = opt(False, "freeze BatchNorm statistics except the first layer (official --partialbn)")
    pretrained: str | None = opt(None, "torchvision ImageNet state dict file for the backbone")
    tune_from: str | None = opt(None, "weights to start from: an export (RUN/best_model.pt), a run dir, its "
                                "checkpoints/ dir (the 'latest' tag), a tag dir (ZeRO-3 too), or an official TSM "
                                "file; the head is replaced when the class count differs")
    fused_shift: bool = opt(True, "use the out-of-place reference shift instead of the fused in-place one",
                            flag="--no-fused-shift", env="TSM_DS_FUSED_SHIFT")
    channels_last: bool = opt(False, "feed the clips channels-last per frame (the convolutions then run "
                              "channels-last; parameters stay as they are)")
    compile: bool = opt(False, "torch.compile the model through DeepSpeed's engine.compile() (inductor; on CPU it "
                        "needs a C++ compiler; minutes of compiling in the first batches)")
    zero_init_residual: str = opt("auto", "zero-init the last BatchNorm gamma of every residual block (Goyal et al. "
                                  "2017): on, off, or auto (the recipe's tsm_ds.zero_init_residual; never over "
                                  "--pretrained / --tune-from weights)", choices=("auto", "on", "off"))
    ghost_bn_clips: int | None = opt(None, "BatchNorm statistics over groups of this many clips inside a larger "
                                     "micro-batch (ghost BatchNorm; the paper: 8 clips per GPU); default: over the "
                                     "micro-batch")

    def build_options(self) -> dict:
        """The keyword options of :func:`tsm_ds.models.build_model` besides arch and classes
        (``shift`` None for TSN)."""
        return {"num_segments": self.num_segments, "shift": None if self.shift == "none" else self.shift,
                "shift_div": self.shift_div, "shift_place": self.shift_place,
                "temporal_pool": bool(self.temporal_pool), "dropout": self.dropout, "partial_bn": self.partial_bn}


@dataclass
class EngineConfig:
    """The engine recipe (:mod:`tsm_ds.engine.config.recipes`; its ``"auto"`` values:
    :mod:`tsm_ds.engine.config.resolve`)."""

    deepspeed_config: str | None = opt(None, "engine JSON: a path or a shipped recipe name (cpu_fp32, gpu_fp16, ...; "
                                       "default cpu_fp32 without CUDA, else gpu_fp16)", flag="--deepspeed_config",
                                       aliases=("--deepspeed-config",))
    deepspeed: bool = opt(False, "accepted for DeepSpeed's launcher conventions; no effect", hidden=True,
                          record=False)


@dataclass
class ScheduleConfig:
    """Length of training and the engine-JSON values a flag may fill where the JSON says "auto"."""

    epochs: int = opt(50, "planned epochs (the lr schedule's horizon)")
    max_steps: int | None = opt(None, "stop after this many optimizer steps")
    seed: int = opt(0, "data order, augmentation and dropout seed")
    batch_size: int | None = opt(None, "global batch (train_batch_size)")
    micro_batch_size: int | None = opt(None, "clips per rank per micro-batch")
    grad_accum: int | None = opt(None, "gradient_accumulation_steps")
    lr: float | None = opt(None, "lr for the global batch (skips the scaling rule)")
    weight_decay: float | None = opt(None, "weight decay (recipe default 1e-4)")
    clip_grad: float | None = opt(None, "gradient_clipping (recipe default 20)")
    warmup_steps: int | None = opt(None, "linear warm-up in optimizer steps (default: --warmup-epochs)")
    warmup_epochs: float | None = opt(None, "linear warm-up in epochs (default: the recipe's warmup_epochs, else 5 "
                                      "epochs whenever a scaling rule raises the lr, at most a quarter of the run, "
                                      "as Goyal et al. 2017; else none)")
    head_lr_mults: str = opt("auto", "the official fc lr x5 / fc bias x10 for a new head: on, off, or auto (on with "
                             "--pretrained or --tune-from, off from scratch, as the official code uses them for a "
                             "new head on ImageNet weights)", choices=("auto", "on", "off"))
    lr_steps: list[float] | None = opt(None, "step-decay epochs (recipe default 20 40)")
    eval_every: str = opt("epoch", "validation cadence: 'epoch' (after every epoch), N (after every N-th optimizer "
                          "step) or a fraction of an epoch between 0 and 1 (0.25: four times per epoch); the end "
                          "of the run is always evaluated on the whole validation set", parse=check_eval_every)
    eval_max_clips: int | None = opt(None, "intermediate evaluations score a fixed seeded subset of this many "
                                     "validation clips (the same every time; the final one: the whole set)")
    multigrid: str = opt("none", "multigrid shape schedule (Wu et al. 2020, PySlowFast's defaults): long: per lr "
                         "stage, clips of T/4, T/2, T/2, T frames at crops S/sqrt2, S/sqrt2, S, S with the global "
                         "batch x8, x4, x2, x1 and the lr x the batch factor; short: crops S/2, S/sqrt2, S step by "
                         "step at batch x4, x2, x1 (docs/multigrid.md; needs a stepwise lr recipe; BatchNorm over "
                         "groups of the base micro-batch's clips)", choices=MULTIGRID_CHOICES, parse=_multigrid_mode)
    multigrid_final_stage: bool = opt(True, "train the last lr stage at the base shape (PySlowFast's fine-tuning "
                                      "phase); --no-multigrid-final-stage: the long cycle runs there too",
                                      nargs="bool")
    multigrid_min_frames: int = opt(2, "the fewest frames per clip of a multigrid shape (classes that need motion "
                                    "need 2 or more)", parse=_at_least("--multigrid-min-frames", 1, int))
    multigrid_epoch_factor: float = opt(1.5, "a multigrid schedule trains --epochs x this many epochs (PySlowFast's "
                                        "EPOCH_FACTOR: more epochs, fewer optimizer steps)", parse=_positive_float)
    eval_batch_size: int | None = opt(None, "clips per rank per validation batch (default: the micro-batch)")
    precise_bn_batches: int | None = opt(None, "BatchNorm statistics recomputed before each evaluation over this "
                                         "many training micro-batches at the base shape (PySlowFast's "
                                         "NUM_BATCHES_PRECISE; default: 200 with --multigrid, off without; a value "
                                         "given applies to any run, so a one-shape base is evaluated alike; 0: off)",
                                         parse=_at_least("--precise-bn-batches", 0, int))

    def precise_bn(self) -> int:
        """Micro-batches of precise BatchNorm before each evaluation: ``precise_bn_batches`` when given,
        else :data:`PRECISE_BN_DEFAULT` with a multigrid schedule and 0 (off) without."""
        if self.precise_bn_batches is not None:
            return int(self.precise_bn_batches)
        return PRECISE_BN_DEFAULT if self.multigrid != "none" else 0

    def multigrid_options(self) -> dict:
        """The keyword options of :func:`tsm_ds.engine.loop.multigrid.build_schedule` these fields give
        (mode, final_stage, min_frames, epoch_factor); the shape, batch, epochs and lr steps come from the
        run's resolved values."""
        return {"mode": self.multigrid, "final_stage": bool(self.multigrid_final_stage),
                "min_frames": int(self.multigrid_min_frames), "epoch_factor": float(self.multigrid_epoch_factor)}

    def engine_flags(self) -> dict:
        """``{FLAG_KEYS name: value or None}``: the ``flags`` of :func:`tsm_ds.engine.config.resolve.resolve_config`."""
        return {"batch_size": self.batch_size, "micro_batch_size": self.micro_batch_size,
                "grad_accum": self.grad_accum, "lr": self.lr, "weight_decay": self.weight_decay,
                "clip_grad": self.clip_grad, "warmup_steps": self.warmup_steps, "warmup_epochs": self.warmup_epochs,
                "lr_steps": self.lr_steps}


@dataclass
class GuardConfig:
    """Run guards (:mod:`tsm_ds.engine.guards.divergence`): a diverged run stops before its update (exit 3)."""

    on_divergence: str = opt("stop", "stop: exit 3 naming the step, lr, loss and the last good checkpoint; "
                             "rollback: reload the last good checkpoint, multiply every lr by --rollback-lr-factor, "
                             "go on", choices=("stop", "rollback"))
    rollback_lr_factor: float = opt(0.5, "lr multiplier per rollback")
    max_rollbacks: int = opt(3, "rollbacks before the run stops anyway")
    divergence_factor: float = opt(10.0, "a step whose loss exceeds this multiple of max(running median loss, "
                                   "ln(classes)) diverged (0: off)")
    max_skipped_steps: int = opt(20, "this many skipped updates in a row (fp16 overflow, non-finite bf16 "
                                 "gradients) stop the run (0: off)")
    stuck_factor: float = opt(3.0, "a run whose loss stays above this multiple of ln(classes) (chance) for "
                              "--stuck-steps optimizer steps in a row after the lr warm-up is stuck: it stops as "
                              "diverged (0: off)")
    stuck_steps: int = opt(20, "optimizer steps in a row above --stuck-factor x ln(classes) that stop a stuck run")


@dataclass
class DistributedConfig:
    """Ranks, fail-fast limits, stop signal and the hang watchdog."""

    local_rank: int | None = opt(None, "set by the deepspeed launcher", flag="--local_rank",
                                 aliases=("--local-rank",), hidden=True, record=False)
    dist_timeout: float = opt(300.0, "seconds for every rank to join (else every rank stops, naming the missing "
                              "ranks and hosts; exit 5) and for every collective", env="TSM_DS_DIST_TIMEOUT")
    hosts: tuple[str, ...] = opt((), "the hostfile's hosts in node order (names a missing rank's host; set by the "
                                 "launch scripts)", parse=lambda t: tuple(x for x in t.split(",") if x),
                                 env="TSM_DS_HOSTS", hidden=True, record=False)
    stop_signal: str = opt("SIGUSR1", "on this signal, save a checkpoint at the next optimizer step and exit 75 "
                           "(SLURM --signal=USR1@120); 'none' to disable")
    step_timeout: float = opt(1800.0, "seconds without progress (an optimizer step, an eval batch, a checkpoint "
                              "write) before the hang watchdog stops the run: every rank writes its stacks to "
                              "RUN/stacks/, exit 6 (0: off)")
    device: str = opt("auto", "auto: CUDA where this rank's node has a usable GPU, else the CPU; a node with GPUs "
                      "but no usable CUDA, DS_ACCELERATOR=cpu on a GPU node or a CUDA recipe (fp16, FusedLamb, "
                      "gpu_*) without CUDA stop with the reason; cpu: the CPU on purpose; cuda: CUDA or stop",
                      choices=("auto", "cpu", "cuda"))
    startup_timeout: float = opt(3600.0, "seconds from set-up (op builds, deepspeed.initialize, resume) to the end "
                                 "of the first optimizer step (0: off)")


@dataclass
class OutputConfig:
    """Where the run is written and how it is checkpointed (:mod:`tsm_ds.engine.checkpoint.manager`)."""

    output_dir: str = opt("runs", "runs are written to OUTPUT_DIR/RUN_NAME")
    run_name: str | None = opt(None, "default: <arch>_T<segments>_<engine json name>")
    resume: str | None = opt(None, "'auto': continue from the latest complete checkpoint of the run dir (fresh "
                             "start when there is none); or a checkpoint tag. Another number of ranks keeps the "
                             "global batch by accumulation", record=False)
    save_every_steps: int = opt(0, "also save every N optimizer steps")
    keep_last: int = opt(2, "complete checkpoints kept besides the best")
    config: str | None = opt(None, "rerun a run: RUN/config.json (written by an earlier run); flags given "
                             "after it override its fields", record=False)


@dataclass
class LoggingConfig:
    """What the run shows while it runs."""

    progress: bool = opt(True, "no tqdm bar", flag="--no-progress")


@dataclass
class DebugConfig:
    """Test hooks (hidden from ``--help``; faults injected on purpose; not recorded in config.json:
    a rerun or a resume does not inject them again)."""

    inject_nan_at_step: int | None = opt(None, "the loss of this optimizer step becomes NaN", hidden=True,
                                         record=False)
    inject_nan_rank: int = opt(0, "the rank whose loss becomes NaN", hidden=True, record=False)
    inject_signal_at_step: int | None = opt(None, "that rank sends itself the stop signal after this step",
                                            hidden=True, record=False)
    inject_signal_rank: int = opt(0, "the rank that signals itself", hidden=True, record=False)
    test_hang: str | None = opt(None, "'<rank>:<step>[:<seconds>]': that rank sleeps in that optimizer step (the hang "
                                "watchdog's test)", hidden=True, env="TSM_DS_TEST_HANG", record=False)


@dataclass
class CheckpointConfig:
    """A checkpoint to read (:func:`tsm_ds.inference.loading.load_for_inference`)."""

    checkpoint: str | None = opt(None, "exported state dict (.pt), DeepSpeed run or checkpoint directory, or "
                                 "official TSM .pth")
    labels: str | None = opt(None, "label map, one class name a line (e.g. kinetics400_labels.txt); needed for "
                             "official checkpoints, overrides the checkpoint's names")
    trust_checkpoint: bool = opt(False, "load a checkpoint file that weights-only loading refuses (it asks to "
                                 "unpickle a class or function besides tensors and the DeepSpeed classes tsm_ds's "
                                 "recipes save) with full unpickling, which runs any code the file holds: only for "
                                 "checkpoints whose origin you know (--tune-from, --resume, eval, predict, export)",
                                 record=False)


@dataclass
class ViewsConfig:
    """The test protocol (official ``test_models.py``; :mod:`tsm_ds.inference.views`)."""

    num_clips: int = opt(1, "clips per video: 1 uniform, 2 twice-sample, 10 dense", choices=(1, 2, 10))
    num_crops: int = opt(1, "crops per clip, as the official --test_crops: 1 centre, 3 left/right/centre, "
                         "5 corners+centre, 10 corners+centre+flips. Deprecated: 3 without --full-res/"
                         "--no-full-res still means full-res 3 crops (the old meaning)", choices=(1, 3, 5, 10))
    full_res: bool | None = opt(None, "crops of side scale_size (256 for 224) instead of --img-size, as the "
                                "official --full_res (default: off, on for --num-crops 3)")
    resize: str = opt("box", "val/test scaling: box (one resized crop per view, faster) or official (short side to "
                      "scale_size with bilinear on uint8, then crop, as GroupScale + GroupCenterCrop)",
                      choices=("box", "official"))
    sampling: str | None = opt(None, "override the protocol's sampling (default: dense for 10 clips, else tsn)",
                               choices=("tsn", "dense"))
    average: str = opt("logits", "average views as logits (as the official test code) or probabilities",
                       choices=("logits", "prob"))


@dataclass
class EvalConfig:
    """``tsm-ds eval``'s own options (:mod:`tsm_ds.inference.evaluate`)."""

    split: str | None = opt(None, "side of the split to evaluate; default: val for a manifest, train/ + val/ "
                            "folders or the run's config.json, all for a plain class-folder tree",
                            choices=("train", "val", "all"))
    list: str | None = opt(None, "video list file: '<path> <label>' lines")
    root: str | None = opt(None, "root that --list paths are relative to")
    batch_size: int = opt(1, "videos per rank per step")
    workers: int = opt(0, "DataLoader worker processes per rank")
    max_clips: int | None = opt(None, "clips per model call, to bound memory with many views (default: all)")
    out: str | None = opt(None, "results directory")
    plot: bool = opt(True, "skip confusion.png", flag="--no-plot")


@dataclass
class PredictConfig:
    """``tsm-ds predict``'s own options (:mod:`tsm_ds.inference.predict`)."""

    videos: list[str] = opt(None, "video files", positional=True, nargs="+", metavar="VIDEO", factory=list)
    top_k: int = opt(5, "classes shown per video")
    online: bool = opt(False, "stream frames through the online (uni-directional) TSM and print the running "
                       "prediction")
    window: int = opt(12, "online: frames in the running average")
    stride: int = opt(2, "online: use every n-th frame")
    every: int = opt(1, "online: print every n steps (0: final only)")
    max_frames: int | None = opt(None, "online: stop after this many steps")
    json: str | None = opt(None, "also write all predictions to this JSON file")


@dataclass
class ExportConfig:
    """``tsm-ds export``'s own options (:mod:`tsm_ds.inference.export`)."""

    out: str | None = opt(None, "output directory")
    name: str = opt("model", "file stem")
    formats: list[str] = opt(None, "output formats", choices=("pt2", "onnx"), factory=lambda: ["pt2", "onnx"])
    online: bool = opt(False, "export the online model's single step with explicit shift caches")
    batch_size: int = opt(2, "example batch size (the exported batch dim is dynamic unless --static-batch)")
    static_batch: bool = opt(False, "fix the batch size instead of a dynamic dim")
    atol: float = opt(1e-4, "absolute tolerance of the check against PyTorch")
    rtol: float = opt(1e-5, "tolerance relative to max|output|")
    opset: int | None = opt(None, "ONNX opset (default: the exporter's)")


@dataclass
class PlanConfig:
    """``tsm-ds config``'s own options: the job being planned."""

    world_size: int | None = opt(None, "data-parallel ranks (nodes x ranks per node)")
    train_samples: int | None = opt(None, "clips in the training set (Kinetics-400: ~240000)")
    device: str | None = opt(None, "device to validate the recipe for (default: the recipe's: fp16, CUDA-only "
                             "optimizers and gpu_* recipes are checked for cuda, others for this machine)",
                             choices=("cpu", "cuda"))
    resume_from: str | None = opt(None, "resolve as --resume auto of this run would on --world-size ranks (its "
                                  "checkpoint's global batch kept)", metavar="RUN_DIR")
    json: bool = opt(False, "print one JSON document instead of the report")


@dataclass
class ModelsTableConfig:
    """``tsm-ds models``' own options."""

    json: str | None = opt(None, "also write the rows to this JSON file")


@dataclass
class Config:
    """The whole tree. A training run is :data:`TRAIN_SECTIONS`; the rest are commands' own sections."""

    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    guard: GuardConfig = field(default_factory=GuardConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    debug: DebugConfig = field(default_factory=DebugConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    views: ViewsConfig = field(default_factory=ViewsConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    predict: PredictConfig = field(default_factory=PredictConfig)
    export: ExportConfig = field(default_factory=ExportConfig)
    plan: PlanConfig = field(default_factory=PlanConfig)
    models: ModelsTableConfig = field(default_factory=ModelsTableConfig)
    bench_models: BenchModelsConfig = field(default_factory=BenchModelsConfig)
    bench_data: BenchDataConfig = field(default_factory=BenchDataConfig)
    bench_comm: BenchCommConfig = field(default_factory=BenchCommConfig)
    bench_scale: BenchScaleConfig = field(default_factory=BenchScaleConfig)
    bench_large_batch: BenchLargeBatchConfig = field(default_factory=BenchLargeBatchConfig)
    bench_multigrid: BenchMultigridConfig = field(default_factory=BenchMultigridConfig)
    bench_all: BenchAllConfig = field(default_factory=BenchAllConfig)
    demo: DemoConfig = field(default_factory=DemoConfig)
    doctor: DoctorConfig = field(default_factory=DoctorConfig)
    cluster: ClusterCheckConfig = field(default_factory=ClusterCheckConfig)
    prepare: PrepareConfig = field(default_factory=PrepareConfig)
    check_videos: CheckVideosConfig = field(default_factory=CheckVideosConfig)


#: the sections of a training run: what ``<run>/config.json`` records and ``--config`` reruns
TRAIN_SECTIONS = ("data", "model", "engine", "schedule", "guard", "distributed", "output", "logging", "debug")
