"""tsm_ds.utils: the bottom layer (no imports from the rest of the package).

- :mod:`tsm_ds.utils.io`: the one atomic file writer (text, bytes, ``torch.save``, any writer that
  takes a path), markdown tables, and the JSON + markdown reports of benchmarks and tools.
- :mod:`tsm_ds.utils.node`: what one node offers a launch, without torch: cores, GPUs (the CUDA
  check), ranks and threads per rank, the default recipe, a free / SLURM port.
- :mod:`tsm_ds.utils.hosts`: hostfiles, ssh as DeepSpeed's launcher runs it, the fix per ssh error.
- :mod:`tsm_ds.utils.exits`: the exit statuses of training and the launchers, and their meanings.

``node``, ``hosts`` and ``exits`` import no torch: the launch scripts ask them through
``python -m tsm_ds.cli.launch_helper``.
"""
