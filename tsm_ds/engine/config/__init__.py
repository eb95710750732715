"""The engine recipe (a DeepSpeed JSON plus the tsm_ds block): finding and reading recipes, filling
their "auto" values for a run, the one validator, and the run's provenance.

``tsm_ds.engine.config`` re-exports :mod:`.resolve` (its former module).
"""
from .resolve import *  # noqa: F401,F403
from .resolve import __all__  # noqa: F401
