"""The README's ``--channels-last`` / ``--compile`` measurement: TSM-ResNet-18 training step on CPU.

``python studies/channels_last_compile_bench.py [--reps 15] [--threads 1] [--no-compile]`` builds
TSM-ResNet-18 (8 segments, 400 classes, dropout 0.5) and times one training step (forward,
cross-entropy, backward, SGD momentum step) on 2 clips of 112 px for four copies of the same
weights: default, channels-last inputs (:func:`tsm_ds.engine.loop.model_prep.clip_to_channels_last`),
``nn.Module.compile`` (inductor; what DeepSpeed's ``engine.compile()`` does) and both. The first
step of each (warm-up; for the compiled ones, the graph compile) is reported apart; then the
variants run interleaved (order reversed every other repetition) and the medians are compared:
speed = default step time / variant step time. Prints one line per variant.
"""
from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--no-compile", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    from tsm_ds.engine.loop.model_prep import clip_to_channels_last
    from tsm_ds.models import build_model

    torch.manual_seed(0)
    base = build_model("resnet18", 400, num_segments=8, dropout=0.5).train()
    clip, label = torch.randn(2, 8, 3, 112, 112), torch.randint(0, 400, (2,))
    variants = {"default": (copy.deepcopy(base), False), "channels_last": (copy.deepcopy(base), True)}
    if not args.no_compile:
        for name, cl in (("compile", False), ("compile+channels_last", True)):
            m = copy.deepcopy(base)
            m.compile()
            variants[name] = (m, cl)
    opts = {k: torch.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9) for k, (m, _) in variants.items()}

    def step(name: str) -> float:
        m, cl = variants[name]
        x = clip_to_channels_last(clip) if cl else clip
        t0 = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(m(x), label)
        opts[name].zero_grad()
        loss.backward()
        opts[name].step()
        return time.perf_counter() - t0

    first = {}
    for name in variants:
        first[name] = step(name)
        step(name)
    times: dict[str, list[float]] = {k: [] for k in variants}
    for r in range(args.reps):
        for name in (list(variants) if r % 2 == 0 else list(variants)[::-1]):
            times[name].append(step(name))
    ref = statistics.median(times["default"])
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:24s} median {med * 1e3:7.0f} ms  speed vs default {ref / med:.3f}  "
              f"first step {first[name]:.1f} s")


if __name__ == "__main__":
    main()
