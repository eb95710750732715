"""Error-feedback 1-bit gradient compression for the DeepSpeed engine's data-parallel all-reduce.

DeepSpeed deleted its 1-bit optimizers (OneBitAdam, OneBitLamb, ZeroOneAdam) in 0.19.7, and even
0.19.6 needed CUDA + cupy. This module replaces the engine's gradient all-reduce (ZeRO stage 0)
with a compressed one that runs on any ``torch.distributed`` backend (gloo on CPU, NCCL on GPU).

Algorithm (one call of :meth:`OneBitCompressor.allreduce` = one optimizer step):

* Steps ``0 .. freeze_step-1`` (warm-up): plain all-reduce of the flat gradient in the engine's
  ``communication_data_type`` (fp32 unless the recipe asks for bf16/fp16), then divide by the world size.
* Later steps: the 1-bit compressed all-reduce of 1-bit Adam (Tang et al. 2021, arXiv 2102.02888,
  Sec. 4 "compressed allreduce"; DeepSpeed <= 0.19.6 ``runtime/comm/nccl.py``), applied to the
  gradient as in 1-bit SGD (Seide et al. 2014) / EF-SignSGD (Karimireddy et al. 2019, Alg. 2):

  1. worker: ``v = g + e_w`` (gradient + worker error buffer); per chunk of ``d`` elements a scale
     ``s = ||v_chunk||_2 / sqrt(d)``; transmitted ``q = s * sign(v)`` (sign(0) = +1, as 1-bit Adam);
     ``e_w <- v - q``. Signs go as bits packed 8 per byte.
  2. all-to-all: rank r receives every worker's bits and scales for its own segment r of the flat
     buffer (the buffer is split in ``world_size`` equal segments).
  3. server (rank r, segment r): ``u = mean_over_workers(q) + e_s``; the same scaled-sign step with
     the server error buffer ``e_s``; the result's bits and scales are all-gathered.
  4. every rank decodes the all-gathered segments: the averaged gradient, identical on all ranks.

  Bytes sent per rank and step (ring/pairwise models): 2 (w-1)/w * n/8 bytes of bits + scales,
  against 2 (w-1)/w * 4n for an fp32 ring all-reduce: about 1/32.

Error-feedback identity (what the tests check): per rank, sum over steps of the transmitted
``q`` + the final ``e_w`` equals the sum of the gradients it was given (plus the initial ``e_w``);
on the server side, sum of the broadcast ``q_s`` + final ``e_s`` equals the sum of the decoded
worker averages. Both hold up to floating-point rounding of one subtraction per step.

JSON (``ds_config["tsm_ds"]["compression"]``, read by the trainer)::

    {"type": "onebit", "freeze_step": 100, "chunk_size": 1024}

* ``type`` (required): ``"none"`` (or the block absent) -> DeepSpeed's own all-reduce;
  ``"onebit"`` -> this compressor.
* ``freeze_step`` (int >= 0, default 100): full-precision warm-up steps, counted in optimizer steps
  (gradient-accumulation boundaries), as 1-bit Adam's ``freeze_step``. The count is part of the
  checkpointed state, so a resumed run does not redo the warm-up.
* ``chunk_size`` (int >= 8, default 1024; rounded up to a multiple of 8): elements per fp32
  scale. Chunks never straddle two parameter tensors (each tensor is zero-padded to whole chunks;
  empty chunks pad the count to a multiple of the world size), so a BatchNorm bias never shares a
  scale with a conv weight. Cost: 4 bytes of scale per chunk_size/8 bytes of bits (3.1 % at 1024)
  plus < chunk_size padding elements per tensor (TSM-R50: 161 tensors, 0.3 % at 1024). Smaller
  chunks track the gradient's magnitudes more closely: on the 3-layer MLP of
  ``python studies/compression_study.py`` (SGD momentum 0.9, 300 steps) final losses were
  0.25 / 0.18 / 0.13 / 0.09 at 65536 / 4096 / 1024 / 256 against 0.047 uncompressed.

Precision and ZeRO:

* ZeRO stage 0 only. ZeRO >= 1 reduce (reduce-scatter) the gradients inside their own optimizer,
  so there is no all-reduce left to replace: :func:`build_compressor` and
  :func:`tsm_ds.engine.config.checks.validate_config` raise ``ValueError`` saying so.
* fp32 gradients (fp32 engine, or ``torch_autocast`` which keeps fp32 parameters): compressed in
  fp32. bf16/fp16 engines at ZeRO 0 (DeepSpeed's FP16_Optimizer keeps bf16/fp16 gradients in
  ``p.grad``): the gradient is copied to fp32, divided by the optimizer's current loss scale (fp16
  dynamic scaling; 1 for bf16), compressed, multiplied back and written in the gradient's dtype;
  the error buffers stay fp32 in unscaled units, so a loss-scale change does not corrupt them.
  The bf16 path is tested here (CPU); fp16 cannot run on this CPU and is untested.
* A compressed step whose (gradient + error) holds inf/NaN on any rank (one 4-byte all-reduce
  checks) is all-reduced at full precision instead, so every rank sees the non-finite values and an
  fp16 optimizer skips the step on all of them; the error buffers are left as they were.
* ``communication_data_type`` applies to the warm-up all-reduce only.

Optimizers: error feedback is analysed for SGD (Karimireddy et al. 2019, Thm. II: EF-SignSGD
converges at the SGD rate; DoubleSqueeze, Tang et al. 2019, for the two-pass worker + server
compression used here). Momentum SGD (the TSM recipe) applies momentum to the decompressed average,
as 1-bit SGD did. Measured on the MLP study it trains, with a gap to the uncompressed loss that
grows with chunk_size (see above); without momentum the gap vanished (0.80 vs 0.79), and the tiny
MLP of tests/engine/test_compression_launcher.py ends within 1 % of fp32 with momentum. LAMB and LARS compute layer-wise
trust ratios ``||w|| / ||update||`` and LAMB a per-coordinate second moment: after
``freeze_step`` they see scaled-sign gradients, flat in magnitude within each chunk, whose
per-chunk L2 norm is that of (gradient + error buffer), not of the gradient. LAMB's variance then
loses its per-coordinate information (1-bit Adam / 1-bit LAMB avoid this by freezing the variance
and compressing the momentum instead) and the trust ratios follow the error buffer's swings. No
convergence guarantee carries over. Measured in the MLP study: timm Lamb reached the same loss
compressed (0.138 vs 0.141), timm Lars diverged (4.8 vs 2.1; it hardly trained uncompressed either).
With LAMB/LARS prefer a long ``freeze_step`` or bf16 communication.

The tensor math (sign packing, :class:`ChunkLayout`, per-chunk scales, the scaled-sign quantiser)
lives in :mod:`tsm_ds.engine.comm.onebit`; its names are re-exported here.

Kept whole: 80 of its lines are this description (the algorithm, its JSON, its limits), and the
tensor math is already apart.
"""
from __future__ import annotations

