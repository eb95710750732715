"""Ready for the first GPU (issue 37), tested on the CPU: each GPU behaviour through the rule that
decides it (loaders, host syncs, collective devices, timeouts, fp16 pre-division, the shift's kernel
count, the nvJPEG fallback and stream hazard) and the crashes found by review."""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

from tsm_ds.engine.loop.loaders import CPU_DEFAULT_WORKERS, GPU_MAX_WORKERS, default_num_workers, loader_options


# ---------------------------------------------------------------- loaders
def test_workers_per_rank_from_the_cores_per_gpu():
    assert default_num_workers(None, cuda=False, cores=64, local_ranks=8) == CPU_DEFAULT_WORKERS == 2
    assert default_num_workers(None, cuda=True, cores=128, local_ranks=8) == 15 - 3 == GPU_MAX_WORKERS  # capped
    assert default_num_workers(None, cuda=True, cores=64, local_ranks=8) == 7    # 8 cores a GPU, 1 for the rank
    assert default_num_workers(None, cuda=True, cores=4, local_ranks=4) == 2     # at least 2
    assert default_num_workers(0, cuda=True, cores=64, local_ranks=8) == 0       # the user's value wins
    with pytest.raises(ValueError, match="--num-workers -1"):
        default_num_workers(-1, cuda=False, cores=2, local_ranks=1)


def test_loader_options_pin_and_keep_workers_on_cuda_only():
    assert loader_options(4, cuda=True) == {"pin_memory": True, "persistent_workers": True, "prefetch_factor": 4}
    assert loader_options(0, cuda=True) == {"pin_memory": True, "persistent_workers": False}
    assert loader_options(2, cuda=False) == {"pin_memory": False, "persistent_workers": False}


class _Epochs(torch.utils.data.Dataset):
    """Items that depend on (epoch, index) only; the epoch in shared memory like VideoClipDataset's."""

    def __init__(self, n=6):
        self.n, self._epoch = n, torch.zeros(1, dtype=torch.int64).share_memory_()

    def set_epoch(self, e):
        self._epoch[0] = e

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"clip": torch.full((2,), float(100 * int(self._epoch[0]) + i)), "label": i % 2, "index": i,
                "bad": 0, "bad_files": ""}


def test_persistent_workers_give_the_batches_of_fresh_workers_every_epoch():
    """The GPU loaders keep their workers across epochs: the epoch still reaches them, and every
    epoch's batches equal those of the CPU loaders (workers forked per epoch)."""
    from tsm_ds.engine.loop.loaders import build_loaders

    def epochs(cuda):
        ds = _Epochs()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # pin_memory without a GPU: torch warns and skips it
            sampler, gen, loader, _ = build_loaders(ds, None, micro=2, world=1, rank=0, seed=3, num_workers=2,
                                                    cuda=cuda)
            assert loader.persistent_workers == cuda
            out = []
            for e in range(3):
                sampler.set_epoch(e)
                ds.set_epoch(e)
                gen.manual_seed(3 * 100_003 + e)
                out.append([b["clip"].tolist() for b in loader])
        return out

    fresh, kept = epochs(False), epochs(True)
    assert fresh == kept and fresh[0] != fresh[1]
    assert sorted(v[0] for b in kept[2] for v in b) == [200.0 + i for i in range(6)]


# ---------------------------------------------------------------- no host sync per micro-batch
def test_step_stats_sum_on_the_device_without_reading_it():
    """Meta tensors cannot be read on the host: the micro-batch sums work on them, only as_list reads."""
    from tsm_ds.engine.loop.metrics import StepStats

    acc = StepStats()
    for _ in range(3):
        logits, label = torch.empty(4, 7, device="meta"), torch.empty(4, dtype=torch.long, device="meta")
        acc.add_loss(torch.empty((), device="meta"), 4)
        acc.add_batch(logits, label, bad=0, data_s=0.1, compute_s=0.2, comm_s=0.0)
    assert acc.clips == 12 and acc.loss_sum.device.type == "meta" and acc.correct1.device.type == "meta"
    real = StepStats()
    real.add_loss(torch.tensor(2.0), 2)
    real.add_batch(torch.tensor([[0.0, 1.0], [1.0, 0.0]]), torch.tensor([1, 1]), bad=1, data_s=0.5, compute_s=1.0,
                   comm_s=0.25)
    assert real.as_list() == [4.0, 2.0, 1.0, 2.0, 1.0, 0.5, 1.0, 0.25, 0.0]


