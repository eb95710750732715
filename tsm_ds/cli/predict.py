"""``tsm-ds predict VIDEO...``: the top-k classes of each video, by the test protocol or streaming.

Library: :mod:`tsm_ds.inference.predict` (modes, outputs and errors are described there).
"""
from __future__ import annotations

import argparse
import json
import sys

from tsm_ds.cli._common import load_from_config
from tsm_ds.config import Config, parse
from tsm_ds.config.commands import PREDICT
from tsm_ds.config.fields import build_parser as build_parser_for
from tsm_ds.inference.predict import UnreadableVideo, predict_clip, predict_online, topk
from tsm_ds.utils.io import atomic_write_text

#: the fields this command uses
COMMAND = PREDICT


def build_parser() -> argparse.ArgumentParser:
    """The ``tsm-ds predict`` argument parser (generated: :data:`tsm_ds.config.commands.PREDICT`)."""
    return build_parser_for(COMMAND, Config)


def main(argv: list[str]) -> int:
    """``tsm-ds predict``; exit status 0, 1 when some video could not be read, 2 on a bad checkpoint."""
    cfg, _ = parse(COMMAND, Config, argv)
    v, a = cfg.views, cfg.predict
    from tsm_ds.inference.views import legacy_note

    if not a.online and legacy_note(v.num_crops, v.full_res):
        print(f"note: {legacy_note(v.num_crops, v.full_res)}", file=sys.stderr)
    loaded, img_size = load_from_config(cfg, "tsm-ds predict")
    if loaded is None:
        return 2
    for note in loaded.notes:
        print(f"note: {note}", file=sys.stderr)
    model, names = loaded.model, loaded.class_names
    num_segments = int(loaded.config.get("num_segments", 8))
    checkpoint = cfg.checkpoint.checkpoint
    if a.online and loaded.config.get("shift") != "online":
        print(f"tsm-ds predict: --online needs a checkpoint trained with shift='online'; "
              f"{checkpoint} has shift={loaded.config.get('shift')!r}", file=sys.stderr)
        return 2
    failed, results = 0, {}
    for path in a.videos:
        print(path, flush=True)
        try:
            if a.online:
                r = predict_online(model, path, names, img_size=img_size, window=a.window,
                                   stride=a.stride, max_frames=a.max_frames, every=a.every,
                                   top_k=a.top_k)
                best = r["final"]
                print(f"  after {r['frames']} frames (last {min(a.window, r['frames'])} averaged):")
                results[path] = {"top": best, "frames": r["frames"]}
            else:
                probs = predict_clip(model, path, num_segments=num_segments, img_size=img_size,
                                     num_clips=v.num_clips, num_crops=v.num_crops,
                                     average=v.average, full_res=v.full_res, resize=v.resize)
                best = topk(probs, names, a.top_k)
                results[path] = {"top": best}
        except UnreadableVideo as e:
            failed += 1
            print(f"  error: {e}", flush=True)
            results[path] = {"error": e.reason}
            continue
        for rank, (name, p) in enumerate(best, 1):
            print(f"  {rank}. {name:40s} {p:.4f}")
    if a.json:
        atomic_write_text(a.json, json.dumps({"checkpoint": str(checkpoint), "online": a.online,
                                              "predictions": results}, indent=2) + "\n")
    if failed:
        bad = [p for p, r in results.items() if "error" in r]
        print(f"tsm-ds predict: {failed} of {len(a.videos)} videos could not be read: "
              + "; ".join(f"{p} ({results[p]['error']})" for p in bad), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    from tsm_ds.cli.process_exit import exit_process
    exit_process(main(sys.argv[1:]))
