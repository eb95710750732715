"""train.py without launching: official defaults, environment set-up, data selection, fine-tuning
weights, checkpoint manager safety."""
from __future__ import annotations

import json
import os
import re
import zlib
from pathlib import Path

import pytest
import torch

from tsm_ds import train
from tsm_ds.cli.train import parse_config, select_data
from tsm_ds.data import splits
from tsm_ds.data.splits import build_datasets
from tsm_ds.engine.comm.dist import set_accelerator_env, set_threads


def _cfg(argv, environ=None):
    return parse_config(argv, environ={} if environ is None else environ)[0]


def test_official_kinetics_defaults():
    c = _cfg([])
    m = c.model
    assert (m.arch, m.num_segments, m.shift, m.shift_div, m.shift_place, m.dropout, c.schedule.epochs,
            c.data.img_size) == ("resnet50", 8, "bidirectional", 8, "blockres", 0.5, 50, 224)
    s = c.schedule
    assert s.lr is None and s.lr_steps is None and s.clip_grad is None  # filled from the JSON rules
    c = _cfg(["--deepspeed_config", "x.json", "--local_rank", "1", "--resume", "auto"])
    assert (c.engine.deepspeed_config, c.distributed.local_rank, c.output.resume) == ("x.json", 1, "auto")
    # what the deepspeed launcher and DeepSpeed's own argument conventions pass
    c = _cfg(["--deepspeed", "--deepspeed_config", "y.json", "--local_rank=0"])
    assert c.engine.deepspeed_config == "y.json" and c.distributed.local_rank == 0


def test_accelerator_env(monkeypatch):
    from tsm_ds.utils import node
    from tsm_ds.utils.node import AcceleratorError

    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(node, "gpu_count", lambda environ, **kw: 0)
    msg = set_accelerator_env()
    assert os.environ["DS_ACCELERATOR"] == "cpu" and "DS_ACCELERATOR=cpu" in msg
    monkeypatch.setenv("DS_ACCELERATOR", "cuda")   # inherited, but this node has no usable CUDA
    with pytest.raises(AcceleratorError, match="DS_ACCELERATOR=cuda"):
        set_accelerator_env()
    monkeypatch.delenv("DS_ACCELERATOR")
    with pytest.raises(AcceleratorError, match="recipe gpu_bf16.json needs CUDA"):
        set_accelerator_env(needs_cuda="a gpu_* recipe", recipe="recipe gpu_bf16.json")
    note = set_accelerator_env(device="cpu", needs_cuda="a gpu_* recipe", recipe="recipe gpu_bf16.json")
    assert os.environ["DS_ACCELERATOR"] == "cpu" and "--device cpu" in note and "meant for CUDA" in note


@pytest.mark.parametrize("kw,env,want", [
    # auto: CUDA where usable, the CPU where there is no GPU and the recipe does not need one
    (dict(gpus=8, cuda_usable=True), {}, "cuda"),
    (dict(gpus=0, cuda_usable=False), {}, "cpu"),
    (dict(gpus=0, cuda_usable=False), {"DS_ACCELERATOR": "cpu"}, "cpu"),
    (dict(gpus=8, cuda_usable=True), {"DS_ACCELERATOR": "cuda"}, "cuda"),
    # forced on purpose: the CPU on a GPU node or with a GPU recipe
    (dict(gpus=8, cuda_usable=True, device="cpu"), {}, "cpu"),
    (dict(gpus=0, cuda_usable=False, device="cpu", needs_cuda="fp16"), {"DS_ACCELERATOR": "cpu"}, "cpu"),
    # what used to fall back to the CPU silently now stops, naming the cause
    (dict(gpus=8, cuda_usable=True), {"DS_ACCELERATOR": "cpu"}, "DS_ACCELERATOR=cpu in the environment on a node "
                                                                "with 8 GPU"),
    (dict(gpus=4, cuda_usable=False, cuda_reason="RuntimeError: driver too old"), {},
     "4 NVIDIA GPU(s) but torch cannot use CUDA (RuntimeError: driver too old)"),
    (dict(gpus=0, cuda_usable=False, needs_cuda="the recipe enables fp16", recipe="recipe gpu_fp16.json"), {},
     "recipe gpu_fp16.json needs CUDA (the recipe enables fp16)"),
    (dict(gpus=0, cuda_usable=False, needs_cuda="a gpu_* recipe"), {"DS_ACCELERATOR": "cpu"}, "needs CUDA"),
    (dict(gpus=0, cuda_usable=False, device="cuda"), {}, "--device cuda: CUDA is not usable"),
    (dict(gpus=8, cuda_usable=True, device="cuda"), {"DS_ACCELERATOR": "cpu"}, "--device cuda, but DS_ACCELERATOR=cpu"),
])
def test_accelerator_decided_on_each_node_never_a_silent_cpu(kw, env, want):
    from tsm_ds.utils.node import AcceleratorError, decide_accelerator

    if want in ("cpu", "cuda"):
        assert decide_accelerator(env, **kw)[0] == want
    else:
        with pytest.raises(AcceleratorError, match=re.escape(want)):
            decide_accelerator(env, **kw)


