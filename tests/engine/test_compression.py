"""Error-feedback 1-bit compressed all-reduce (tsm_ds.engine.comm.compression).

Single-process tests check packing, layout, quantiser and config errors; the 2-rank tests run two
gloo processes (torch.multiprocessing spawn; the launcher + DeepSpeed engine test is in
test_compression_launcher.py) and check the error-feedback identity and exact resume.

Tolerance of the identity: inputs are float64 N(0, 1) and the compressor runs in float64; per step
the only rounding is one subtraction ``e = v - q`` (<= 1 ulp of |e| < 2^4) plus the test's own
sums, so the identity holds to ~1e-13; we assert 1e-10. A missing or wrong error buffer breaks it
by O(1).
"""
from __future__ import annotations

import os
import tempfile

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tsm_ds.engine.comm import compression as C
from tsm_ds.engine.comm.compression import (
    ChunkLayout,
    OneBitCompressor,
    build_compressor,
    decode_scaled_sign,
    pack_signs,
    scaled_sign,
    unpack_signs,
)
from tsm_ds.utils.node import free_port

TOL = 1e-10


# ------------------------------------------------------------------------------ single process

def test_pack_signs_matches_numpy_packbits_and_unpack_is_exact():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8 * 37, generator=g)
    x[::5] = 0.0                                         # sign(0) -> +1 (bit 1)
    x[3] = -0.0                                          # -0.0 >= 0 is True as well
    packed = pack_signs(x)
    expect = np.packbits((x.numpy() >= 0).astype(np.uint8))
    assert packed.dtype == torch.uint8 and packed.shape == (37,)
    np.testing.assert_array_equal(packed.numpy(), expect)
    signs = unpack_signs(packed, torch.float64)
    ref = np.where(x.numpy() >= 0, 1.0, -1.0)
    np.testing.assert_array_equal(signs.numpy(), ref)
    # the torch bit-op path used on GPUs gives the same bytes
    assert torch.equal(C._pack_bits_torch(x >= 0), packed)
    # known byte: + - + + - - - + -> 0b10110001
    assert pack_signs(torch.tensor([1., -1, 2, 0, -3, -1, -2, 5])).tolist() == [0b10110001]


def test_pack_signs_rejects_bad_shapes():
    with pytest.raises(ValueError, match="numel % 8"):
        pack_signs(torch.ones(10))
    with pytest.raises(ValueError, match="uint8"):
        unpack_signs(torch.ones(3))


def test_chunk_layout_padding_and_counts():
    lay = ChunkLayout.build(101, 2, 16)
    # segment 51 -> 4 chunks of 13 -> rounded to 16 elements: seg 64, padded 128 (a multiple of 2*8)
    assert (lay.k, lay.c, lay.seg, lay.padded) == (4, 16, 64, 128)
    assert lay.counts().tolist() == [16, 16, 16, 16, 16, 16, 5, 0]
    # three tensors: chunks never straddle two of them
    lay = ChunkLayout.build([10, 3, 20], 2, 8)
    assert (lay.c, lay.k, lay.offsets, lay.padded, lay.n) == (8, 3, (0, 16, 24), 48, 33)
    assert lay.counts().tolist() == [8, 2, 3, 8, 8, 4]
    assert lay.pad_index().tolist() == list(range(10, 16)) + list(range(19, 24)) + list(range(44, 48))
    parts = [torch.arange(10.), -torch.arange(1., 4.).view(3, 1), torch.full((4, 5), 7.)]
    buf = torch.zeros(48)
    lay.scatter(parts, buf)
    assert buf[16:19].tolist() == [-1, -2, -3] and buf[lay.pad_index()].abs().sum() == 0
    assert torch.equal(lay.gather(buf), torch.cat([t.reshape(-1) for t in parts]))
    with pytest.raises(ValueError, match="chunk_size >= 8"):
        ChunkLayout.build(10, 2, 4)


