"""The tools' own sections of the configuration tree (benchmarks, demo, doctor, prepare,
check-videos) and their commands: one dataclass per command, fields made with
:func:`tsm_ds.config.fields.opt`, one :class:`~tsm_ds.config.fields.Command` per command line
(``tsm_ds.cli.<tool>.build_parser()`` is ``build_parser(SPEC, Config)``).

Options a tool shares with training (``--data``, ``--arch``, ``--img-size``, ``--num-segments``,
``--deepspeed_config``, ``--seed``, ``--epochs``, ...) are NOT declared here: the tool's
:class:`~tsm_ds.config.fields.Command` lists the shared field (``"model.arch"``) and may change its
default (the demo trains resnet18 at 64 px). Only options that mean something else get a field here
(``bench models --frames``: frames of the benchmarked clips, not a training run's).

This module is in the bottom layer: it imports nothing else of the package, so the defaults that
mirror library constants (the loaders of ``bench data``, the paper's figures of ``bench scale``, the
study's values of ``bench large-batch``) are written out here and tested equal to them
(``tests/config/test_tool_commands.py``).

Kept as one file on purpose: it is the single place where the tools' own options are declared
(one short dataclass and one command per tool), and the tests compare it as a whole against the
library's constants.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from tsm_ds.config.fields import Command, field_infos, opt

__all__ = ["BenchModelsConfig", "BenchDataConfig", "BenchCommConfig", "BenchScaleConfig", "BenchLargeBatchConfig",
           "BenchMultigridConfig", "BenchAllConfig", "DemoConfig", "DoctorConfig", "ClusterCheckConfig",
           "PrepareConfig", "CheckVideosConfig", "BENCH_MODELS", "BENCH_DATA", "BENCH_COMM", "BENCH_SCALE",
           "BENCH_LARGE_BATCH", "BENCH_MULTIGRID", "BENCH_ALL", "DEMO", "DOCTOR", "PREPARE", "CHECK_VIDEOS",
           "TOOL_COMMANDS", "command_values", "split_strs", "split_ints", "split_floats"]


def split_strs(text: str) -> tuple[str, ...]:
    """``"a, b,,c"`` -> ``("a", "b", "c")``: a comma-separated option (blanks dropped)."""
    return tuple(x.strip() for x in text.split(",") if x.strip())


def split_ints(text: str) -> tuple[int, ...]:
    """A comma-separated list of integers.

    Raises:
        ValueError: an item that is not an integer (argparse reports it as an invalid value).
    """
    return tuple(int(x) for x in split_strs(text))


def split_floats(text: str) -> tuple[float, ...]:
    """A comma-separated list of numbers.

    Raises:
        ValueError: an item that is not a number (argparse reports it as an invalid value).
    """
    return tuple(float(x) for x in split_strs(text))


#: parallel processes of prepare / check-videos by default
_WORKERS = min(4, os.cpu_count() or 1)


# ------------------------------------------------------------------------------------------------
# bench models / data / comm / scale / large-batch / all


@dataclass
class BenchModelsConfig:
    """``tsm-ds bench models`` (:func:`tsm_ds.bench.models.run_models_bench`); the zoo's frame side
    is ``data.img_size``, its classes ``model.num_classes``."""

    batch: int = opt(2, "clips per step")
    frames: int = opt(8, "TSM/TSN frames per clip")
    video_frames: int = opt(16, "frames per clip for r2plus1d_18 / r3d_18 / s3d")
    reps: int = opt(5, "interleaved repetitions (median of these)")
    shift_sizes: tuple[int, ...] = opt((112, 224), "comma-separated image sizes of the TSM/TSN shift-overhead "
                                       "comparison", parse=split_ints)
    shift_batch: int | None = opt(None, "batch of that comparison (default --batch)")
    models: tuple[str, ...] | None = opt(None, "comma-separated subset of the zoo labels", parse=split_strs)
    skip: tuple[str, ...] = opt((), "comma-separated parts to skip: zoo,overhead,op", parse=split_strs)
    threads: int | None = opt(None, "torch intra-op threads (default: torch's). On a shared CPU use 1: "
                              "busy-waiting OpenMP threads that lose their core made a 2-thread ResNet-50 step "
                              "4-9x slower than 1 thread here")
    out_dir: str = opt("bench_out", "output directory", aliases=("--out",))
    quick: bool = opt(False, "reduced size for a CPU (~2-3 min): 112 px zoo, batch 1, 8-frame video models, shift "
                      "overhead at 112 and 224 px with batch 1 (5 reps), model zoo with 3 reps, 1 thread")


#: every loader of ``tsm_ds.bench.data`` (:data:`tsm_ds.bench.data.LOADERS`), in table order
#: the formats of ``tsm_ds.bench.data_formats.FORMATS``
BENCH_DATA_FORMATS = ("raw", "video", "frames", "packed")
BENCH_DATA_LOADERS = ("tsm_ds", "tsm_ds_short256", "decode_all", "torchcodec_exact", "torchcodec_approx", "decord")


@dataclass
class BenchDataConfig:
    """``tsm-ds bench data`` (:func:`tsm_ds.bench.data.run_data_bench`); the real clips are
    ``data.data`` (``$TSM_DS_DATA``, else ../shared/data/videos)."""

    out_dir: str = opt("bench_out", "where data.json / data.md go")
    quick: bool = opt(False, "1-minute generated video, 3 repetitions; format table: 2-s clips, 3 real clips, "
                             "1 repetition")
    reps: int | None = opt(None, "repetitions (default 5; quick 3)")
    minutes: float | None = opt(None, "generated video length (default 5; quick 1)")
    cache: str | None = opt(None, "folder for the generated videos (default <out-dir>/bench_videos)")
    loaders: tuple[str, ...] = opt(BENCH_DATA_LOADERS, "comma-separated; tsm_ds_short256 scales frames to a short "
                                   "side of 256 while converting (what VideoClipDataset does in val/test)",
                                   parse=split_strs)
    formats: tuple[str, ...] = opt(BENCH_DATA_FORMATS, "comma-separated formats of the format table (raw: the "
                                   "videos as they are; video / frames / packed: tsm-ds prepare --mode); empty: "
                                   "no format table", parse=split_strs)
    seconds: float | None = opt(None, "length of the generated Kinetics-like clips of the format table "
                                      "(default 10; quick 2)")
    format_clips: int | None = opt(None, "real clips in the format table (default all; quick 3)")


#: the all-reduce variants of ``tsm_ds.bench.comm`` (:data:`tsm_ds.bench.comm.METHODS`)
COMM_METHODS = ("fp32", "bf16", "fp16", "onebit")


@dataclass
class BenchCommConfig:
    """``tsm-ds bench comm`` (:mod:`tsm_ds.bench.comm`): the parent starts the launcher, which runs
    the same command with ``--worker`` on every rank."""

    out_dir: str = opt("bench_out", "folder for comm.json / comm.md")
    world_size: int = opt(2, "ranks (processes) on this machine")
    reps: int = opt(7, "timed repetitions per method (median reported)")
    warmup: int = opt(2, "untimed repetitions first")
    quick: bool = opt(False, "3 reps, 1 warm-up (same gradient size)")
    flat: bool = opt(False, "one flat parameter instead of the TSM-R50 layout")
    numel: int = opt(24_327_632, "elements of the flat parameter (TSM-R50's gradient)")
    chunk_size: int = opt(1024, "1-bit: elements per scale (the JSON default)")
    methods: tuple[str, ...] = opt(COMM_METHODS, "comma list of " + ",".join(COMM_METHODS), parse=split_strs)
    timeout: float = opt(1500.0, "seconds before the launcher is stopped")
    worker: bool = opt(False, "one rank under the launcher", hidden=True)


#: the hardware presets of ``tsm_ds.bench.scaling.presets.CLUSTERS``
SCALE_CLUSTERS = ("h100", "h200", "summit")


@dataclass
class BenchScaleConfig:
    """``tsm-ds bench scale`` (:func:`tsm_ds.bench.scaling.write_scale_report`; every model input can
    be overridden; the training epochs are ``schedule.epochs``). Defaults: the paper's figures
    (:data:`tsm_ds.bench.scaling.presets.PAPER`)."""

    out_dir: str = opt("bench_out", "output folder", aliases=("--out",))
    from_bench: str | None = opt(None, "read models.json / data.json from DIR (default: --out-dir) for parameters, "
                                 "the measured TSM/I3D ratio and decode speed; missing files are fine", metavar="DIR")
    cluster: str = opt("summit", "hardware preset of the prediction", choices=SCALE_CLUSTERS)
    calib_cluster: str = opt("summit", "hardware the calibration time was measured on (summit: the paper's "
                             "single node)", choices=SCALE_CLUSTERS)
    gpus: int = opt(1536, "GPUs to predict")
    gpus_per_node: int | None = opt(None, "GPUs per node (default: the preset's)")
    calib_gpus: int = opt(6, "GPUs of the calibration time")
    calib_time_s: float = opt(179_700.0, "measured training time at --calib-gpus (the paper's 49 h 55 min)")
    gpu_throughput: float | None = opt(None, "given training throughput of TSM-R50 8f per GPU of --cluster (clips/s) "
                                       "instead of the calibration time", metavar="CLIPS_PER_S")
    inter_bandwidth: float | None = opt(None, "network bytes/s per node in GB/s (Summit 23)", metavar="GB_PER_S")
    intra_bandwidth: float | None = opt(None, "NVLink ring bandwidth per GPU in GB/s (Summit 50)", metavar="GB_PER_S")
    latency_us: float | None = opt(None, "inter-node alpha per ring hop (us)")
    dataset_size: int = opt(240_000, "training clips (Kinetics-400)")
    batch_per_gpu: int = opt(8, "clips per GPU per step")
    frames: int = opt(8, "TSM frames per clip (compute scales with T)")
    bytes_per_element: float = opt(4.0, "gradient bytes on the wire")
    overlap: float = opt(0.0, "fraction of all-reduce hidden (0..1)")
    bytes_per_frame: float = opt(20_000.0, "stored bytes per frame")
    decode_fps_per_core: float | None = opt(None, "frames/s one CPU core decodes+augments (default 200, or "
                                            "data.json)")
    i3d_ratio: float | None = opt(None, "I3D-R50 32f compute per clip relative to TSM (default: paper's 1.8)")
    i3d_params: int | None = opt(None, "I3D-R50 gradient elements (default: models.json, else the preset)")
    tsm_params: int | None = opt(None, "TSM-R50 gradient elements (default: models.json, else the preset)")
    max_gpus: int = opt(3072, "end of the scaling curve")
    plot: bool = opt(True, "skip scaling.png", flag="--no-plot")
    quick: bool = opt(False, "accepted for 'bench all' (the model is instant)")


#: the study's recipes (:data:`tsm_ds.experiments.large_batch.grid.RECIPES`)
LARGE_BATCH_RECIPES = ("sgd", "lars", "lamb")
#: the full study's time, :func:`tsm_ds.experiments.large_batch.grid.estimate_text` of the defaults (a test
#: keeps them equal), and the measured costs it rests on (docs/large-batch.md, "Cost")
LARGE_BATCH_ESTIMATE = ("Estimate of the full study (defaults; per-clip costs measured through the trainer on the "
                        "2-core machine, resnet18 T=4 32 px, one thread, 2026-12-05: 0.025 s a clip at batch 8, "
                        "0.0122 s at micro-batch 64 with ghost BatchNorm over 8; ~34 / ~18 min a run at 8 / 256): "
                        "14 runs, 6.1 h of one core, 6.1 h wall at 1 run(s) at a time; if needed, 4 more runs "
                        "(second seeds, isolation) 1.5 h. Resumable: a rerun skips the runs recorded in OUT/rows/.")
#: the motion demo data's difficulty presets (:data:`tsm_ds.data.synthetic.DIFFICULTIES`)
LARGE_BATCH_DIFFICULTIES = ("demo", "hard")


@dataclass
class BenchLargeBatchConfig:
    """``tsm-ds bench large-batch`` (:func:`tsm_ds.experiments.large_batch.run_study`). Values left
    unset are those of the full study or of ``--quick``
    (:class:`tsm_ds.experiments.large_batch.grid.StudySettings`, ``QUICK``); the base micro-batch is
    ``schedule.micro_batch_size``."""

    out_dir: str = opt("bench_out/large_batch_v2", "output folder (runs start in it)", aliases=("--out",))
    quick: bool = opt(False, "tiny data and runs: checks stages, batches, accumulation and lrs, not accuracy")
    recipes: tuple[str, ...] = opt(LARGE_BATCH_RECIPES, "comma-separated subset of the recipes", parse=split_strs)
    batches: tuple[int, ...] | None = opt(None, "comma-separated global batches, ascending, the first is the base "
                                          "(default 8,64,256)", parse=split_ints)
    min_steps: int | None = opt(None, "optimizer steps of the largest batch at least (default 300)")
    train_per_class: int | None = opt(None, "demo training clips per class (default 640)")
    difficulty: str | None = opt(None, "the demo data's generator preset (its fields replace the study's; "
                                 "default: the study's own fields, preset hard)", choices=LARGE_BATCH_DIFFICULTIES)
    headroom: int | None = opt(None, "epochs factor of the base batch's longer run (is the base near "
                               "convergence?); 0: none (default 2)")
    sgd_lrs: tuple[float, ...] | None = opt(None, "(a) SGD lrs swept at the base batch, 1 to 4 (default "
                                            "0.005,0.01,0.02)", parse=split_floats)
    lars_lrs: tuple[float, ...] | None = opt(None, "(b) LARS lrs swept at the largest batch (default 4,8,16)",
                                             parse=split_floats)
    lamb_lrs: tuple[float, ...] | None = opt(None, "(c) LAMB lrs swept at the largest batch (default "
                                             "0.005,0.01,0.02)", parse=split_floats)
    seeds: tuple[int, ...] | None = opt(None, "training seeds: (a) all at the base and the largest batch, the first "
                                        "elsewhere (default 0,1)", parse=split_ints)
    warmup_epochs: float | None = opt(None, "linear warm-up above the base batch, in epochs (default 5)")
    max_micro_batch: int | None = opt(None, "micro-batch above the base batch, BatchNorm over --ghost-bn-clips in it "
                                      "(default 64)")
    parallel: int | None = opt(None, "runs at a time (default 1)")
    threads: int | None = opt(None, "OMP threads per run (default 1)")
    cache: bool = opt(True, "decode clips per access (no train.py --cache-decoded)", flag="--no-cache")
    overwrite: bool = opt(False, "rerun runs already recorded in OUT/rows/")
    keep_checkpoints: bool = opt(False, "keep every run's checkpoints and models")
    report_only: bool = opt(False, "run nothing: write (and with --results-dir publish) the report of the runs "
                            "recorded so far (a study in progress)")
    results_dir: str | None = opt(None, "also copy large_batch.json/.md/.png and rows/ into this tracked folder "
                                  "(e.g. results/large_batch)")


#: the study's time, :func:`tsm_ds.experiments.multigrid_study.plan.estimate_text` of the defaults (a test keeps
#: them equal), and the pilot's costs it rests on (docs/multigrid.md, "What it did here")
MULTIGRID_ESTIMATE = ("Estimate of the full study (defaults; per-step costs of a pilot through the trainer on the "
                      "2-core machine shared with another study, resnet18 T=4 32 px, one thread, 2026-12-05: 0.246 s "
                      "a base step of 8 x 4 x 32 px, 0.312 s a step of 32 x 2 x 24 px, 0.0077 s an evaluated clip): "
                      "6 runs (base 6400 steps ~30 min, mg_x1.5 4000 steps ~23 min, mg_x1 2720 steps ~16 min; per "
                      "seed), 2.3 h of one core, one run at a time; training time over the base's by these costs: "
                      "mg_x1.5 0.70x, mg_x1 0.47x. Resumable: a rerun skips the runs recorded in OUT/rows/.")


@dataclass
class BenchMultigridConfig:
    """``tsm-ds bench multigrid`` (:func:`tsm_ds.experiments.multigrid_study.run_study`). Values left unset
    are those of the full study or of ``--quick`` (:class:`tsm_ds.experiments.multigrid_study.plan.MGSettings`,
    ``QUICK``); the base recipe's epochs, lr steps and lr, the schedule and precise BatchNorm's batches are
    the training fields ``--epochs``, ``--lr-steps``, ``--lr``, ``--multigrid``, ``--precise-bn-batches``."""

    out_dir: str = opt("bench_out/multigrid", "output folder (runs start in it)", aliases=("--out",))
    quick: bool = opt(False, "tiny data and runs: checks both arms, precise BatchNorm and the report, not accuracy")
    seeds: tuple[int, ...] | None = opt(None, "training seeds, every arm runs each (default 0,1)", parse=split_ints)
    epoch_factors: tuple[float, ...] | None = opt(None, "--multigrid-epoch-factor of the multigrid arms, one arm "
                                                  "each (default 1.5,1)", parse=split_floats)
    overwrite: bool = opt(False, "rerun runs already recorded in OUT/rows/")
    runs: tuple[str, ...] | None = opt(None, "run only these of the planned runs (comma-separated names, e.g. "
                                       "mg_x1_s1): a second process on another core takes them while the "
                                       "first goes on with the others; the report covers every run recorded",
                                       parse=split_strs)
    keep_checkpoints: bool = opt(False, "keep every run's checkpoints and models")
    report_only: bool = opt(False, "run nothing: write (and with --results-dir publish) the report of the runs "
                            "recorded so far (a study in progress)")
    results_dir: str | None = opt(None, "also copy multigrid.json/.md and rows/ into this tracked folder "
                                  "(e.g. results/multigrid)")


#: the benches of ``tsm-ds bench all`` in run order (:data:`tsm_ds.bench.runner.ALL_ORDER`)
BENCH_ALL_ORDER = ("comm", "data", "models", "scale")


@dataclass
class BenchAllConfig:
    """``tsm-ds bench all`` (:func:`tsm_ds.bench.runner.run_all`). ``--quick`` and ``--full`` are
    exclusive (the command refuses both)."""

    out_dir: str = opt("bench_out", "output folder")
    quick: bool = opt(False, "reduced sizes (default without a GPU)")
    full: bool = opt(False, "full sizes (default with a GPU)")
    only: tuple[str, ...] = opt(BENCH_ALL_ORDER, "comma-separated benches to run", parse=split_strs)
    time_limit_scale: float = opt(1.0, "multiply every bench's time limit by this")


# ------------------------------------------------------------------------------------------------
# demo, doctor, prepare, check-videos

#: the engine recipe of the demo (``ds_configs/cpu_demo_adamw.json``)
DEMO_RECIPE = "cpu_demo_adamw"


@dataclass
class DemoConfig:
    """``tsm-ds demo`` (:func:`tsm_ds.experiments.demo.run_demo`): the dataset
    (:func:`tsm_ds.data.synthetic.make_demo_dataset`) and the launch; the training both models get
    is the shared model / data / schedule / engine fields (the command's defaults)."""

    out: str = opt("runs/demo", "dataset, runs and results go here")
    models: tuple[str, ...] = opt(("tsm", "tsn"), "comma-separated subset of tsm,tsn", parse=split_strs)
    classes: tuple[str, ...] = opt(("moving_left", "moving_right", "moving_up", "moving_down"),
                                   "comma-separated names from tsm_ds.data.synthetic.ALL_CLASSES", parse=split_strs)
    train_per_class: int = opt(200, "generated training clips per class")
    val_per_class: int = opt(50, "generated validation clips per class")
    num_frames: int = opt(16, "frames per generated video; must exceed --num-segments (validation samples segment "
                          "centres, frame 0 only when there are too few frames)")
    speed: tuple[float, ...] = opt((1.5, 2.5), "object speed range, pixels per video frame (x2 between the frames "
                                   "of a 16-frame video that an 8-segment clip samples)", nargs=2,
                                   metavar=("LOW", "HIGH"))
    radius: tuple[float, ...] = opt((8.0, 12.0), "object size range (half side / radius), pixels", nargs=2,
                                    metavar=("LOW", "HIGH"))
    distractor_prob: float = opt(0.0, "probability of a static second shape in a clip")
    clutter: float = opt(0.5, "background structure in [0, 1] (0: flat random colour)")
    contrast: float = opt(0.4, "least brightness difference between object and background, in [0, 0.5) "
                          "(intensity units); low contrast left TSM at chance in the CPU budget")
    tint: float = opt(0.25, "largest random RGB tint per channel of every colour (0: grey levels)")
    size: int = opt(64, "generated frame side in pixels")
    overwrite: bool = opt(False, "regenerate the dataset")
    nproc: int = opt(2, "ranks on this machine (--num_gpus of the launcher)")
    dry_run: bool = opt(False, "generate the data, print the launcher commands, train nothing")


@dataclass
class DoctorConfig:
    """``tsm-ds doctor`` (:func:`tsm_ds.doctor.run_doctor`); the model, recipe and data are the
    shared fields (unset: this device's defaults), the re-encoding is ``tsm-ds prepare``'s."""

    precisions: tuple[str, ...] = opt((), "more compute precisions, comma list of fp32,bf16,fp16,autocast_bf16,"
                                      "autocast_fp16", parse=split_strs)
    workers: tuple[int, ...] | None = opt(None, "DataLoader worker counts to measure, comma list (default 1,2,4,... "
                                          "up to the cores per device)", parse=split_ints)
    reencode_clips: int | None = opt(None, "clips re-encoded to measure the `tsm-ds prepare` advice (default 3, "
                                     "--quick 1; 0: off)")
    comm_methods: tuple[str, ...] = opt(("fp32", "bf16", "onebit"), "all-reduce variants under the launcher: "
                                        "fp32,bf16,fp16,onebit", parse=split_strs)
    recipes: bool = opt(False, "recipe smoke: every ds_configs recipe for this device trains --recipe-steps steps")
    recipe_names: tuple[str, ...] | None = opt(None, "only these recipes (comma list)", parse=split_strs)
    recipe_steps: int = opt(3, "optimizer steps per recipe of the smoke")
    recipe_arch: str = opt("resnet18", "the recipe smoke's model")
    only: tuple[str, ...] | None = opt(None, "only these sections: environment,compute,data,communication,recipes,"
                                       "onebit,verdict,cluster", parse=split_strs)
    quick: bool = opt(False, "short time boxes, small defaults (about a minute on 2 cores)")
    out: str = opt("doctor_out", "output folder (doctor.json / .md / .png)")


@dataclass
class ClusterCheckConfig:
    """``tsm-ds doctor --hostfile``: the cluster preflight (:mod:`tsm_ds.doctor.cluster`)."""

    hostfile: str | None = opt(None, "DeepSpeed hostfile ('<host> slots=<ranks>' lines): check every host (ssh, host "
                               "key, python and versions, shared run dir, master port, pdsh) and run one all-reduce "
                               "over all ranks; alone, runs only this section")
    ssh_port: int | None = opt(None, "ssh port of the hosts (default: ssh's own)", env="SSH_PORT")
    master_addr: str | None = opt(None, "rank 0's address (default: the first host)", env="MASTER_ADDR")
    master_port: int | None = opt(None, "training's port, checked free on the first host", env="MASTER_PORT")
    run_dir: str | None = opt(None, "a folder every host must share: training's --output-dir (default --out)")
    timeout: float = opt(60.0, "seconds per remote step (ssh probe, all-reduce)", flag="--cluster-timeout")


@dataclass
class PrepareConfig:
    """``tsm-ds prepare`` (:func:`tsm_ds.data.prepare.prepare_dataset`)."""

    src: str = opt(None, "class-folder tree (or the root of --list's relative paths, or the folder of --dataset NAME: "
                   "the split is kept in OUT)", positional=True)
    out: str = opt(None, "output folder", positional=True)
    list: str | None = opt(None, "video list ('path label') instead of class folders")
    mode: str = opt("packed", "packed: one training-ready .jpack per video (JPEG frames + index); video: "
                    "re-encoded H.264; frames: JPEG folders", choices=("packed", "video", "frames"))
    short_side: int = opt(256, "short side of the output in pixels (0 keeps the size)")
    quality: int = opt(90, "JPEG quality 1-95 (packed and frames modes): lower is smaller and a little faster "
                       "to decode")
    keyint: int | None = opt(None, "keyframe interval in frames (video mode; none: the encoder's)")
    crf: int = opt(23, "x264 constant rate factor (video mode)")
    preset: str = opt("veryfast", "x264 preset (video mode)")
    tune: str = opt("fastdecode", "x264 tune (video mode): fastdecode makes files cheap to load "
                    "(with b-pyramid=none: x1.7-2.5 train items/s per core, 8-12% more bytes; "
                    "tsm_ds.data.prepare); none: x264's default")
    workers: int = opt(_WORKERS, "parallel processes")
    part: str | None = opt(None, "prepare part I of N only (I from 0; videos k of the sorted source with k mod N == "
                           "I), writing OUT/parts/part-I-of-N.json and no global list; default under a SLURM array "
                           "job: SLURM_ARRAY_TASK_ID of the array's size (--array=0-<N-1>)")
    parts: int | None = opt(None, "N, the number of parts, when the part index is SLURM_ARRAY_TASK_ID (to rerun some "
                            "parts: sbatch --array=3,7 ... --parts N)")
    merge: bool = opt(False, "after all parts: check that every part report is there and covers the source, then "
                      "write all.txt, classes.txt and prepare_report.json for the whole set")
    shards: float | None = opt(None, "packed mode: also write the packs into shards of about this many MB in "
                               "OUT/shards (litdata chunks + index.json + samples.json: train with --data OUT/shards "
                               "or its copy on an S3 server); with parts, at --merge")


@dataclass
class CheckVideosConfig:
    """``tsm-ds check-videos`` (:mod:`tsm_ds.data.check`)."""

    source: str = opt(None, "list file (path label | frame_dir num_frames label) or class-folder tree",
                      positional=True)
    root: str | None = opt(None, "root for relative paths in the list (default: the list's folder)")
    full: bool = opt(False, "decode every frame (slower; counts decodable frames)")
    workers: int = opt(_WORKERS, "parallel processes")
    out: str | None = opt(None, "report prefix (default: ./<source name>.check in the current directory; datasets "
                          "are often read-only)")


# ------------------------------------------------------------------------------------------------
# the commands

BENCH_MODELS = Command(
    prog="tsm-ds bench models", sections=("bench_models",), fields=("data.img_size", "model.num_classes"),
    defaults={"model.num_classes": 400},
    description="Throughput, cost and gradient size of TSM against its baselines: model zoo (TSM/TSN/I3D/"
                "torchvision video models), TSM/TSN step-time overhead, the shift op alone.")

BENCH_DATA = Command(
    prog="tsm-ds bench data", sections=("bench_data",), fields=("data.data",), use_env=True,
    description="Clip decoding throughput, our loader against the alternatives (decode everything, torchcodec, "
                "decord), on real clips and generated long videos; then the training pipeline through a DataLoader.",
    epilog="--data: real clips, as training takes them (default: $TSM_DS_DATA, else ../shared/data/videos).")

BENCH_COMM = Command(
    prog="tsm-ds bench comm", sections=("bench_comm",), fields=("distributed.local_rank",),
    description="Gradient communication per optimizer step, fp32 vs bf16/fp16 vs 1-bit: bytes and time per rank, "
                "through the deepspeed launcher.")

BENCH_SCALE = Command(
    prog="tsm-ds bench scale", sections=("bench_scale",), fields=("schedule.epochs",),
    defaults={"schedule.epochs": 50},
    description="Analytic scaling model: calibrated on the paper's single-node time, predicts the 1,536-GPU time "
                "with its error, TSM vs I3D, what-ifs. Writes scale.json, scale.md, scaling.png.")

BENCH_LARGE_BATCH = Command(
    prog="tsm-ds bench large-batch", sections=("bench_large_batch",), fields=("schedule.micro_batch_size",),
    description=("The paper's claim in its own regime (Lin, Gan, Han 2019; Goyal et al. 2017): TSM on the motion demo\n"
                 "data (preset 'hard') at global batches 8 / 64 / 256 (32x; world size 1, micro-batch x accumulation,\n"
                 "BatchNorm over 8 clips at every batch, ghost BatchNorm in larger micro-batches), 15 epochs = 300\n"
                 "optimizer steps at 256 (20 per epoch), a 5-epoch warm-up above the base batch, cosine decay.\n"
                 "Recipes: (a) SGD with the linear rule (the paper's; lr swept at the base batch), (b) LARS and (c)\n"
                 "LAMB (lrs swept at the largest batch); 3 lrs a factor 2 apart each, 2 seeds for (a) at 8 and 256.\n"
                 "Verdict per recipe: final top-1 at 256 within max(1 point, 2 SE) of the base's, no seed diverged or\n"
                 "at chance; time to 95% of the base's top-1 for every run; the base's 2x-longer run (near\n"
                 "convergence?). Each stage starts once the stages it reads have ended (with --parallel 2, the LARS /\n"
                 "LAMB sweeps beside SGD's); each row is written when its run ends (a rerun skips\n"
                 "recorded rows); --report-only reports (and with --results-dir publishes) a study in progress. Every\n"
                 "run is ``python -m tsm_ds.train``, started in --out-dir."),
    epilog="--micro-batch-size: clips per micro-batch at the base batch (default 8; --quick: 2). "
           + LARGE_BATCH_ESTIMATE)

BENCH_MULTIGRID = Command(
    prog="tsm-ds bench multigrid", sections=("bench_multigrid",),
    fields=("schedule.epochs", "schedule.lr_steps", "schedule.lr", "schedule.multigrid", "schedule.precise_bn_batches"),
    defaults={"schedule.epochs": None, "schedule.lr": None, "schedule.multigrid": "long",
              "schedule.precise_bn_batches": None},
    description=("Multigrid (Wu et al., CVPR 2020) on the large-batch study's task: TSM-ResNet-18 T=4 32 px on the\n"
                 "motion demo data (preset 'hard'), base batch 8, SGD with a stepwise lr (10 epochs, x0.1 at 6 and\n"
                 "8, the fc at x5), against the same recipe with --multigrid long at epoch factors 1.5 and 1.0; 2\n"
                 "seeds each; every evaluation at the base shape after precise BatchNorm (both arms). Reports per run\n"
                 "the final top-1, the training time (evaluations apart), time to the base's final top-1 in seconds,\n"
                 "optimizer steps and clips x frames x pixels, seconds per step by clip shape; per arm the\n"
                 "large-batch study's pass rule and the goal (pass, and <= 0.67x the base's training time). Runs one\n"
                 "after another (pin the command to one core: taskset -c 1, OMP_NUM_THREADS=1), each row written\n"
                 "when its run ends (a rerun skips recorded rows); --report-only reports (and with --results-dir\n"
                 "publishes) a study in progress."),
    epilog="--epochs / --lr-steps / --lr: the base recipe's (default 10 / 6 8 / 0.003 at batch 8; --quick: 4 / 2 3 / "
           "0.01 at batch 2); --multigrid: the arms' cycle (default long); --precise-bn-batches: before every "
           "evaluation of every run (default 50; --quick: 2). " + MULTIGRID_ESTIMATE)

BENCH_ALL = Command(prog="tsm-ds bench all", sections=("bench_all",),
                    description="Every bench but large-batch, each in its own process, then summary.md and the plots.")

DEMO = Command(
    prog="tsm-ds demo", sections=("demo",),
    fields=("schedule.seed", "model.arch", "data.img_size", "model.num_segments", "model.shift_div", "schedule.epochs",
            "schedule.batch_size", "schedule.lr", "schedule.warmup_steps", "model.dropout",
            "engine.deepspeed_config", "data.num_workers"),
    defaults={"model.arch": "resnet18", "data.img_size": 64, "schedule.epochs": 6, "schedule.batch_size": 8,
              "schedule.lr": 3e-4, "schedule.warmup_steps": 20, "model.dropout": 0.0,
              "engine.deepspeed_config": DEMO_RECIPE, "data.num_workers": 1},
    description="TSM against TSN on clips whose classes differ only in temporal order.",
    epilog="Both models get the same training (only --shift differs): --seed is the dataset's and training's "
           "seed, --batch-size the global batch (all ranks), --lr AdamW's lr for it (1e-3 left TSM at chance for "
           "300+ steps on some seeds; 3e-4 escaped the plateau within ~100 steps on every seed tried), --dropout 0: "
           "trained from scratch for a few epochs, --num-workers per rank.")

DOCTOR = Command(
    prog="tsm-ds doctor", sections=("doctor", "cluster"), use_env=True,
    fields=("data.data", "engine.deepspeed_config", "model.arch", "model.num_segments", "data.img_size",
            "schedule.micro_batch_size", "model.num_classes", "model.channels_last", "model.compile",
            "prepare.short_side", "prepare.keyint", "logging.progress", "distributed.local_rank"),
    defaults={"model.arch": None, "model.num_segments": None, "data.img_size": None, "model.num_classes": 400,
              "prepare.keyint": 16},
    description="Measure data loading, compute and communication on this machine and your data, say which one binds "
                "and what to change (with the measured effect). JSON + markdown + a plot under --out.",
    epilog="Unset, the measured job is this device's training default: --deepspeed_config cpu_fp32 on CPU, gpu_fp16 "
           "on CUDA (its precision is measured); --arch resnet50, --num-segments 8, --img-size 224 (--quick: "
           "resnet18, 64 px); --micro-batch-size the recipe's, else 8 on CUDA, 2 on CPU (--quick: 1); --data "
           "$TSM_DS_DATA, then ../shared/data/videos. --channels-last / --compile also measure compute that way; "
           "--short-side / --keyint are the re-encoding of the data section (tsm-ds prepare's). --hostfile runs the "
           "cluster preflight (alone unless --only says otherwise).")

PREPARE = Command(prog="tsm-ds prepare", sections=("prepare",),
                  fields=("data.dataset", "data.dataset_split", "data.frame_template", "data.classes"),
                  description="Pack, re-encode or extract JPEG frames of a video dataset and write lists; "
                              "on many nodes in parts (--part I/N or a SLURM array job), then --merge.")

CHECK_VIDEOS = Command(prog="tsm-ds check-videos", sections=("check_videos",),
                       description="Scan a dataset and report the files the loader cannot use.")

#: command name (``tsm-ds <name>``) -> its Command
TOOL_COMMANDS: dict[str, Command] = {
    "bench models": BENCH_MODELS, "bench data": BENCH_DATA, "bench comm": BENCH_COMM, "bench scale": BENCH_SCALE,
    "bench large-batch": BENCH_LARGE_BATCH, "bench multigrid": BENCH_MULTIGRID, "bench all": BENCH_ALL,
    "demo": DEMO, "doctor": DOCTOR, "prepare": PREPARE, "check-videos": CHECK_VIDEOS}


def command_values(cmd: Command, tree: Any) -> dict[str, Any]:
    """``{"section.field": value}`` of every field ``cmd`` uses, read from ``tree`` (a root
    dataclass instance): what a tool records of its command line (``demo_results.json``'s ``args``).

    Raises:
        tsm_ds.config.fields.ConfigTreeError: ``cmd`` names a field the tree does not have.
    """
    infos = field_infos(type(tree))
    out = {}
    for path in cmd.paths(infos):
        value = getattr(getattr(tree, infos[path].section), infos[path].name)
        out[path] = list(value) if isinstance(value, tuple) else value
    return out