def test_gpu_recipe_without_cuda_stops_before_training(tmp_path, caplog):
    """``--deepspeed_config gpu_bf16`` on this CPU machine: exit 2 naming the recipe and --device cpu
    (it trained on the CPU, exit 0, without a word before issue 37)."""
    from tsm_ds.cli import train

    caplog.set_level("ERROR")
    assert train.main(["--deepspeed_config", "gpu_bf16", "--data", str(tmp_path / "none"),
                       "--output-dir", str(tmp_path)]) == 2
    assert "recipe gpu_bf16.json needs CUDA (a gpu_* recipe)" in caplog.text and "--device cpu" in caplog.text


def test_threads_divided_between_local_ranks(monkeypatch):
    before = torch.get_num_threads()
    try:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        monkeypatch.setenv("LOCAL_SIZE", "2")
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5})
        msg = set_threads()
        assert torch.get_num_threads() == 3 and "6 cores / 2 local ranks" in msg
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        assert "OMP_NUM_THREADS=1 given" in set_threads()
    finally:
        torch.set_num_threads(before)


def test_real_clips_split_by_source_group(shared_data, tmp_path):
    import logging
    a = _cfg(["--data", str(shared_data / "videos"), "--img-size", "32", "--num-segments", "2",
              "--output-dir", str(tmp_path)])
    split, flip = select_data(a, logging.getLogger("t"))
    tr, va = build_datasets(split, num_segments=2, img_size=32, flip=flip)
    names, desc = split.class_names, split.description
    assert "source_group" in desc and split.kind == "manifest" and flip
    assert names == sorted(p.name for p in (shared_data / "videos").iterdir() if p.is_dir())
    tr_paths = {Path(r.path) for r in tr.records}
    va_paths = {Path(r.path) for r in va.records}
    assert not tr_paths & va_paths and len(tr_paths) + len(va_paths) == 17
    assert {r.label for r in va.records} == set(range(len(names)))  # every class validated


def test_no_data_message(monkeypatch, tmp_path):
    import builtins
    import logging
    monkeypatch.setattr(splits, "DEFAULT_SHARED", tmp_path / "absent")
    monkeypatch.delenv("TSM_DS_DATA", raising=False)
    real_import = builtins.__import__

    def no_synthetic(name, *args, **kw):
        if name == "tsm_ds.data.synthetic":
            raise ImportError(name)
        return real_import(name, *args, **kw)

    monkeypatch.setattr(builtins, "__import__", no_synthetic)
    a = _cfg(["--output-dir", str(tmp_path)])
    with pytest.raises(ValueError, match=r"no training data: pass --data DIR .*--train-list/--val-list"):
        select_data(a, logging.getLogger("t"))


