"""The DeepSpeed engine around the model, in rooms named for what they hold: ``loop`` (the trainer,
its build, hooks, state, validation, settings, loaders, the multigrid schedule), ``checkpoint``
(writing, reading, resuming, resharding), ``guards`` (divergence, hang watchdog, stop signal),
``comm`` (process group, rendezvous, gradient compression) and ``config`` (recipes, their "auto"
values, the validator).

Names whose use changed when the trainer began to read the configuration tree (callers that build
a run themselves: tests, the doctor, studies):

- ``tsm_ds.engine.loop.settings.TrainSettings(run_dir, config, class_names, record, step_callback)``:
  the run's options are the tree's sections (``config``, built with :func:`tsm_ds.config.tree_with`,
  e.g. ``{"schedule.epochs": 1, "output.resume": "auto"}``), no longer ~30 keyword fields;
- ``tsm_ds.models.set_fused_shift(enabled)`` (a process global) is
  :func:`tsm_ds.models.use_fused_shift` (model, enabled);
- ``tsm_ds.data.memory.set_malloc_trim`` / ``trim_enabled`` are the dataset's
  :class:`tsm_ds.data.options.ReaderOptions` (``malloc_trim``), which also carries the index and shard
  cache settings the train command used to set process-wide.

Every other public name of ``tsm_ds.engine`` (and the re-exports of ``engine.checkpoint`` and
``engine.config``) keeps working.
"""