def test_scaled_sign_known_values():
    v = torch.tensor([3., -4, 0, 0, 1, 1, -1, -1], dtype=torch.float64)
    counts = torch.tensor([4., 4.], dtype=torch.float64)
    packed, scales, q = scaled_sign(v, counts, 4)
    # chunk 0: ||(3,-4,0,0)|| / sqrt(4) = 2.5; chunk 1: 2 / 2 = 1
    assert scales.tolist() == [2.5, 1.0]
    assert q.tolist() == [2.5, -2.5, 2.5, 2.5, 1, 1, -1, -1]
    assert torch.equal(decode_scaled_sign(packed, scales, 4, torch.float64), q)
    # padding: count 3 in the second chunk, element 7 decodes to 0 and does not enter the scale
    packed, scales, q = scaled_sign(torch.tensor([1., 1, 1, 1, 2, 2, 2, 0], dtype=torch.float64),
                                    torch.tensor([4., 3.], dtype=torch.float64), 4, n_valid=7)
    assert scales.tolist() == [1.0, 2.0] and q.tolist() == [1, 1, 1, 1, 2, 2, 2, 0]


def test_config_block_and_removed_optimizers():
    assert build_compressor(None, None) is None
    assert build_compressor({"type": "none"}, None) is None
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['chunk'\]"):
        build_compressor({"type": "onebit", "chunk": 8}, None)
    with pytest.raises(ValueError, match="freeze_step must be an integer >= 0"):
        build_compressor({"type": "onebit", "freeze_step": -1}, None)
    with pytest.raises(ValueError, match="tsm_ds.compression.type is required"):
        build_compressor({"freeze_step": 3}, None)
    assert build_compressor("none", None) is None
    with pytest.raises(ValueError, match="'twobit' is not supported"):
        build_compressor({"type": "twobit"}, None)
    # the one validator (tsm_ds.engine.config.checks.validate_config) checks the block and its context
    from tsm_ds.engine.config.checks import validate_config
    from tsm_ds.engine.config.recipes import ConfigError

    adam = {"optimizer": {"type": "Adam", "params": {"lr": 1e-3}}}
    for name in ("OneBitAdam", "OneBitLamb", "ZeroOneAdam"):
        with pytest.raises(ConfigError, match=r"removed from DeepSpeed 0\.19\.7; use the `tsm_ds.compression`"):
            validate_config({"optimizer": {"type": name, "params": {"lr": 1e-3}}}, {}, device="cpu",
                            has_batchnorm=False)
    with pytest.raises(ConfigError, match="`tsm_ds.compression` needs ZeRO stage 0"):
        validate_config({**adam, "zero_optimization": {"stage": 2}}, {"compression": {"type": "onebit"}},
                        device="cpu", has_batchnorm=False)
    with pytest.raises(ConfigError, match="tsm_ds.compression: unknown key"):
        validate_config(adam, {"compression": {"type": "onebit", "freeze": 3}}, device="cpu", has_batchnorm=False)
    validate_config({**adam, "zero_optimization": {"stage": 2}}, {"compression": {"type": "none"}},
                    device="cpu", has_batchnorm=False)

    class ZeroEngine:
        def zero_optimization_stage(self):
            return 1
    with pytest.raises(ValueError, match="got stage 1"):
        build_compressor({"type": "onebit"}, ZeroEngine())


@pytest.mark.parametrize("name", ["cpu_fp32_onebit.json", "gpu_autocast_bf16_onebit.json"])
def test_recipe_files_are_valid(name):
    import json
    from pathlib import Path
    cfg = json.loads((Path(__file__).resolve().parents[2] / "ds_configs" / name).read_text())
    from tsm_ds.engine.config.checks import validate_config
    validate_config({k: v for k, v in cfg.items() if k != "tsm_ds"}, cfg["tsm_ds"],
                    device="cuda" if name.startswith("gpu") else "cpu", has_batchnorm=True)
    assert C.parse_compression_block(cfg["tsm_ds"]["compression"]) == {"type": "onebit", "freeze_step": 100,
                                                                       "chunk_size": 1024}
    # the compressor needs fp32 gradients in p.grad at ZeRO 0 (the trainer refuses bf16/fp16 modes)
    assert cfg["zero_optimization"]["stage"] == 0 and "bf16" not in cfg and "fp16" not in cfg


# ------------------------------------------------------------------------------ two gloo ranks

def _spawn(fn, *args):
    mp.spawn(_entry, args=(fn, free_port(), args), nprocs=2, join=True)


