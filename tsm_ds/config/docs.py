"""Tables of the configuration tree for the docs (docs/training.md; tested equal to them)."""
from __future__ import annotations

from tsm_ds.config.env import VARIABLES
from tsm_ds.config.fields import field_infos
from tsm_ds.config.tree import Config

__all__ = ["variables_table"]


def variables_table() -> list[dict]:
    """The rows of docs/training.md's table of environment variables: variable, field, flag, what
    (:data:`tsm_ds.config.env.VARIABLES`)."""
    infos = field_infos(Config)
    return [{"variable": f"`{var}`", "field": f"`{path}`", "flag": f"`{infos[path].flag}`", "what": what}
            for var, (path, what) in VARIABLES.items()]
