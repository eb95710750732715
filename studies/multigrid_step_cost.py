"""Why a multigrid step costs more than its clips x frames x pixels on this CPU: the model step of the
study's shapes, with and without ghost BatchNorm, outside the trainer (no loader, no DeepSpeed).

The multigrid study (``tsm-ds bench multigrid``, docs/multigrid.md "What it did here") found a step of
32 clips x 2 frames x 24 px 1.27x the base step of 8 x 4 x 32 px through the trainer, for 1.125x its
clips x frames x pixels. This isolates the model's part: one training step (normalise, forward,
cross-entropy, backward, SGD momentum) of TSM-ResNet-18 (8 classes, zero-init residual as the study's
recipe) on random uint8 clips, one thread, medians of ``--reps`` interleaved rounds after a warm-up:

- base: 8 x 4 x 32 px, BatchNorm over the 8 clips (the study's base step);
- the long cycle's shapes 32 x 2 x 24, 16 x 2 x 32 with ghost BatchNorm over 8 clips (as the trainer
  runs them), and the same without ghost BatchNorm (one BatchNorm over the whole micro-batch):
  what the groups cost;
- 8 x 4 x 24 px and 16 x 2 x 24 px: the smaller crop at the base's and at half the clips x frames
  (the cost per pixel of 24 px inputs, whatever the batch).

Prints a markdown table (ms, ratio to the base, ideal ratio) and writes ``--json``.

    OMP_NUM_THREADS=1 taskset -c 1 python studies/multigrid_step_cost.py --json results/multigrid/step_cost.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: (name, clips, T, crop, ghost BatchNorm clips or None)
SHAPES = (("base 8x4x32", 8, 4, 32, None), ("long 0/1: 32x2x24, ghost 8", 32, 2, 24, 8),
          ("32x2x24, one BatchNorm", 32, 2, 24, None), ("long 2: 16x2x32, ghost 8", 16, 2, 32, 8),
          ("16x2x32, one BatchNorm", 16, 2, 32, None), ("8x4x24", 8, 4, 24, None), ("16x2x24", 16, 2, 24, None))


def main(argv: list[str] | None = None) -> int:
    """Time the steps; print the table; write ``--json``. Returns 0."""
    sys.path.insert(0, str(REPO))
    import torch
    import torch.nn.functional as F

    from tsm_ds.data.transforms import IMAGENET_MEAN, IMAGENET_STD, normalize_batch
    from tsm_ds.models import build_model
    from tsm_ds.models.large_batch import use_ghost_bn, zero_init_residual
    from tsm_ds.utils.io import machine_info

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    torch.manual_seed(0)
    models, opts, data = {}, {}, {}
    for name, n, t, c, ghost in SHAPES:
        m = build_model("resnet18", 8, num_segments=4).train()
        zero_init_residual(m)
        if ghost:
            use_ghost_bn(m, ghost)
        models[name], opts[name] = m, torch.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9)
        data[name] = (torch.randint(0, 256, (n, t, 3, c, c), dtype=torch.uint8), torch.randint(0, 8, (n,)))

    def step(name: str) -> float:
        x, y = data[name]
        t0 = time.perf_counter()
        opts[name].zero_grad(set_to_none=True)
        F.cross_entropy(models[name](normalize_batch(x, IMAGENET_MEAN, IMAGENET_STD)), y).backward()
        opts[name].step()
        return time.perf_counter() - t0

    for name, *_ in SHAPES:   # warm-up
        step(name)
        step(name)
    times: dict[str, list[float]] = {name: [] for name, *_ in SHAPES}
    for _ in range(a.reps):
        for name, *_ in SHAPES:
            times[name].append(step(name))
    med = {k: statistics.median(v) for k, v in times.items()}
    base = med[SHAPES[0][0]]
    rows = [{"shape": name, "clips": n, "frames": t, "crop": c, "ghost_bn": ghost, "ms": round(1e3 * med[name], 1),
             "over_base": round(med[name] / base, 3), "ideal_over_base": round(n * t * c * c / (8 * 4 * 32 * 32), 3)}
            for name, n, t, c, ghost in SHAPES]
    print(f"TSM-ResNet-18, one training step, {torch.get_num_threads()} thread, median of {a.reps} rounds")
    print("\n| step | ms | / base | ideal / base |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['shape']} | {r['ms']} | {r['over_base']:.2f} | {r['ideal_over_base']:.3f} |")
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps({"name": "multigrid_step_cost", "reps": a.reps, "rows": rows,
                                            "threads": torch.get_num_threads(), "machine": machine_info(),
                                            "date": time.strftime("%Y-%m-%d")}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
