"""``python -m tsm_ds.cli <command> ...``: the same as the ``tsm-ds`` console script."""
import sys

from tsm_ds.cli import main

sys.exit(main())
