"""``tsm-ds models``: the table of supported architectures (parameters, multiply-adds, FLOPs)."""
from __future__ import annotations

import argparse
import json
import sys


def build_parser() -> argparse.ArgumentParser:
    """The ``tsm-ds models`` argument parser."""
    p = argparse.ArgumentParser(prog="tsm-ds models", description=(
        "Parameters and per-clip multiply-adds (the paper's 'FLOPs') / FLOPs (torch's count, "
        "2 per multiply-add) of the supported architectures."))
    p.add_argument("--num-classes", type=int, default=400, help="classes of the fc head (400)")
    p.add_argument("--img-size", type=int, default=224, help="frame height = width in pixels")
    p.add_argument("--num-segments", type=int, default=None,
                   help="frames per clip for every row (default: 8; 32 for the two I3D rows)")
    p.add_argument("--json", default=None, help="also write the rows to this JSON file")
    return p


def main(argv: list[str] | None = None) -> int:
    """``tsm-ds models``: print the table (markdown); returns 0."""
    args = build_parser().parse_args(argv)
    from tsm_ds.models.complexity import table_rows
    from tsm_ds.utils.io import atomic_write_text, markdown_table

    rows = table_rows(args.num_classes, args.img_size, args.num_segments)
    print(f"Per clip of N=1, {args.img_size}x{args.img_size}, {args.num_classes} classes. "
          "GMACs = multiply-adds (the TSM paper's 'FLOPs'); GFLOPs = torch.utils.flop_counter "
          "(2 per multiply-add).\n")
    print(markdown_table(rows), end="")
    if args.json:
        atomic_write_text(args.json, json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