# ---------------------------------------------------------------- crashes found by review
def test_capped_validation_with_batched_decoding(tmp_path):
    """--decode-device cpu --eval-max-clips: the capped loader collates PackedClip s (it raised
    TypeError in default_collate)."""
    from tsm_ds.data.splits import build_datasets, resolve_split
    from tsm_ds.data.video import write_packed
    from tsm_ds.engine.loop.cadence import val_subset

    rng = np.random.default_rng(0)
    for c in ("a", "b"):
        (tmp_path / c).mkdir()
        for v in range(3):
            write_packed(tmp_path / c / f"v{v}.jpack", [rng.integers(0, 255, (24, 32, 3), dtype=np.uint8)
                                                        for _ in range(6)])
    _, val = build_datasets(resolve_split(data=tmp_path, val_fraction=0.5), num_segments=2, img_size=16, seed=1,
                            decode_device="cpu")
    sub = val_subset(val, 2, seed=1, world=1, rank=0, batch_size=2, num_workers=0)
    batches = list(sub.loader)
    assert len(batches) == 1 and batches[0]["clip"].decode().shape == (2, 2, 3, 16, 16)
    assert batches[0]["index"].tolist() == sub.indices


def test_comm_bench_gathers_on_the_backends_device(monkeypatch):
    """NCCL refuses CPU tensors: the bench's gather uses the backend's device (CUDA under NCCL)."""
    import tsm_ds.bench.comm as comm
    import tsm_ds.engine.comm.dist as ddist

    monkeypatch.setattr(ddist.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(ddist.dist, "get_backend", lambda: "nccl")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert ddist.collective_device() == torch.device("cuda", 3)
    monkeypatch.setattr(ddist.dist, "get_backend", lambda: "gloo")
    assert ddist.collective_device() == torch.device("cpu")

    seen = []
    monkeypatch.setattr(ddist, "collective_device", lambda: torch.device("cpu"))

    def gather(out, t):
        seen.append(t.device)
        for k, o in enumerate(out):
            o.copy_(t * (k + 1))
    monkeypatch.setattr(torch.distributed, "all_gather", gather)
    assert comm.slowest_rank([0.5, 2.0], 3) == [1.5, 6.0] and seen == [torch.device("cpu")]


# ---------------------------------------------------------------- timeouts: the watchdog first
def test_collectives_outlast_the_watchdog(capsys):
    from tsm_ds.cli import config as config_cli
    from tsm_ds.engine.comm.rendezvous import WATCHDOG_MARGIN_S, collective_timeout_s

    assert collective_timeout_s(300, 1800, 3600) == 3600 + WATCHDOG_MARGIN_S
    assert collective_timeout_s(300, 0, 0) == 300            # no watchdog: the join limit
    assert collective_timeout_s(5000, 1800, 3600) == 5000    # a longer one given stays
    with pytest.raises(ValueError, match="--step-timeout -1"):
        collective_timeout_s(300, -1, 0)
    assert config_cli.main(["--deepspeed_config", "cpu_fp32", "--world-size", "2", "--train-samples", "64",
                            "--step-timeout", "600", "--startup-timeout", "900"]) == 0
    out = capsys.readouterr().out
    assert "ranks join within 300 s" in out and "collectives 1020 s" in out and "--step-timeout 600 s" in out


# ---------------------------------------------------------------- fp16 over many ranks
def test_fp16_recipes_predivide_by_sqrt_world_size_and_refuse_raw_sums():
    from tsm_ds.engine.config.checks import validate_config
    from tsm_ds.engine.config.recipes import ConfigError, load_config
    from tsm_ds.engine.config.resolve import resolve_config

    raw = load_config("gpu_kinetics_1536")
    ds, tsm, filled, _ = resolve_config(raw, world_size=1536, train_samples=240_000, epochs=2)
    assert ds["gradient_predivide_factor"] == pytest.approx(math.sqrt(1536), abs=1e-4)
    assert "sqrt of 1536 ranks" in filled["gradient_predivide_factor"]
    validate_config(ds, tsm, device="cuda", has_batchnorm=True)
    ds_one, *_ = resolve_config(load_config("gpu_fp16"), world_size=1, train_samples=240_000, epochs=2,
                                flags={"batch_size": 8, "micro_batch_size": 8})
    assert ds_one["gradient_predivide_factor"] == 1.0   # one rank: nothing to split (the skip of the reduce holds)
    with pytest.raises(ConfigError, match="fp16 gradients summed over 1536 ranks"):
        validate_config({**ds, "gradient_predivide_factor": 1.0}, tsm, device="cuda", has_batchnorm=True)
    validate_config({**ds, "gradient_predivide_factor": 1.0, "communication_data_type": "fp32"}, tsm,
                    device="cuda", has_batchnorm=True)   # fp32 communication: no limit
    for name in ("gpu_fp16", "gpu_fp16_lamb", "gpu_fp16_comm_fp16", "gpu_kinetics_1536"):
        assert load_config(name)["gradient_predivide_factor"] == "auto", name


# ---------------------------------------------------------------- the shift on CUDA
_VIEWS = ("slice", "select", "view", "alias", "detach", "as_strided", "unsqueeze", "squeeze", "expand")


def _ops(fn) -> list[str]:
    """The aten ops ``fn`` dispatches that launch work on a device (views are metadata only)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))
    with Count() as c:
        fn()
    return [op for op in c.ops if not any(v in op for v in _VIEWS)]


@pytest.mark.parametrize("t", [8, 16])
def test_shift_off_the_cpu_is_a_constant_number_of_kernels(t):
    """A stand-in device (meta) takes the GPU path: the op count does not grow with T or the frame
    size; the CPU's per-frame path (large frames) grows with T."""
    from tsm_ds.models.shift import _moves, _shift_inplace, _unshift_inplace, per_frame_copies

    assert per_frame_copies("cpu", 1 << 20) and not per_frame_copies("cuda", 1 << 20)
    assert not per_frame_copies("cpu", 16)
    moves = _moves(64, 8, False)
    big = torch.empty(2, t, 64, 56, 56, device="meta")
    saved = []
    gpu = _ops(lambda: saved.append(_shift_inplace(big, moves, save=True)))
    gpu += _ops(lambda: _unshift_inplace(big, moves, saved[0]))
    assert len(gpu) == 6, gpu   # clone, 2 copies, 2 zero fills; undo: 1 copy
    frames = torch.zeros(2, t, 64, 112, 112)   # 8 channels x 112 x 112 x 2 clips >= 64 Ki: per frame on the CPU
    cpu = _ops(lambda: _shift_inplace(frames, moves, save=False))
    assert len(cpu) >= 2 * (t - 1)   # one copy per frame per direction


# ---------------------------------------------------------------- nvJPEG
def test_nvjpeg_batch_failure_warns_once_counts_and_syncs_before_freeing(monkeypatch):
    """The CUDA decode path, its device calls replaced: a refused batch is decoded frame by frame,
    warned once and counted; the stream is synchronised before the decoded frames are freed."""
    import io

    from PIL import Image

    import tsm_ds.data.packed_batch as pb
    import tsm_ds.data.video.packed as packed
    from tsm_ds.data.transforms import ClipTransform

    def jpeg(v):
        buf = io.BytesIO()
        Image.fromarray(np.full((8, 8, 3), v, np.uint8)).save(buf, format="JPEG", quality=95)
        return buf.getvalue()
    calls = {"batch": 0, "sync": 0}

    def decode(data, device):
        calls["batch"] += 1
        if len(data) > 1:
            raise RuntimeError("nvjpeg: unsupported sampling")
        return [pb._decode_strict(bytes(data[0]))]
    monkeypatch.setattr(packed, "decode_jpeg_batch", decode)

    class Stream:
        def synchronize(self):
            calls["sync"] += 1
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: Stream())
    monkeypatch.setattr(pb, "_FALLBACKS", {"batches": 0, "frames": 0})
    tf = ClipTransform("val", 8)
    clip = pb.PackedClip(frames=[jpeg(10), jpeg(200)], boxes=None, transform=tf, num_clips=1, num_segments=2,
                         multi_view=False, path="x.jpack", decode_device="cuda")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        out = pb.PackedBatch([clip]).decode()
        pb.PackedBatch([clip]).decode()
    assert out.shape == (1, 2, 3, 8, 8) and abs(int(out[0, 0].float().mean()) - 10) <= 2
    assert pb.nvjpeg_fallbacks() == {"batches": 2, "frames": 4} and calls["sync"] == 2
    assert sum("nvJPEG could not decode a batch" in str(x.message) for x in w) == 1