def test_tune_from_replaces_head_when_classes_differ(tmp_path):
    from tsm_ds.engine.checkpoint.manager import load_finetune_weights, save_weights_export
    from tsm_ds.models import build_model
    torch.manual_seed(0)
    src = build_model("resnet18", 5, num_segments=2)
    save_weights_export(tmp_path / "best.pt", src, class_names=list("abcde"))
    obj = torch.load(tmp_path / "best.pt", weights_only=False)
    assert obj["class_names"] == list("abcde") and obj["model_config"]["num_classes"] == 5
    torch.manual_seed(1)
    dst = build_model("resnet18", 3, num_segments=2)
    head_before = {k: v.clone() for k, v in dst.state_dict().items() if k.startswith("new_fc")}
    rep = load_finetune_weights(dst, tmp_path / "best.pt")
    assert sorted(rep["skipped"]) == ["new_fc.bias", "new_fc.weight"]
    sd_src, sd_dst = src.state_dict(), dst.state_dict()
    for k in sd_dst:
        if k.startswith("new_fc"):
            assert torch.equal(sd_dst[k], head_before[k])
        else:
            assert torch.equal(sd_dst[k], sd_src[k]), k
    with pytest.raises(RuntimeError, match="--arch"):
        load_finetune_weights(build_model("resnet34", 5, num_segments=2), tmp_path / "best.pt")


class _FailingEngine:
    """Stands in for a DeepSpeed engine whose save dies half-way (disk full, killed)."""

    def __init__(self, fail):
        self.fail = fail

    def save_checkpoint(self, save_dir, tag, client_state, save_latest):
        d = Path(save_dir) / tag
        d.mkdir(parents=True, exist_ok=True)
        (d / "mp_rank_00_model_states.pt").write_bytes(b"partial" if self.fail else b"whole")
        if self.fail:
            raise OSError("No space left on device")


def test_failed_save_keeps_previous_checkpoint(tmp_path):
    from tsm_ds.engine.checkpoint.manager import CheckpointManager, CheckpointSaveError
    m = CheckpointManager(tmp_path, keep_last=1)
    for step in (1, 2):
        m.save(_FailingEngine(False), step=step, client_state={}, rank_state={"x": step}, best_tag=None)
    assert m.latest_tag() == "step00000002" and not (tmp_path / "step00000001").exists()  # keep_last 1
    with pytest.raises(CheckpointSaveError, match=r"step00000003 failed: OSError: No space left on device \(\d+ MB "
                       r"free on that filesystem\); the previous checkpoint \S+step00000002 is intact"):
        m.save(_FailingEngine(True), step=3, client_state={}, rank_state={}, best_tag=None)
    assert not (tmp_path / "step00000003").exists()            # the partial tag is removed at once
    assert (tmp_path / "latest").read_text() == "step00000002"
    assert m.latest_tag() == "step00000002" and m.resolve("auto") == "step00000002"
    assert (tmp_path / "step00000002" / "mp_rank_00_model_states.pt").read_bytes() == b"whole"
    assert m.verify("step00000002") is None
    # the next good save; the best survives pruning
    m.save(_FailingEngine(False), step=4, client_state={}, rank_state={}, best_tag="step00000002")
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["step00000002", "step00000004"]
    meta = json.loads((tmp_path / "step00000004" / "complete.json").read_text())
    assert meta["step"] == 4 and meta["world_size"] == 1
    assert sorted(meta["files"]) == ["mp_rank_00_model_states.pt", "rank00000.pt"]
    assert meta["files"]["mp_rank_00_model_states.pt"] == [5, zlib.crc32(b"whole")]
    with pytest.raises(FileNotFoundError, match="complete tags"):
        m.resolve("step00000003")


def test_demo_dataset_fallback(monkeypatch, tmp_path):
    import logging
    pytest.importorskip("tsm_ds.data.synthetic")
    monkeypatch.setattr(splits, "DEFAULT_SHARED", tmp_path / "absent")
    monkeypatch.delenv("TSM_DS_DATA", raising=False)
    a = _cfg(["--output-dir", str(tmp_path), "--demo-clips", "2", "--img-size", "32", "--num-segments", "4"])
    split, flip = select_data(a, logging.getLogger("t"))
    tr, va = build_datasets(split, num_segments=4, img_size=32, flip=flip)
    names = split.class_names
    assert split.demo and not flip  # direction classes: a flipped "moving_left" clip would be "moving_right"
    assert a.data.flip              # the command decides; the parsed tree stays as given
    assert len(names) == 4 and len(tr) == 2 * 4 and len(va) == 2 * 4
    assert sorted(r.label for r in tr.records) == [0, 0, 1, 1, 2, 2, 3, 3]
    item = tr[0]
    assert item["clip"].shape == (4, 3, 32, 32) and item["index"] == 0 and item["bad"] == 0


