"""``tsm-ds predict VIDEO...``: the top-k classes of each video, by the test protocol or streaming.

Library: :mod:`tsm_ds.inference.predict` (modes, outputs and errors are described there).
"""
from __future__ import annotations

import argparse
import json
import sys

from tsm_ds.cli._common import add_official_args, add_view_args, load_from_args
from tsm_ds.inference.predict import UnreadableVideo, predict_clip, predict_online, topk
from tsm_ds.utils.io import atomic_write_text


def build_parser() -> argparse.ArgumentParser:
    """The ``tsm-ds predict`` argument parser."""
    p = argparse.ArgumentParser(prog="tsm-ds predict", description=__doc__.split("\n\n")[0].replace("``", ""),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("videos", nargs="+", metavar="VIDEO", help="video files")
    p.add_argument("--checkpoint", required=True,
                   help="exported state dict (.pt), DeepSpeed checkpoint directory or official TSM .pth")
    p.add_argument("--labels", default=None,
                   help="label map, one class name a line (e.g. kinetics400_labels.txt); "
                        "default: the checkpoint's class names")
    p.add_argument("--top-k", type=int, default=5, help="classes shown per video (default 5)")
    p.add_argument("--num-segments", type=int, default=None, help="T (default: the checkpoint's)")
    p.add_argument("--img-size", type=int, default=None, help="crop size, pixels (default: the size the checkpoint was trained at, else 224)")
    add_view_args(p)
    p.add_argument("--average", choices=["logits", "prob"], default="logits",
                   help="view averaging (default logits, as the official test code)")
    p.add_argument("--online", action="store_true",
                   help="stream frames through the online (uni-directional) TSM and print the running prediction")
    p.add_argument("--window", type=int, default=12, help="online: frames in the running average (default 12)")
    p.add_argument("--stride", type=int, default=2, help="online: use every n-th frame (default 2)")
    p.add_argument("--every", type=int, default=1, help="online: print every n steps (0: final only)")
    p.add_argument("--max-frames", type=int, default=None, help="online: stop after this many steps")
    p.add_argument("--json", default=None, help="also write all predictions to this JSON file")
    add_official_args(p)
    return p


def main(argv: list[str]) -> int:
    """``tsm-ds predict``; exit status 0, 1 when some video could not be read, 2 on a bad checkpoint."""
    args = build_parser().parse_args(argv)
    from tsm_ds.inference.views import legacy_note

    if not args.online and legacy_note(args.num_crops, args.full_res):
        print(f"note: {legacy_note(args.num_crops, args.full_res)}", file=sys.stderr)
    loaded = load_from_args(args, "tsm-ds predict")
    if loaded is None:
        return 2
    for note in loaded.notes:
        print(f"note: {note}", file=sys.stderr)
    model, names = loaded.model, loaded.class_names
    num_segments = int(loaded.config.get("num_segments", 8))
    if args.online and loaded.config.get("shift") != "online":
        print(f"tsm-ds predict: --online needs a checkpoint trained with shift='online'; "
              f"{args.checkpoint} has shift={loaded.config.get('shift')!r}", file=sys.stderr)
        return 2
    failed, results = 0, {}
    for path in args.videos:
        print(path, flush=True)
        try:
            if args.online:
                r = predict_online(model, path, names, img_size=args.img_size, window=args.window,
                                   stride=args.stride, max_frames=args.max_frames, every=args.every,
                                   top_k=args.top_k)
                best = r["final"]
                print(f"  after {r['frames']} frames (last {min(args.window, r['frames'])} averaged):")
                results[path] = {"top": best, "frames": r["frames"]}
            else:
                probs = predict_clip(model, path, num_segments=num_segments, img_size=args.img_size,
                                     num_clips=args.num_clips, num_crops=args.num_crops,
                                     average=args.average, full_res=args.full_res, resize=args.resize)
                best = topk(probs, names, args.top_k)
                results[path] = {"top": best}
        except UnreadableVideo as e:
            failed += 1
            print(f"  error: {e}", flush=True)
            results[path] = {"error": e.reason}
            continue
        for rank, (name, p) in enumerate(best, 1):
            print(f"  {rank}. {name:40s} {p:.4f}")
    if args.json:
        atomic_write_text(args.json, json.dumps({"checkpoint": str(args.checkpoint), "online": args.online,
                                                 "predictions": results}, indent=2) + "\n")
    if failed:
        bad = [p for p, r in results.items() if "error" in r]
        print(f"tsm-ds predict: {failed} of {len(args.videos)} videos could not be read: "
              + "; ".join(f"{p} ({results[p]['error']})" for p in bad), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
