"""``python -m tsm_ds.cli <command> ...``: the same as the ``tsm-ds`` console script."""
from tsm_ds.cli import run

run()
