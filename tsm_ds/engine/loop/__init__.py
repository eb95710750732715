"""The training loop and what it is built from: the engine build (DeepSpeed initialize, groups,
loaders), the trainer's loop and its hooks (validation, checkpoint and best-model cadence), run
state, validation and precise BatchNorm, metrics, the run's settings and result files, optimizers
and lr schedules, DataLoaders and the resumable sampler, the multigrid shape schedule and its
batch sampler.
"""
