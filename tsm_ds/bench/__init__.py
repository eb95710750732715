"""tsm_ds.bench: the benchmarks (library half; the commands are ``tsm_ds.cli.bench*``).

- :mod:`~tsm_ds.bench.models`: throughput, cost and gradient size of TSM against its baselines;
- :mod:`~tsm_ds.bench.data`: clip decoding throughput, our loader against the alternatives;
- :mod:`~tsm_ds.bench.comm`: gradient communication per step (fp32 / bf16 / fp16 / 1-bit);
- :mod:`~tsm_ds.bench.scaling`: the analytic scaling model (6 -> 1,536 GPUs, TSM vs I3D);
- :mod:`~tsm_ds.bench.runner`: ``bench all`` (each bench in its own process, the summary);
- :mod:`~tsm_ds.bench.plots`: PNG plots of the bench JSON files;
- :mod:`~tsm_ds.bench.demo`: the TSM vs TSN demo on the motion-direction dataset.

Nothing here parses argv or exits; progress goes to a ``log`` callback (default: ``logging``).
"""