import time
from typing import Any, Iterable, Mapping

import torch
import torch.distributed as dist

# re-exported (the public names are in __all__; _pack_bits_torch for tests/engine/test_compression.py)
from tsm_ds.engine.comm.onebit import (  # noqa: F401
    ChunkLayout,
    _pack_bits_torch,
    chunk_scales,
    decode_scaled_sign,
    pack_signs,
    quantise_,
    scaled_sign,
    unpack_signs,
)

__all__ = [
    "parse_compression_block", "build_compressor", "pack_signs", "unpack_signs",
    "ChunkLayout", "chunk_scales", "quantise_", "scaled_sign", "decode_scaled_sign", "OneBitCompressor",
]

_DEFAULTS = {"type": "onebit", "freeze_step": 100, "chunk_size": 1024}
_STATE_VERSION = 1


# ----------------------------------------------------------------------------------------------
# configuration


def _zero_message(stage: int) -> str:
    return (f"tsm_ds.compression.type 'onebit' needs zero_optimization.stage 0, got stage {stage}: ZeRO "
            "stages >= 1 reduce (reduce-scatter) the gradients inside their own optimizer, so there is no "
            "data-parallel all-reduce left to compress. Set zero_optimization.stage to 0 or set "
            'tsm_ds.compression to {"type": "none"}.')


