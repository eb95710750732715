"""tsm_ds.bench: the benchmarks (library half; the commands are ``tsm_ds.cli.bench*``).

- :mod:`~tsm_ds.bench.models`: throughput, cost and gradient size of TSM against its baselines;
- :mod:`~tsm_ds.bench.data`: clip decoding throughput, our loader against the alternatives;
- :mod:`~tsm_ds.bench.comm`: gradient communication per step (fp32 / bf16 / fp16 / 1-bit);
- :mod:`~tsm_ds.bench.scaling`: the analytic scaling model (6 -> 1,536 GPUs, TSM vs I3D);
- :mod:`~tsm_ds.bench.runner`: ``bench all`` (each bench in its own process, the summary);
- :mod:`~tsm_ds.bench.plots`: PNG plots of the bench JSON files.

The doctor (:mod:`tsm_ds.doctor`) and the training experiments (:mod:`tsm_ds.experiments`: the
demo, the large-batch study) sit in the same layer and may use these modules; nothing here imports
them.

Nothing here parses argv or exits; progress goes to a ``log`` callback (default: ``logging``).
"""