def test_resume_with_another_world_size_is_refused(tmp_path):
    from tsm_ds.engine.checkpoint.manager import CheckpointManager
    CheckpointManager(tmp_path, keep_last=2).save(_FailingEngine(False), step=5, client_state={}, rank_state={},
                                                  best_tag=None)
    meta = tmp_path / "step00000005" / "complete.json"
    meta.write_text(json.dumps({"step": 5, "world_size": 2}))  # as if written by 2 ranks
    with pytest.raises(RuntimeError, match=r"written by 2 ranks, this run has 1: .*--tune-from"):
        CheckpointManager(tmp_path).load(engine=None, tag="step00000005")


@pytest.mark.parametrize("make", ["missing", "empty"])
def test_bad_data_dir_is_a_message_not_a_traceback(make, tmp_path, capsys, caplog):
    """--data pointing at nothing usable ends with exit status 2 and a line naming the folder."""
    data = tmp_path / "videos"
    if make == "empty":
        data.mkdir()
    status = train.main(["--data", str(data), "--output-dir", str(tmp_path / "runs"),
                         "--deepspeed_config", "cpu_fp32"])
    assert status == 2
    out = capsys.readouterr().out + caplog.text  # logging goes to pytest's handler here
    assert "data: " in out and str(data) in out and "Traceback" not in out


def _write_run(run_dir: Path, argv: list[str]) -> None:
    """A run folder whose config.json records the tree of ``argv`` (as the train command writes it)."""
    from tsm_ds.config.record import run_record
    cfg = _cfg(argv)
    (run_dir / "checkpoints").mkdir(parents=True)
    rec = run_record(cfg, deepspeed_config="cpu_fp32.json", data_description="d", split={}, flip=True)
    (run_dir / "config.json").write_text(json.dumps(rec))


def test_resume_and_tune_from_rebuild_the_recorded_model_and_data(tmp_path, monkeypatch):
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    run = tmp_path / "runs" / "r"
    _write_run(run, ["--arch", "resnet18", "--num-segments", "4", "--img-size", "112", "--data", "/clips",
                     "--shift-div", "4", "--save-every-steps", "3", "--inject-nan-at-step", "2"])
    rec = json.loads((run / "config.json").read_text())["config"]
    assert "debug" not in rec and rec["model"]["arch"] == "resnet18"   # test hooks are not the run's configuration
    # --resume: the run's fields replace the defaults; flags given still win
    cfg, notes = parse_config(["--output-dir", str(tmp_path / "runs"), "--run-name", "r", "--resume", "auto",
                               "--max-steps", "9", "--img-size", "96"], environ={})
    assert (cfg.model.arch, cfg.model.num_segments, cfg.model.shift_div, cfg.data.data) == ("resnet18", 4, 4, "/clips")
    assert (cfg.data.img_size, cfg.schedule.max_steps, cfg.output.save_every_steps) == (96, 9, 3)
    assert cfg.debug.inject_nan_at_step is None and cfg.output.resume == "auto"
    assert any(f"--resume: the run's fields from {run / 'config.json'}" in n for n in notes)
    # no recorded run there: a fresh start with the defaults (as --resume auto always did)
    cfg, _ = parse_config(["--output-dir", str(tmp_path / "none"), "--run-name", "r", "--resume", "auto"], environ={})
    assert cfg.model.arch == "resnet50"
    # --tune-from a run: its network's shape (arch, shift options), not its schedule or data
    cfg, notes = parse_config(["--tune-from", str(run / "best_model.pt"), "--num-segments", "8"], environ={})
    assert (cfg.model.arch, cfg.model.shift_div, cfg.model.num_segments, cfg.data.data) == ("resnet18", 4, 8, None)
    assert any("the model of that run (arch='resnet18', shift_div=4;" in n for n in notes)
    cfg, _ = parse_config(["--tune-from", str(run), "--arch", "resnet34"], environ={})
    assert cfg.model.arch == "resnet34"                              # a flag given wins