def parse_compression_block(block: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Validated copy of the ``tsm_ds.compression`` block with defaults filled in; None for
    "none" / absent. Called by :func:`tsm_ds.engine.config.checks.validate_config` (the one
    validator) and by :func:`build_compressor`.

    Raises:
        ValueError: not an object, no / unknown ``type``, unknown keys, or bad values (named).
    """
    if block is None or block == "none":
        return None
    if not isinstance(block, Mapping):
        raise ValueError(f"tsm_ds.compression must be a JSON object, got {type(block).__name__}")
    if "type" not in block:
        raise ValueError('tsm_ds.compression.type is required: "onebit" (compressed all-reduce) or "none"')
    kind = block["type"]
    if kind == "none":
        return None
    if kind != "onebit":
        raise ValueError(f"tsm_ds.compression.type {kind!r} is not supported: use 'onebit' or 'none'")
    unknown = sorted(set(block) - set(_DEFAULTS))
    if unknown:
        raise ValueError(f"tsm_ds.compression: unknown key(s) {unknown}; allowed: {sorted(_DEFAULTS)}")
    cfg = {**_DEFAULTS, **block}
    for key, low in (("freeze_step", 0), ("chunk_size", 8)):
        val = cfg[key]
        if isinstance(val, bool) or not isinstance(val, int) or val < low:
            raise ValueError(f"tsm_ds.compression.{key} must be an integer >= {low}, got {val!r}")
    return cfg


def build_compressor(cfg_block: Mapping[str, Any] | None, engine: Any = None) -> "OneBitCompressor | None":
    """The trainer's hook: a compressor for ``ds_config["tsm_ds"]["compression"]``, or None.

    Args:
        cfg_block: the JSON block (see the module docstring); None or ``{"type": "none"}`` -> None.
        engine: the DeepSpeed engine (its data-parallel group, ZeRO stage, communication dtype and
            fp16 loss scale are read from it); None uses the default process group (tests, bench).

    Returns:
        None or a :class:`OneBitCompressor`. The caller sets ``engine.enable_backward_allreduce =
        False`` and calls ``compressor.allreduce(engine.module.parameters())`` between
        ``engine.backward`` and ``engine.step`` at gradient-accumulation boundaries.

    Raises:
        ValueError: invalid block (names the key), or the engine runs ZeRO stage >= 1.
    """
    cfg = parse_compression_block(cfg_block)
    if cfg is None:
        return None
    group = None
    if engine is not None:
        stage = int(engine.zero_optimization_stage()) if hasattr(engine, "zero_optimization_stage") else 0
        if stage >= 1:
            raise ValueError(_zero_message(stage))
        try:
            from deepspeed.utils import groups
            group = groups._get_sequence_data_parallel_group()
        except Exception:  # deepspeed not initialised with groups: the world is the DP group
            group = None
    return OneBitCompressor(freeze_step=cfg["freeze_step"], chunk_size=cfg["chunk_size"],
                            group=group, engine=engine)


# ----------------------------------------------------------------------------------------------
# the compressor


def _loss_scale(engine: Any) -> float:
    """The fp16/bf16 optimizer's current loss scale (1.0 for fp32 or no engine)."""
    if engine is None or not (getattr(engine, "fp16_enabled", lambda: False)()
                              or getattr(engine, "bfloat16_enabled", lambda: False)()):
        return 1.0
    opt = getattr(engine, "optimizer", None)
    cfg = getattr(opt, "loss_scale_config", None)
    scale = getattr(cfg, "cur_scale", None) or getattr(opt, "cur_scale", None)
    return float(scale) if scale else 1.0


class OneBitCompressor:
    """Error-feedback 1-bit compressed all-reduce of all gradients (see the module docstring).

    Args:
        freeze_step: full-precision warm-up steps (>= 0).
        chunk_size: elements per scale (>= 8, rounded up to a multiple of 8); chunks never
            straddle two parameter tensors (:class:`ChunkLayout`).
        group: data-parallel ``torch.distributed`` process group (None: the default group).
        engine: DeepSpeed engine or None; read for communication_data_type (warm-up) and the
            fp16/bf16 optimizer's loss scale.
        dtype: buffer dtype for compression and error buffers (float32; float64 in exactness tests).
        trace: keep the tensors of the last compressed exchange in ``self.last_exchange`` (tests).

    State: ``step`` (calls so far), ``worker_error`` (padded,) and ``server_error`` (seg,) of this
    rank, both in ``dtype`` and zero at padding positions. Memory: about 4 padded-size buffers
    (staging, worker error, decode scratch, bool bits) + 2 segment-size ones: ~5x the fp32
    gradient (TSM-R50: ~0.5 GB per rank). Each rank saves and restores its own
    (:meth:`state_dict`).

    Raises:
        RuntimeError: torch.distributed is not initialised.
    """

    def __init__(self, *, freeze_step: int = 100, chunk_size: int = 1024, group=None, engine=None,
                 dtype: torch.dtype = torch.float32, trace: bool = False):
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("OneBitCompressor needs torch.distributed initialised (deepspeed.initialize "
                               "or deepspeed.init_distributed does it)")
        self.freeze_step = int(freeze_step)
        self.chunk_size = int(chunk_size)
        self.group = group
        self.engine = engine
        self.dtype = dtype
        self.trace = trace
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.step = 0
        self.layout: ChunkLayout | None = None
        self.worker_error: torch.Tensor | None = None
        self.server_error: torch.Tensor | None = None
        self._shapes: list[tuple[int, ...]] | None = None
        self._pending_state: dict[str, Any] | None = None
        self._stats: dict[str, float] = {}
        self.last_exchange: dict[str, torch.Tensor] = {}

    # -- public API ---------------------------------------------------------------------------

    def allreduce(self, params: Iterable[torch.nn.Parameter]) -> None:
        """Average ``p.grad`` in place over the data-parallel group (compressed after freeze_step).

        Args:
            params: the model parameters, same order and shapes on every rank and every call;
                those with ``requires_grad`` and numel > 0 take part; a missing grad counts as
                zeros and is created (as DeepSpeed's own all-reduce does). Gradients of any float
                dtype are compressed in ``self.dtype`` and written back in their own dtype.

        Raises:
            ValueError: the parameter shapes changed since the first call or since the checkpoint.
        """
        params = [p for p in params if p.requires_grad and p.numel() > 0]
        shapes = [tuple(p.shape) for p in params]
        if self._shapes is None:
            self._shapes = shapes
        elif shapes != self._shapes:
            raise ValueError("OneBitCompressor.allreduce: parameter shapes differ from the first call; "
                             "the error buffers are laid out per parameter order and cannot follow")
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        grads = [p.grad for p in params]
        self._ensure_layout(tuple(g.numel() for g in grads), grads[0].device)
        self.layout.scatter(grads, self._buf)
        scale = _loss_scale(self.engine)
        if scale != 1.0:
            self._buf.div_(scale)
        out = self._reduce()
        if scale != 1.0:
            out.mul_(scale)
        for g, off, n in zip(grads, self.layout.offsets, self.layout.sizes):
            g.copy_(out[off:off + n].view_as(g))

    def allreduce_flat(self, flat: torch.Tensor) -> torch.Tensor:
        """Average a flat gradient (n,) over the group; returns a new (n,) tensor; advances ``step``.

        The flat tensor is one "parameter" for chunking (chunks may mix its parts). Warm-up steps
        all-reduce in the engine's communication dtype; later steps run the two-phase 1-bit
        exchange. A step with inf/NaN on any rank is all-reduced at full precision and leaves the
        error buffers as they were.

        Raises:
            ValueError: ``flat`` is not 1-D or its size differs from earlier calls / the checkpoint.
        """
        if flat.dim() != 1:
            raise ValueError(f"allreduce_flat needs a 1-D tensor, got shape {tuple(flat.shape)}")
        self._ensure_layout((flat.numel(),), flat.device)
        self.layout.scatter([flat], self._buf)
        return self.layout.gather(self._reduce())

    def _reduce(self) -> torch.Tensor:
        """Reduce the staging buffer ``self._buf``; returns the padded average (may alias buffers)."""
        t0 = time.perf_counter()
        lay, w = self.layout, self.world_size
        ref_bytes = 2.0 * (w - 1) / w * 4 * lay.n
        self._stats = {}
        if self.step < self.freeze_step:
            out, sent = self._full_allreduce(self._buf, self._comm_dtype())
            phase = 0.0
        else:
            out, sent = self._compressed()
            phase = 1.0 if out is not None else -1.0
            if out is None:                               # inf/NaN somewhere: full precision, no EF update
                out, sent = self._full_allreduce(self._buf, self.dtype)
        self.step += 1
        total = time.perf_counter() - t0
        self._stats.update({"compression/phase": phase, "compression/bytes_sent": float(sent),
                            "compression/bytes_fp32_allreduce": ref_bytes,
                            "compression/ratio": ref_bytes / sent if sent else float("nan"),
                            "compression/time_s": total, "compression/step": float(self.step)})
        return out

    def stats(self) -> dict[str, float]:
        """Figures of the last step (for TensorBoard); bytes per rank under the ring/pairwise model.

        Keys: ``compression/phase`` (0 warm-up, 1 compressed, -1 inf/NaN fallback),
        ``compression/bytes_sent`` (bytes this rank sent), ``compression/bytes_fp32_allreduce``
        (what an fp32 ring all-reduce sends: 2 (w-1)/w * 4n), ``compression/ratio`` (the two's
        ratio), ``compression/time_s`` (seconds in allreduce), ``compression/compress_s`` and
        ``compression/comm_s`` (compressed steps: local quantise/pack/decode vs collectives),
        ``compression/step``. Empty before the first call.
        """
        return dict(self._stats)

    def state_dict(self) -> dict[str, Any]:
        """Per-rank state: step, config, layout and the error buffers (cloned, CPU)."""
        lay = self.layout
        return {
            "version": _STATE_VERSION, "type": "onebit", "step": self.step,
            "freeze_step": self.freeze_step, "chunk_size": self.chunk_size,
            "world_size": self.world_size, "rank": self.rank,
            "numel": None if lay is None else lay.n,
            "sizes": None if lay is None else list(lay.sizes),
            "worker_error": None if self.worker_error is None else self.worker_error.detach().cpu().clone(),
            "server_error": None if self.server_error is None else self.server_error.detach().cpu().clone(),
        }

    def load_state_dict(self, sd: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` output of the same rank (error buffers copied exactly).

        Raises:
            ValueError: other version/type, world size, rank, chunk_size, or gradient size
                (checked at once when known, else at the first :meth:`allreduce`).
        """
        if sd.get("type") != "onebit" or sd.get("version") != _STATE_VERSION:
            raise ValueError(f"compressor state: expected type 'onebit' version {_STATE_VERSION}, "
                             f"got {sd.get('type')!r} version {sd.get('version')!r}")
        for key, mine in (("world_size", self.world_size), ("rank", self.rank), ("chunk_size", self.chunk_size)):
            if sd[key] != mine:
                raise ValueError(f"compressor state: checkpoint {key}={sd[key]} but this run has {mine}; the "
                                 "error buffers are per rank and per layout. Resume with the same world size "
                                 "and tsm_ds.compression.chunk_size, or drop the 'compressor' key to start "
                                 "from zero error buffers")
        self.step = int(sd["step"])
        self._pending_state = dict(sd)
        if self.layout is not None:
            self._apply_pending(self.layout.sizes, self.worker_error.device)

    # -- internals ----------------------------------------------------------------------------

    def _comm_dtype(self) -> torch.dtype:
        if self.engine is not None and hasattr(self.engine, "communication_data_type"):
            return self.engine.communication_data_type
        return self.dtype

    def _ensure_layout(self, sizes: tuple[int, ...], device) -> None:
        if self.layout is None:
            lay = self.layout = ChunkLayout.build(sizes, self.world_size, self.chunk_size)
            self.worker_error = torch.zeros(lay.padded, dtype=self.dtype, device=device)
            self.server_error = torch.zeros(lay.seg, dtype=self.dtype, device=device)
            self._buf = torch.zeros(lay.padded, dtype=self.dtype, device=device)
            self._q = torch.empty(lay.padded, dtype=self.dtype, device=device)
            self._bits = torch.empty(lay.padded, dtype=torch.bool, device=device)
            self._m = torch.empty(lay.seg, dtype=self.dtype, device=device)
            self._counts = lay.counts(self.dtype, device)
            pad = lay.pad_index()
            lo, hi = self.rank * lay.seg, (self.rank + 1) * lay.seg
            self._pad_idx = pad.to(device)
            self._pad_idx_seg = (pad[(pad >= lo) & (pad < hi)] - lo).to(device)
            if self._pending_state is not None:
                self._apply_pending(sizes, device)
        elif self.layout.sizes != tuple(sizes):
            raise ValueError(f"OneBitCompressor: gradient tensors ({len(sizes)} tensors, {sum(sizes)} elements) "
                             f"differ from the error buffers' layout ({len(self.layout.sizes)} tensors, "
                             f"{self.layout.n} elements)")

    def _apply_pending(self, sizes: tuple[int, ...], device) -> None:
        sd, self._pending_state = self._pending_state, None
        n = sum(sizes)
        if (sd.get("numel") is not None and sd["numel"] != n) or (
                sd.get("sizes") is not None and tuple(sd["sizes"]) != tuple(sizes)):
            raise ValueError(f"compressor state: checkpoint has {sd['numel']} gradient elements in "
                             f"{len(sd.get('sizes') or [])} tensors, the model {n} in {len(sizes)}; the "
                             "checkpoint belongs to another model")
        if sd.get("worker_error") is not None:
            self.worker_error.copy_(sd["worker_error"].to(device=device, dtype=self.dtype))
            self.server_error.copy_(sd["server_error"].to(device=device, dtype=self.dtype))

    def _full_allreduce(self, x: torch.Tensor, dtype: torch.dtype):
        """All-reduce ``x`` (n,) in ``dtype`` in place and divide by the world size."""
        w = self.world_size
        if dtype == x.dtype:
            dist.all_reduce(x, group=self.group)
            x.div_(w)
            return x, 2.0 * (w - 1) / w * x.numel() * x.element_size()
        low = x.to(dtype)
        dist.all_reduce(low, group=self.group)
        x.copy_(low).div_(w)
        return x, 2.0 * (w - 1) / w * low.numel() * low.element_size()

    def _compressed(self):
        """Two-phase 1-bit exchange of ``self._buf``; None (nothing changed) when any rank has inf/NaN."""
        lay, w, r, c = self.layout, self.world_size, self.rank, self.layout.c
        t0 = time.perf_counter()
        v = self._buf
        trace_in = lay.gather(v) if self.trace else None
        v.add_(self.worker_error)                             # v = g + e_w  (padding stays 0)
        w_scales = chunk_scales(v, self._counts, c)
        ok = torch.tensor([1 if bool(torch.isfinite(w_scales).all()) else 0], dtype=torch.int32,
                          device=v.device)
        dist.all_reduce(ok, op=dist.ReduceOp.MIN, group=self.group)
        if int(ok.item()) == 0:
            return None, 0.0
        w_packed = quantise_(v, w_scales, c, self._pad_idx, q_buf=self._q, bits_buf=self._bits)  # v -> new e_w
        self._buf, self.worker_error = self.worker_error, v  # the old error buffer stages the next step
        t1 = time.perf_counter()
        recv_bits = torch.empty_like(w_packed)
        dist.all_to_all_single(recv_bits, w_packed, group=self.group)
        recv_scales = torch.empty_like(w_scales)
        dist.all_to_all_single(recv_scales, w_scales, group=self.group)
        t2 = time.perf_counter()
        # server: mean of the workers' decoded messages for segment r, plus the server error
        dec = decode_scaled_sign(recv_bits, recv_scales, c, self.dtype, out=self._q).view(w, lay.seg)
        m = self._m.copy_(dec[0])
        for src in range(1, w):                               # fixed order: the same sum every run
            m.add_(dec[src])
        m.div_(w)
        if self._pad_idx_seg.numel():
            m.index_fill_(0, self._pad_idx_seg, 0)
        server_input = m.clone() if self.trace else None
        u = m.add_(self.server_error)
        s_scales = chunk_scales(u, self._counts[r * lay.k:(r + 1) * lay.k], c)
        s_packed = quantise_(u, s_scales, c, self._pad_idx_seg, q_buf=self._q[:lay.seg],
                             bits_buf=self._bits[:lay.seg])
        self._m, self.server_error = self.server_error, u
        t3 = time.perf_counter()
        all_bits = [torch.empty_like(s_packed) for _ in range(w)]
        dist.all_gather(all_bits, s_packed, group=self.group)
        all_scales = [torch.empty_like(s_scales) for _ in range(w)]
        dist.all_gather(all_scales, s_scales, group=self.group)
        t4 = time.perf_counter()
        out = decode_scaled_sign(torch.cat(all_bits), torch.cat(all_scales), c, self.dtype, out=self._q)
        t5 = time.perf_counter()
        if self.trace:
            self.last_exchange = {"input": trace_in, "worker_packed": w_packed, "worker_scales": w_scales,
                                  "recv_packed": recv_bits, "recv_scales": recv_scales,
                                  "server_input": server_input, "server_packed": s_packed,
                                  "server_scales": s_scales, "output": lay.gather(out)}
        esz = w_scales.element_size()
        sent = ((w - 1) / w * (w_packed.numel() + w_scales.numel() * esz)
                + (w - 1) * (s_packed.numel() + s_scales.numel() * esz))
        self._stats.update({"compression/compress_s": (t1 - t0) + (t3 - t2) + (t5 - t4),
                            "compression/comm_s": (t2 - t1) + (t4 - t3)})
        return out, sent
