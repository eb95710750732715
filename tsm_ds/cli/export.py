"""``tsm-ds export``: a checkpoint to a ``torch.export`` program (.pt2) and ONNX, checked against PyTorch.

Library: :mod:`tsm_ds.inference.export` (graphs, layouts, the check and its tolerances).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tsm_ds.cli._common import load_from_config
from tsm_ds.config import Config, parse
from tsm_ds.config.commands import EXPORT
from tsm_ds.config.fields import build_parser as build_parser_for
from tsm_ds.inference.export import export_model

#: the fields this command uses
COMMAND = EXPORT


def build_parser() -> argparse.ArgumentParser:
    """The ``tsm-ds export`` argument parser (generated: :data:`tsm_ds.config.commands.EXPORT`)."""
    return build_parser_for(COMMAND, Config)


def main(argv: list[str]) -> int:
    """``tsm-ds export``: returns 0 when every written file matched PyTorch within tolerance, else 1
    (2: an unreadable checkpoint)."""
    cfg, _ = parse(COMMAND, Config, argv)
    x = cfg.export
    loaded, img_size = load_from_config(cfg, "tsm-ds export")
    if loaded is None:
        return 2
    model = loaded.model
    num_segments = cfg.model.num_segments or int(loaded.config.get("num_segments", 8))
    meta = {"checkpoint": str(cfg.checkpoint.checkpoint), "class_names": loaded.class_names,
            "model_config": loaded.config}
    report = export_model(model, x.out, num_segments=num_segments, img_size=img_size,
                          batch_size=x.batch_size, online=x.online, formats=x.formats,
                          dynamic_batch=not x.static_batch, name=x.name, atol=x.atol,
                          rtol=x.rtol, opset=x.opset, metadata=meta)
    for fmt, path in report["files"].items():
        check = report["check"].get(fmt, {})
        if "max_abs_diff" in check:
            status = "OK" if check["ok"] else "MISMATCH"
            print(f"{fmt}: {path}  max |diff| {check['max_abs_diff']:.3g} (rel {check['max_rel_diff']:.3g}); "
                  f"limit atol {x.atol:g} + rtol {x.rtol:g} x max|output|: {status}")
        else:
            print(f"{fmt}: {path}  ({check.get('onnxruntime', 'not checked')})")
    print(f"report: {Path(x.out) / 'export.json'}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    from tsm_ds.cli.process_exit import exit_process
    exit_process(main(sys.argv[1:]))
