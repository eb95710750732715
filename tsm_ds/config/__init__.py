"""The run configuration: one typed tree (:mod:`.tree`, :mod:`.tools`), the parsers generated from
it (:mod:`.fields`), the environment variables that set its fields (:mod:`.env`) and the run's
``config.json`` (:mod:`.record`).

The bottom layer of the package with :mod:`tsm_ds.utils`: it imports nothing else of tsm_ds, so
every layer may read its own section. Library functions take their own section or plain keyword
arguments, never an argparse Namespace; the trainer alone (the engine's edge, as torchtitan's
``Trainer(job_config)``) takes the run's tree and hands each part its section. Programs that start
a run without a command line build the tree with :func:`tree_with`.
"""
from tsm_ds.config.fields import Command, ConfigTreeError, build_parser, field_infos, opt, parse, to_argv
from tsm_ds.config.record import tree_with
from tsm_ds.config.tree import TRAIN_SECTIONS, Config

__all__ = ["Command", "Config", "ConfigTreeError", "TRAIN_SECTIONS", "build_parser", "field_infos", "opt",
           "parse", "to_argv", "tree_with"]
