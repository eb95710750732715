"""tsm_ds.experiments: the training experiments the product ships as commands (library halves).

Each one trains real models through ``tsm_ds.train`` and the DeepSpeed launcher, then compares the
runs to test a claim of the papers:

- :mod:`~tsm_ds.experiments.demo`: ``tsm-ds demo``, TSM against TSN on the motion-direction
  dataset (temporal modelling at no extra cost);
- :mod:`~tsm_ds.experiments.large_batch`: ``tsm-ds bench large-batch``, accuracy against the global
  batch with four lr recipes (linear scaling, LARS, LAMB).

Not to be confused with the repository's top-level ``studies/``: research scripts outside the
package, never installed. Nothing here parses argv or exits; the commands are
:mod:`tsm_ds.cli.demo` and :mod:`tsm_ds.cli.bench_large_batch`.
"""
