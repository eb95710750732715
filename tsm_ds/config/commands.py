"""Which fields each command uses (:class:`~tsm_ds.config.fields.Command`): the parsers of
``tsm_ds.train``, ``tsm-ds config``, ``eval``, ``predict``, ``export`` and ``models`` are generated
from these; the tools' commands are in :mod:`tsm_ds.config.tools`. Kept in the bottom layer so that
runs the product starts itself (the demo, the large-batch study, the doctor) build their command
lines with :func:`~tsm_ds.config.fields.to_argv` from the same specification.
"""
from __future__ import annotations

from tsm_ds.config.fields import Command
from tsm_ds.config.tree import TRAIN_SECTIONS

__all__ = ["TRAIN", "PLAN", "EVAL", "PREDICT", "EXPORT", "MODELS", "CHECKPOINT_MODEL_FIELDS"]

#: ``tsm_ds.train`` (what the deepspeed launcher starts on every rank): every section of a run
TRAIN = Command(prog="tsm_ds.train", description="Train TSM with DeepSpeed (tsm_ds.cli.train).",
                sections=TRAIN_SECTIONS, fields=("checkpoint.trust_checkpoint",), exclude=("model.num_classes",),
                use_env=True)

#: model fields of a checkpoint that a checkpoint command may override (default None = "what the
#: checkpoint or its official file name says")
CHECKPOINT_MODEL_FIELDS = ("model.arch", "model.num_classes", "model.num_segments", "model.shift", "model.shift_div",
                           "model.shift_place", "model.temporal_pool", "model.dropout")
_FROM_CHECKPOINT = {p: None for p in CHECKPOINT_MODEL_FIELDS} | {"data.img_size": None}

#: ``tsm-ds config``: the engine JSON resolved for a planned job
#: (the schedule fields it names are the engine JSON's inputs: a new training-only schedule field stays
#: out of it without an ``exclude``)
PLAN = Command(prog="tsm-ds config", description="The engine JSON a training run would use, resolved, without "
               "launching it.", sections=("plan",),
               fields=("engine.deepspeed_config", "model.arch", "model.num_classes", "model.num_segments",
                       "model.shift", "model.shift_div", "model.shift_place", "model.temporal_pool",
                       "model.dropout", "model.partial_bn", "model.pretrained", "data.img_size", "schedule.epochs",
                       "schedule.max_steps", "schedule.batch_size", "schedule.micro_batch_size", "schedule.grad_accum",
                       "schedule.lr", "schedule.weight_decay", "schedule.clip_grad", "schedule.warmup_steps",
                       "schedule.warmup_epochs", "schedule.head_lr_mults", "schedule.lr_steps", "schedule.multigrid",
                       "schedule.multigrid_final_stage", "schedule.multigrid_min_frames",
                       "schedule.multigrid_epoch_factor",
                       "distributed.dist_timeout", "distributed.step_timeout", "distributed.startup_timeout"),
               defaults={"model.num_classes": 400},
               required=("engine.deepspeed_config", "plan.world_size", "plan.train_samples"))

#: ``tsm-ds eval``
EVAL = Command(prog="tsm-ds eval", description="Multi-view evaluation of a checkpoint, on one process or many.",
               sections=("checkpoint", "views", "eval"),
               fields=("data.data", "data.dataset", "data.dataset_split", "data.frame_template", "data.val_fraction",
                       "data.img_size", "data.decode_device", "data.shard_cache", "data.shard_cache_mb",
                       "data.max_bad_fraction",
                       *CHECKPOINT_MODEL_FIELDS, "distributed.local_rank"),
               defaults=_FROM_CHECKPOINT, required=("checkpoint.checkpoint", "eval.out"))

#: ``tsm-ds predict``
PREDICT = Command(prog="tsm-ds predict", description="The top-k classes of each video, by the test protocol or "
                  "streaming.", sections=("checkpoint", "views", "predict"),
                  fields=("data.img_size", *CHECKPOINT_MODEL_FIELDS), exclude=("views.sampling",),
                  defaults=_FROM_CHECKPOINT, required=("checkpoint.checkpoint",))

#: ``tsm-ds export``
EXPORT = Command(prog="tsm-ds export", description="A checkpoint to a torch.export program (.pt2) and ONNX, "
                 "checked against PyTorch.", sections=("checkpoint", "export"),
                 fields=("data.img_size", *CHECKPOINT_MODEL_FIELDS), defaults=_FROM_CHECKPOINT,
                 required=("checkpoint.checkpoint", "export.out"))

#: ``tsm-ds models``
MODELS = Command(prog="tsm-ds models", description="Parameters and per-clip multiply-adds (the paper's 'FLOPs') / "
                 "FLOPs (torch's count, 2 per multiply-add) of the supported architectures.",
                 sections=("models",), fields=("model.num_classes", "data.img_size", "model.num_segments"),
                 defaults={"model.num_classes": 400, "model.num_segments": None})
