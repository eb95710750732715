"""``tsm-ds models``: the table of supported architectures (parameters, multiply-adds, FLOPs)."""
from __future__ import annotations

import argparse
import json

from tsm_ds.config import Config, parse
from tsm_ds.config.commands import MODELS
from tsm_ds.config.fields import build_parser as build_parser_for

#: the fields this command uses
COMMAND = MODELS


def build_parser() -> argparse.ArgumentParser:
    """The ``tsm-ds models`` argument parser (generated: :data:`tsm_ds.config.commands.MODELS`)."""
    return build_parser_for(COMMAND, Config)


def main(argv: list[str] | None = None) -> int:
    """``tsm-ds models``: print the table (markdown); returns 0."""
    cfg, _ = parse(COMMAND, Config, argv)
    from tsm_ds.models.complexity import table_rows
    from tsm_ds.utils.io import atomic_write_text, markdown_table

    classes, size = cfg.model.num_classes, cfg.data.img_size
    rows = table_rows(classes, size, cfg.model.num_segments)
    print(f"Per clip of N=1, {size}x{size}, {classes} classes. "
          "GMACs = multiply-adds (the TSM paper's 'FLOPs'); GFLOPs = torch.utils.flop_counter "
          "(2 per multiply-add).\n")
    print(markdown_table(rows), end="")
    if cfg.models.json:
        atomic_write_text(cfg.models.json, json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    from tsm_ds.cli.process_exit import exit_process
    exit_process(main())
