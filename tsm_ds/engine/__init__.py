"""The DeepSpeed engine around the model, in rooms named for what they hold: ``loop`` (the trainer,
its build, hooks, state, validation, settings, loaders), ``checkpoint`` (writing, reading, resuming,
resharding), ``guards`` (divergence, hang watchdog, stop signal), ``comm`` (process group,
rendezvous, gradient compression) and ``config`` (recipes, their "auto" values, the validator)."""
