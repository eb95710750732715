"""1-bit compression through the ``deepspeed`` launcher and a real DeepSpeed engine (2 ranks, gloo).

The test runs this file under ``deepspeed --num_gpus 2``; each rank (``__main__`` below):

1. trains a tiny MLP on synthetic data (a fixed random teacher, 4 classes) with DeepSpeed SGD +
   momentum for STEPS steps, once with the engine's own fp32 all-reduce and once with
   ``enable_backward_allreduce = False`` + :class:`OneBitCompressor` (freeze_step 10), from the
   same initial weights; records the full-data loss of both;
2. checks that compressed training keeps the parameters bit-identical on both ranks;
3. resumes: a compressed run saves the engine checkpoint and the compressor state (per-rank file,
   key "compressor", as the trainer does) at step RESUME_AT, continues to STEPS; a fresh engine
   loads both and repeats the tail; parameters and error buffers must be bit-identical.

Loss tolerance: the compressed run's final loss must be within 10 % (relative) of the uncompressed
run's (1-bit SGD with error feedback converges at the SGD rate up to a constant; at 120 steps
the measured gap here is a few percent), and both must have dropped below half the initial loss,
so a compressor that does not train fails.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tsm_ds.utils.node import free_port

STEPS, RESUME_AT, FREEZE = 120, 60, 10
REL_TOL = 0.10


@pytest.mark.slow
def test_onebit_sgd_through_launcher_matches_fp32_and_resumes(tmp_path):
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    cmd = [os.path.join(bindir, "deepspeed"), "--num_gpus", "2", "--master_port", str(free_port()),
           __file__, "--out", str(tmp_path)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    res = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for r in res:
        assert r["loss_fp32"] < 0.5 * r["loss_init"], r
        assert r["loss_onebit"] < 0.5 * r["loss_init"], r
        assert abs(r["loss_onebit"] - r["loss_fp32"]) <= REL_TOL * r["loss_fp32"], r
        assert r["ranks_identical"] and r["resume_params_equal"] and r["resume_buffers_equal"], r
        assert r["phase_last"] == 1.0 and r["ratio_last"] > 8, r
        # bf16 engine: gradients stay bf16 in p.grad, the compressed run still trains, ranks agree
        assert r["bf16_grad_dtype"] == "torch.bfloat16" and r["bf16_ranks_identical"], r
        assert abs(r["loss_onebit_bf16"] - r["loss_fp32"]) <= 2 * REL_TOL * r["loss_fp32"], r
    assert res[0]["loss_onebit"] == res[1]["loss_onebit"]


# ------------------------------------------------------------------------------ rank side

def _data(rank: int):
    import torch
    g = torch.Generator().manual_seed(1234)
    teacher = torch.randn(16, 4, generator=g)
    x = torch.randn(512, 16, generator=g)
    y = (x @ teacher).argmax(1)
    return x, y, x[rank::2], y[rank::2]


def _engine(seed: int, bf16: bool = False):
    import deepspeed
    import torch
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    cfg = {"train_micro_batch_size_per_gpu": 16, "gradient_accumulation_steps": 1,
           "gradient_clipping": 0.0, "steps_per_print": 10_000,
           "optimizer": {"type": "SGD", "params": {"lr": 0.05, "momentum": 0.9}},
           "zero_optimization": {"stage": 0}, "bf16": {"enabled": bf16}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    return engine


def _train(engine, xs, ys, start, stop, compressor=None):
    import torch
    dtype = torch.bfloat16 if engine.bfloat16_enabled() else torch.float32
    for step in range(start, stop):
        i = (step * 16) % xs.shape[0]
        logits = engine(xs[i:i + 16].to(dtype)).float()
        loss = torch.nn.functional.cross_entropy(logits, ys[i:i + 16])
        engine.backward(loss)
        if compressor is not None:
            compressor.allreduce(engine.module.parameters())
        engine.step()


def _full_loss(engine, x, y) -> float:
    import torch
    dtype = torch.bfloat16 if engine.bfloat16_enabled() else torch.float32
    with torch.no_grad():
        return float(torch.nn.functional.cross_entropy(engine.module(x.to(dtype)).float(), y))


def _flat_params(engine):
    import torch
    return torch.cat([p.detach().reshape(-1) for p in engine.module.parameters()])


def _rank_main(out: Path) -> None:
    import torch
    import torch.distributed as dist

    from tsm_ds.engine.comm.compression import build_compressor

    torch.set_num_threads(1)
    # the trainer's own set-up: DeepSpeed's CPU comm op loaded one rank at a time, the fail-fast
    # rendezvous, the /dev/shm clean-up
    from tsm_ds.engine.comm.dist import init_distributed
    init_distributed()
    rank = dist.get_rank()
    x, y, xs, ys = _data(rank)
    block = {"type": "onebit", "freeze_step": FREEZE, "chunk_size": 256}
    res = {}

    eng = _engine(0)
    res["loss_init"] = _full_loss(eng, x, y)
    _train(eng, xs, ys, 0, STEPS)
    res["loss_fp32"] = _full_loss(eng, x, y)

    eng = _engine(0)
    eng.enable_backward_allreduce = False
    comp = build_compressor(block, eng)
    _train(eng, xs, ys, 0, STEPS, comp)
    res["loss_onebit"] = _full_loss(eng, x, y)
    st = comp.stats()
    res["phase_last"], res["ratio_last"] = st["compression/phase"], st["compression/ratio"]
    p = _flat_params(eng)
    both = [torch.empty_like(p) for _ in range(2)]
    dist.all_gather(both, p)
    res["ranks_identical"] = bool(torch.equal(both[0], both[1]))

    # bf16 engine (ZeRO 0: bf16 gradients in p.grad, fp32 master weights): compressed in fp32
    eng = _engine(0, bf16=True)
    eng.enable_backward_allreduce = False
    comp = build_compressor(block, eng)
    _train(eng, xs, ys, 0, STEPS, comp)
    res["loss_onebit_bf16"] = _full_loss(eng, x, y)
    res["bf16_grad_dtype"] = str(next(eng.module.parameters()).dtype)   # p.grad has the dtype of p
    p = _flat_params(eng).float()
    both = [torch.empty_like(p) for _ in range(2)]
    dist.all_gather(both, p)
    res["bf16_ranks_identical"] = bool(torch.equal(both[0], both[1]))

    # resume: checkpoint at RESUME_AT, continue; fresh engine + compressor load and repeat the tail
    eng = _engine(0)
    eng.enable_backward_allreduce = False
    comp = build_compressor(block, eng)
    _train(eng, xs, ys, 0, RESUME_AT, comp)
    ckpt = out / "ckpt"
    eng.save_checkpoint(str(ckpt), tag="step60")
    torch.save({"compressor": comp.state_dict()}, out / f"compressor_rank{rank}.pt")
    _train(eng, xs, ys, RESUME_AT, STEPS, comp)
    ref_params, ref_w, ref_s = _flat_params(eng), comp.worker_error.clone(), comp.server_error.clone()

    eng2 = _engine(1)                                   # other init: everything must come from disk
    eng2.enable_backward_allreduce = False
    eng2.load_checkpoint(str(ckpt), tag="step60")
    comp2 = build_compressor(block, eng2)
    comp2.load_state_dict(torch.load(out / f"compressor_rank{rank}.pt")["compressor"])
    _train(eng2, xs, ys, RESUME_AT, STEPS, comp2)
    res["resume_params_equal"] = bool(torch.equal(_flat_params(eng2), ref_params))
    res["resume_buffers_equal"] = bool(torch.equal(comp2.worker_error, ref_w)
                                       and torch.equal(comp2.server_error, ref_s))
    (out / f"rank{rank}.json").write_text(json.dumps(res))
    # leave the group, then end as the trainer's ranks end (exit_process, below): a rank ending
    # through a plain interpreter shutdown aborted in it ("terminate called without an active
    # exception", no Python frame: a joinable C++ thread destroyed at exit) after both ranks had
    # written their results, exit status 250: 4 of 7 launches with neither (2026-12-05, this
    # machine), 1 of 8 with destroy_process_group alone, 0 of 14 with both
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--local_rank", type=int, default=0)
    _rank_main(Path(ap.parse_args().out))
    from tsm_ds.cli.process_exit import exit_process
    exit_process(0)   # as tsm_ds/train.py's ranks end