def _entry(rank, fn, port, args):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        fn(rank, *args)
    finally:
        dist.destroy_process_group()


def _gather(x: torch.Tensor) -> list[torch.Tensor]:
    out = [torch.empty_like(x) for _ in range(2)]
    dist.all_gather(out, x)
    return out


def _identity_worker(rank):
    sizes, chunk, freeze, steps = (300, 7, 696), 64, 2, 14
    n = sum(sizes)
    params = [torch.nn.Parameter(torch.zeros(k, dtype=torch.float64)) for k in sizes]
    comp = OneBitCompressor(freeze_step=freeze, chunk_size=chunk, dtype=torch.float64, trace=True)
    g = torch.Generator().manual_seed(100 + rank)
    sum_in = torch.zeros(n, dtype=torch.float64)
    sum_sent = torch.zeros(n, dtype=torch.float64)
    for t in range(steps):
        x = torch.randn(n, generator=g, dtype=torch.float64) * (1 + t % 3)
        x[300:307] *= 1e-3                                 # a "bias" 1000x smaller: its own chunk
        for p, part in zip(params, x.split(sizes)):
            p.grad = part.clone()
        comp.allreduce(params)
        out = torch.cat([p.grad for p in params])
        both_in = _gather(x)
        outs = _gather(out)
        assert torch.equal(outs[0], outs[1]), "ranks disagree on the averaged gradient"
        if t < freeze:
            assert comp.stats()["compression/phase"] == 0.0
            assert torch.equal(out, (both_in[0] + both_in[1]) / 2)      # same ops as gloo's sum / 2
            assert comp.worker_error.abs().max() == 0
            continue
        lay = comp.layout
        ex = comp.last_exchange
        assert comp.stats()["compression/phase"] == 1.0
        assert torch.equal(ex["input"], x)
        sum_in += x
        sent_padded = decode_scaled_sign(ex["worker_packed"], ex["worker_scales"], lay.c, torch.float64)
        sent = lay.gather(sent_padded)                                    # padding is not gradient
        sum_sent += sent
        # the small tensor's chunk has its own scale: what it sends is ~1e-3, not the others' ~1
        assert sent[300:307].abs().max() < 0.05
        # the server input is the mean of the two ranks' decoded messages for this rank's segment
        sents = _gather(sent_padded)
        seg = slice(rank * lay.seg, (rank + 1) * lay.seg)
        mean = torch.zeros(lay.seg, dtype=torch.float64)
        mean.add_(sents[0][seg]).add_(sents[1][seg]).div_(2).index_fill_(0, comp._pad_idx_seg, 0)
        assert torch.equal(ex["server_input"], mean)
        # the output is the decode of the all-gathered server messages
        s_bits, s_scales = _gather(ex["server_packed"]), _gather(ex["server_scales"])
        dec = decode_scaled_sign(torch.cat(s_bits), torch.cat(s_scales), lay.c, torch.float64)
        assert torch.equal(lay.gather(dec), out) and torch.equal(ex["output"], out)
        if t == freeze:
            server_in_sum = torch.zeros(lay.seg, dtype=torch.float64)
            server_out_sum = torch.zeros(lay.seg, dtype=torch.float64)
        server_in_sum += ex["server_input"]
        server_out_sum += decode_scaled_sign(ex["server_packed"], ex["server_scales"], lay.c, torch.float64)
    # worker identity: transmitted + final error == inputs (error buffers start at zero)
    err = (sum_sent + lay.gather(comp.worker_error) - sum_in).abs().max().item()
    assert err < TOL, err
    assert comp.worker_error[lay.pad_index()].abs().max() == 0
    # the error is not trivially zero: compression really lost something each step
    assert comp.worker_error.abs().max() > 0.1
    # server identity on this rank's segment (padding decodes to +-scale; it is not gradient)
    server_out_sum.index_fill_(0, comp._pad_idx_seg, 0)
    err = (server_out_sum + comp.server_error - server_in_sum).abs().max().item()
    assert err < TOL, err
    # bytes: 2 (w-1)/w * (bits + scales) vs 2 (w-1)/w * 4n for fp32
    st = comp.stats()
    k = lay.k
    assert st["compression/bytes_sent"] == 0.5 * (lay.padded // 8 + 2 * k * 8) + (lay.seg // 8 + k * 8)
    assert st["compression/bytes_fp32_allreduce"] == 4 * n
    # an inf on one rank: full-precision fallback, every rank sees it, error buffers untouched
    ew, es, step = comp.worker_error.clone(), comp.server_error.clone(), comp.step
    x = torch.randn(n, generator=g, dtype=torch.float64)
    if rank == 1:
        x[5] = float("inf")
    for p, part in zip(params, x.split(sizes)):
        p.grad = part.clone()
    comp.allreduce(params)
    out = torch.cat([p.grad for p in params])
    assert comp.stats()["compression/phase"] == -1.0 and comp.step == step + 1
    assert out[5] == float("inf") and torch.isfinite(out[6:]).all()
    assert torch.equal(comp.worker_error, ew) and torch.equal(comp.server_error, es)


def test_error_feedback_identity_two_ranks():
    _spawn(_identity_worker)


def _resume_worker(rank, tmp):
    n = 517
    g = torch.Generator().manual_seed(7 + rank)
    xs = [torch.randn(n, generator=g) for _ in range(10)]
    a = OneBitCompressor(freeze_step=2, chunk_size=32)
    for x in xs[:6]:
        a.allreduce_flat(x)
    path = os.path.join(tmp, f"rank{rank}.pt")
    torch.save({"compressor": a.state_dict()}, path)
    outs_a = [a.allreduce_flat(x) for x in xs[6:]]

    b = OneBitCompressor(freeze_step=2, chunk_size=32)
    b.load_state_dict(torch.load(path)["compressor"])
    assert b.step == 6
    b_first = b.allreduce_flat(xs[6])
    assert torch.equal(b_first, outs_a[0])
    outs_b = [b_first] + [b.allreduce_flat(x) for x in xs[7:]]
    for oa, ob in zip(outs_a, outs_b):
        assert torch.equal(oa, ob)
    assert torch.equal(a.worker_error, b.worker_error) and torch.equal(a.server_error, b.server_error)
    assert a.worker_error.abs().max() > 0

    # loading restores buffers at once when the layout is known
    c = OneBitCompressor(freeze_step=2, chunk_size=32)
    c.allreduce_flat(xs[0])
    sd = torch.load(path)["compressor"]
    c.load_state_dict(sd)
    assert torch.equal(c.worker_error, sd["worker_error"]) and torch.equal(c.server_error, sd["server_error"])
    with pytest.raises(ValueError, match="chunk_size=32 but this run has 64"):
        OneBitCompressor(freeze_step=2, chunk_size=64).load_state_dict(sd)
    d = OneBitCompressor(freeze_step=2, chunk_size=32)
    d.load_state_dict(sd)
    with pytest.raises(ValueError, match="checkpoint has 517 gradient elements"):
        d.allreduce_flat(torch.zeros(12))

    # allreduce(params): grads averaged in place, missing grads created, ranks identical
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Linear(7, 3), torch.nn.Linear(3, 3))
    comp = OneBitCompressor(freeze_step=1, chunk_size=16)
    for step in range(3):
        model.zero_grad(set_to_none=True)
        x = torch.randn(4, 5, generator=g)
        model[1](model[0](x)).pow(2).sum().backward()        # model[2] gets no gradient
        local = [p.grad.clone() for p in model[:2].parameters()]
        comp.allreduce(model.parameters())
        if step == 0:
            for p, lg in zip(model[:2].parameters(), local):
                assert torch.allclose(p.grad, (_gather(lg)[0] + _gather(lg)[1]) / 2, rtol=0, atol=1e-6)
        for p in model.parameters():
            gs = _gather(p.grad)
            assert torch.equal(gs[0], gs[1])
        assert model[2].weight.grad is not None
    with pytest.raises(ValueError, match="parameter shapes differ"):
        comp.allreduce(model[:2].parameters())


def test_resume_restores_error_buffers_exactly_two_ranks():
    with tempfile.TemporaryDirectory() as tmp:
        _spawn(_resume_worker, tmp)
