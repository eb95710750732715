"""tsm_ds.utils: the bottom layer (no imports from the rest of the package).

- :mod:`tsm_ds.utils.io`: the one atomic file writer (text, bytes, ``torch.save``, any writer that
  takes a path), markdown tables, and the JSON + markdown reports of benchmarks and tools.
"""
