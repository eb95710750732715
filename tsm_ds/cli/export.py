"""``tsm-ds export``: a checkpoint to a ``torch.export`` program (.pt2) and ONNX, checked against PyTorch.

Library: :mod:`tsm_ds.inference.export` (graphs, layouts, the check and its tolerances).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tsm_ds.cli._common import add_official_args, load_from_args
from tsm_ds.inference.export import DEFAULT_ATOL, DEFAULT_RTOL, export_model


def build_parser() -> argparse.ArgumentParser:
    """The ``tsm-ds export`` argument parser."""
    p = argparse.ArgumentParser(prog="tsm-ds export", description=__doc__.split("\n\n")[0].replace("``", ""),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True,
                   help="exported state dict (.pt: state_dict, model_config, class_names), a DeepSpeed "
                        "run directory, or an official TSM checkpoint (.pth)")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--name", default="model", help="file stem (default: model)")
    p.add_argument("--formats", nargs="+", default=["pt2", "onnx"], choices=["pt2", "onnx"])
    p.add_argument("--online", action="store_true",
                   help="export the online model's single step with explicit shift caches")
    p.add_argument("--num-segments", type=int, default=None,
                   help="T of the exported clip (default: the checkpoint's)")
    p.add_argument("--img-size", type=int, default=None, help="input height = width, pixels (default: the size the checkpoint was trained at, else 224)")
    p.add_argument("--batch-size", type=int, default=2,
                   help="example batch size (default 2; the exported batch dim is dynamic unless --static-batch)")
    p.add_argument("--static-batch", action="store_true", help="fix the batch size instead of a dynamic dim")
    p.add_argument("--labels", default=None, help="label map file (one class name a line) when the "
                                                  "checkpoint has no class names")
    p.add_argument("--atol", type=float, default=DEFAULT_ATOL)
    p.add_argument("--rtol", type=float, default=DEFAULT_RTOL)
    p.add_argument("--opset", type=int, default=None, help="ONNX opset (default: the exporter's)")
    add_official_args(p)
    return p


def main(argv: list[str]) -> int:
    """``tsm-ds export``: returns 0 when every written file matched PyTorch within tolerance, else 1."""
    args = build_parser().parse_args(argv)
    loaded = load_from_args(args, "tsm-ds export")
    if loaded is None:
        return 2
    model = loaded.model
    num_segments = args.num_segments or int(loaded.config.get("num_segments", 8))
    meta = {"checkpoint": str(args.checkpoint), "class_names": loaded.class_names,
            "model_config": loaded.config}
    report = export_model(model, args.out, num_segments=num_segments, img_size=args.img_size,
                          batch_size=args.batch_size, online=args.online, formats=args.formats,
                          dynamic_batch=not args.static_batch, name=args.name, atol=args.atol,
                          rtol=args.rtol, opset=args.opset, metadata=meta)
    for fmt, path in report["files"].items():
        check = report["check"].get(fmt, {})
        if "max_abs_diff" in check:
            status = "OK" if check["ok"] else "MISMATCH"
            print(f"{fmt}: {path}  max |diff| {check['max_abs_diff']:.3g} (rel {check['max_rel_diff']:.3g}); "
                  f"limit atol {args.atol:g} + rtol {args.rtol:g} x max|output|: {status}")
        else:
            print(f"{fmt}: {path}  ({check.get('onnxruntime', 'not checked')})")
    print(f"report: {Path(args.out) / 'export.json'}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
