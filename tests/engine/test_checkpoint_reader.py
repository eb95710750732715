"""The one checkpoint reader (tsm_ds.engine.checkpoint.reader.read_checkpoint): the same weights saved
as every kind (our export, torch.compile / DataParallel key prefixes, a bare state dict, an official
TSM file, DeepSpeed run / checkpoints / tag directories, ZeRO-3) read back as equal tensors; the
inference loader and --tune-from accept every kind through it; files that are not checkpoints are
named in the error."""
from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tsm_ds.engine.checkpoint.manager import load_finetune_weights, read_checkpoint, save_weights_export
from tsm_ds.inference.loading import load_for_inference
from tsm_ds.models import build_model
from tsm_ds.models.official import official_key
from tsm_ds.models.weights import CheckpointError

pytestmark = pytest.mark.usefixtures("one_thread")

K, T = 400, 2   # Kinetics-400 head: the official file name below says "kinetics"
NAMES = [f"class{i:03d}" for i in range(K)]
OFFICIAL = f"TSM_kinetics_RGB_resnet18_shift8_blockres_avg_segment{T}_e1.pth"
TAG2 = "checkpoints/step00000002/mp_rank_00_model_states.pt"


def _model(seed: int) -> torch.nn.Module:
    """resnet18 TSM with non-trivial BN statistics (buffers differ from a fresh model's)."""
    torch.manual_seed(seed)
    m = build_model("resnet18", K, num_segments=T)
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                mod.running_mean.uniform_(-0.2, 0.2)
                mod.running_var.uniform_(0.5, 1.5)
                mod.num_batches_tracked.fill_(7)
    return m.eval()


def _ds_states(sd: dict, config: dict, **extra) -> dict:
    """DeepSpeed's model-states layout: "module" plus the client state merged at the top level."""
    return {"module": sd, "buffer_names": [k for k in sd if "running" in k or "batches" in k], "optimizer": None,
            "ds_version": "0.19.8", "global_steps": 2, "model_config": config, "class_names": NAMES, "img_size": 112,
            **extra}


def _loss_scaler():
    """DeepSpeed's fp16 loss scaler, a pickled object (allowlisted by tsm_ds.engine.checkpoint.safe_load)."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler

    return DynamicLossScaler(init_scale=65536.0, scale_window=1000, min_scale=1, delayed_shift=2,
                             consecutive_hysteresis=False)


def _tag(d: Path, states: dict | None = None, *, link: Path | None = None, complete: bool = True) -> Path:
    d.mkdir(parents=True)
    f = d / "mp_rank_00_model_states.pt"
    if link is not None:
        os.link(link, f)   # the same bytes as another tag's file
    else:
        torch.save(states, f)
    if complete:
        (d / "complete.json").write_text(json.dumps({"step": 2, "world_size": 1, "files": {}}))
    return f


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """One model's weights written as every kind the reader accepts (plus other weights as decoys)."""
    root = tmp_path_factory.mktemp("kinds")
    model = _model(0)
    ref = {k: v.clone() for k, v in model.state_dict().items()}
    other = {k: (v + 1 if v.is_floating_point() else v) for k, v in ref.items()}
    save_weights_export(root / "run" / "best_model.pt", model, class_names=NAMES,
                        extra={"img_size": 112, "epoch": 3, "val_top1": 12.5})
    save_weights_export(root / "compiled.pt", torch.compile(model), class_names=NAMES, extra={"img_size": 112})
    torch.save({"state_dict": {"module._orig_mod." + k: v for k, v in ref.items()}, "model_config": model.config,
                "class_names": NAMES, "img_size": 112}, root / "ddp_compiled.pt")
    torch.save({"module." + k: v for k, v in ref.items()}, root / "bare.pt")
    official = {"epoch": 1, "arch": "resnet18", "best_prec1": 71.2,
                "state_dict": {official_key(k, model): v for k, v in ref.items()},
                "optimizer": torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9).state_dict()}
    torch.save(official, root / OFFICIAL)
    os.link(root / OFFICIAL, root / "renamed.pth")
    # DeepSpeed: step 1 (other weights), step 2 (these; with a pickled DeepSpeed object, an fp16 ZeRO run's
    # loss scaler), step 3 complete but newer than latest (other weights), latest -> step 2; without latest,
    # the newest complete tag counts: step 2 when step 3 is incomplete (though its file is the newest)
    ck = root / "run" / "checkpoints"
    _tag(ck / "step00000001", _ds_states(other, model.config))
    f2 = _tag(ck / "step00000002", _ds_states(ref, model.config, loss_scaler=_loss_scaler()))
    f3 = _tag(ck / "step00000003", _ds_states(other, model.config))
    (ck / "latest").write_text("step00000002")
    _tag(root / "nolatest" / "step00000001", link=ck / "step00000001" / "mp_rank_00_model_states.pt")
    _tag(root / "nolatest" / "step00000002", link=f2)
    _tag(root / "nolatest" / "step00000003", link=f3, complete=False)
    now = time.time()
    os.utime(root / "nolatest" / "step00000003" / "mp_rank_00_model_states.pt", (now + 60, now + 60))
    return {"root": root, "model": model, "ref": ref}


def _assert_same(state: dict, ref: dict) -> None:
    assert sorted(state) == sorted(ref)
    for k, v in ref.items():
        assert state[k].dtype == v.dtype and torch.equal(state[k], v), k


# name, path (relative to the fixture root), official overrides, source, file read, config?, names?, img_size
KINDS = [
    ("export", "run/best_model.pt", None, "state_dict", "run/best_model.pt", True, True, 112),
    ("compiled_export", "compiled.pt", None, "state_dict", "compiled.pt", True, True, 112),
    ("module_orig_mod_keys", "ddp_compiled.pt", None, "state_dict", "ddp_compiled.pt", True, True, 112),
    ("bare_module_keys", "bare.pt", None, "state_dict", "bare.pt", False, False, None),
    ("official", OFFICIAL, None, "official", OFFICIAL, True, False, None),
    ("official_renamed", "renamed.pth", {"arch": "resnet18", "num_classes": K, "num_segments": T}, "official",
     "renamed.pth", True, False, None),
    ("run_dir", "run", None, "deepspeed", f"run/{TAG2}", True, True, 112),
    ("checkpoints_latest", "run/checkpoints", None, "deepspeed", f"run/{TAG2}", True, True, 112),
    ("tag_dir", "run/checkpoints/step00000002", None, "deepspeed", f"run/{TAG2}", True, True, 112),
    ("model_states_file", f"run/{TAG2}", None, "deepspeed", f"run/{TAG2}", True, True, 112),
    ("newest_complete_without_latest", "nolatest", None, "deepspeed",
     "nolatest/step00000002/mp_rank_00_model_states.pt", True, True, 112),
]


@pytest.mark.parametrize("name,rel,overrides,source,read,has_config,has_names,img_size", KINDS,
                         ids=[k[0] for k in KINDS])
def test_every_kind_reads_the_same_tensors(saved, name, rel, overrides, source, read, has_config, has_names,
                                           img_size):
    c = read_checkpoint(saved["root"] / rel, official_overrides=overrides)
    _assert_same(c.state_dict, saved["ref"])
    assert (c.source, c.path, c.img_size) == (source, saved["root"] / read, img_size)
    assert c.model_config == (saved["model"].config if has_config else None)
    assert c.class_names == (NAMES if has_names else None)


def test_weights_only_with_deepspeeds_classes_allowlisted_others_refused(saved, tmp_path):
    root = saved["root"]
    for f in ("run/best_model.pt", OFFICIAL):   # plain dicts of tensors / str / int / float: no pickled code
        obj = torch.load(root / f, weights_only=True)
        assert isinstance(obj["state_dict"], dict) and len(obj["state_dict"]) == len(saved["ref"])
    with pytest.raises(Exception, match="DynamicLossScaler"):   # DeepSpeed's own file pickles its objects
        torch.load(root / "run" / TAG2, weights_only=True)
    assert read_checkpoint(root / "run").source == "deepspeed"   # allowlisted (tsm_ds.engine.checkpoint.safe_load)
    # any other object is refused, whatever the file's name, unless trusted
    states = torch.load(root / "run" / TAG2, weights_only=False)
    for name in ("states.pt", "mp_rank_00_model_states.pt"):
        torch.save({**states, "loss_scaler": argparse.Namespace(cur_scale=65536.0)}, tmp_path / name)
        with pytest.raises(ValueError, match=re.escape(f"{tmp_path / name} asks to unpickle argparse.Namespace, which "
                                                       "tsm_ds does not load from a checkpoint")
                           + ".*--trust-checkpoint"):
            read_checkpoint(tmp_path / name)
    _assert_same(read_checkpoint(tmp_path / name, trust=True).state_dict, saved["ref"])   # unpickled in full


@pytest.mark.parametrize("rel,overrides,source", [
    ("run/best_model.pt", {}, "state_dict"), ("compiled.pt", {}, "state_dict"), ("run", {}, "deepspeed"),
    (OFFICIAL, {}, "official"), ("renamed.pth", {"arch": "resnet18", "num_classes": K, "num_segments": T}, "official")])
def test_load_for_inference_gives_the_same_model(saved, rel, overrides, source):
    loaded = load_for_inference(saved["root"] / rel, **overrides)
    assert loaded.source == source and loaded.config == saved["model"].config
    official = source == "official"
    assert loaded.class_names == ([f"class_{i}" for i in range(K)] if official else NAMES)
    assert loaded.img_size == (None if official else 112) and len(loaded.notes) == int(official)
    x = torch.randn(1, T, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(loaded.model(x), saved["model"](x))


def test_load_for_inference_needs_a_model_config(saved):
    bare = saved["root"] / "bare.pt"
    with pytest.raises(ValueError, match=re.escape(f"{bare}: no 'model_config' recorded with the weights: the model "
                                                   "cannot be rebuilt; save it with tsm_ds.engine.checkpoint.manager")):
        load_for_inference(bare)
    with pytest.raises(CheckpointError,
                       match=r"(?s)does not fit the model:.*new_fc.weight: \(400, 512\) vs \(5, 512\)"):
        load_for_inference(saved["root"] / "run", num_classes=5)


@pytest.mark.parametrize("rel,source", [("run", "DeepSpeed checkpoint"), ("run/checkpoints", "DeepSpeed checkpoint"),
                                        ("run/checkpoints/step00000002", "DeepSpeed checkpoint"),
                                        ("run/best_model.pt", "tsm_ds export"), ("bare.pt", "state dict"),
                                        (OFFICIAL, "official TSM checkpoint")])
def test_tune_from_accepts_every_kind(saved, rel, source):
    dst = _model(1)
    rep = load_finetune_weights(dst, saved["root"] / rel)
    assert rep == {"loaded": len(saved["ref"]), "skipped": [], "source": source,
                   "path": str(read_checkpoint(saved["root"] / rel).path)}
    _assert_same(dst.state_dict(), saved["ref"])


def test_tune_from_run_dir_replaces_the_head_of_another_class_count(saved):
    torch.manual_seed(1)
    dst = build_model("resnet18", 3, num_segments=T)
    head = {k: v.clone() for k, v in dst.state_dict().items() if k.startswith("new_fc.")}
    rep = load_finetune_weights(dst, saved["root"] / "run")
    assert sorted(rep["skipped"]) == ["new_fc.bias", "new_fc.weight"] and rep["loaded"] == len(saved["ref"]) - 2
    for k, v in dst.state_dict().items():
        assert torch.equal(v, head[k] if k in head else saved["ref"][k]), k
    with pytest.raises(RuntimeError, match=re.escape(f"{saved['root'] / 'run' / TAG2}: ") + r"\d+ parameters of this "
                       r"model are not in the checkpoint .*is --arch / --shift the same"):
        load_finetune_weights(build_model("resnet34", K, num_segments=T), saved["root"] / "run")


def test_what_is_not_a_checkpoint_is_named(saved, tmp_path):
    expected = "expected a tsm_ds export such as RUN/best_model.pt, a run directory"
    notes = tmp_path / "notes.txt"
    notes.write_text("hello world\n")
    with pytest.raises(ValueError, match=re.escape(f"{notes} is not a PyTorch checkpoint") + ".*" + expected):
        read_checkpoint(notes)
    cut = tmp_path / "cut.pt"
    cut.write_bytes((saved["root"] / "run" / "best_model.pt").read_bytes()[:4096])
    with pytest.raises(ValueError, match=re.escape(f"{cut} is not a PyTorch checkpoint or is damaged (RuntimeError: ")):
        read_checkpoint(cut)
    torch.save([1, 2], tmp_path / "list.pt")
    with pytest.raises(ValueError, match=re.escape(f"{tmp_path / 'list.pt'} is not a checkpoint: it holds a list, "
                                                   "expected a dict")):
        read_checkpoint(tmp_path / "list.pt")
    torch.save({"epochs": 3}, tmp_path / "meta.pt")
    with pytest.raises(ValueError, match=re.escape(f"{tmp_path / 'meta.pt'} holds no state dict (found a dict of 1 "
                                                   "entries, not all name -> tensor)")):
        read_checkpoint(tmp_path / "meta.pt")
    with pytest.raises(FileNotFoundError, match=re.escape(f"checkpoint {tmp_path / 'nope.pt'} not found (" + expected)):
        read_checkpoint(tmp_path / "nope.pt")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=re.escape(
            f"{tmp_path / 'empty'} is a directory but holds no DeepSpeed checkpoint (no 'latest' file and no "
            f"*/mp_rank_00_model_states.pt); {expected}")):
        read_checkpoint(tmp_path / "empty")
    (tmp_path / "exported").mkdir()
    os.link(saved["root"] / "run" / "best_model.pt", tmp_path / "exported" / "best_model.pt")
    with pytest.raises(FileNotFoundError, match=re.escape("; it holds best_model.pt: pass one of those files")):
        read_checkpoint(tmp_path / "exported")
    (tmp_path / "gone").mkdir()
    (tmp_path / "gone" / "latest").write_text("step00000009")
    with pytest.raises(FileNotFoundError, match=re.escape(
            f"{tmp_path / 'gone' / 'latest'} names checkpoint tag 'step00000009', "
            f"but {tmp_path / 'gone' / 'step00000009'} "
            "holds no mp_rank_00_model_states.pt")):
        read_checkpoint(tmp_path / "gone")
    bad = _tag(tmp_path / "damaged" / "step00000001", {"x": 1})
    bad.write_bytes(b"garbage")
    with pytest.raises(ValueError, match=re.escape(f"cannot read DeepSpeed checkpoint file {bad} (")):
        read_checkpoint(tmp_path / "damaged")
    wrong = tmp_path / OFFICIAL.replace("kinetics", "something")   # 174 classes by its name, 400 in the file
    os.link(saved["root"] / OFFICIAL, wrong)
    with pytest.raises(CheckpointError, match=re.escape(f"checkpoint {wrong} does not fit the model:")):
        read_checkpoint(wrong)
    with pytest.raises(ValueError, match="'renamed.pth' is not an official TSM checkpoint name"):
        read_checkpoint(saved["root"] / "renamed.pth")   # official main.py's dict, no options: says what to pass


def test_train_cli_names_a_bad_tune_from(shared_data, tmp_path, caplog):
    from tsm_ds import train

    bad = tmp_path / "notes.txt"
    bad.write_text("not weights\n")
    status = train.main(["--data", str(shared_data / "videos"), "--output-dir", str(tmp_path / "runs"), "--arch",
                         "resnet18", "--num-segments", "2", "--img-size", "32", "--tune-from", str(bad),
                         "--deepspeed_config", "cpu_fp32"])
    assert status == 2
    assert f"--tune-from {bad}: {bad} is not a PyTorch checkpoint" in caplog.text


# ------------------------------------------------------------------ real DeepSpeed engines (slow)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict:
    return dict(os.environ, DS_ACCELERATOR="cpu", RANK="0", LOCAL_RANK="0", WORLD_SIZE="1",
                MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_port()), OMP_NUM_THREADS="2")


def _train(data: Path, out: Path, name: str, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "tsm_ds.train", "--data", str(data), "--output-dir", str(out), "--run-name", name,
           "--arch", "resnet18", "--img-size", "32", "--num-segments", "2", "--batch-size", "2",
           "--micro-batch-size", "2", "--num-workers", "0", "--no-progress", "--epochs", "1", "--max-steps", "1",
           *args]
    p = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    return p


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["cpu_fp32", "cpu_bf16"])
def test_trainer_run_dir_reads_like_its_export(shared_data, tmp_path, recipe):
    """A real run: its checkpoint (latest = the last step) holds the weights last_model.pt exported at
    that step; bf16 weights come back upcast to float32, as the export writes them."""
    _train(shared_data / "videos", tmp_path, "r", "--deepspeed_config", recipe)
    run = tmp_path / "r"
    c, export = read_checkpoint(run), read_checkpoint(run / "last_model.pt")
    assert c.path == run / "checkpoints" / "step00000001" / "mp_rank_00_model_states.pt"
    assert (c.source, c.img_size, c.model_config, c.class_names) == \
        ("deepspeed", 32, export.model_config, export.class_names)
    _assert_same(c.state_dict, export.state_dict)
    assert all(v.dtype != torch.bfloat16 for v in c.state_dict.values())


@pytest.mark.slow
def test_tune_from_a_run_dir_and_its_latest(shared_data, tmp_path):
    _train(shared_data / "videos", tmp_path, "src", "--deepspeed_config", "cpu_fp32")
    src = tmp_path / "src"
    f = src / "checkpoints" / "step00000001" / "mp_rank_00_model_states.pt"
    n = len(read_checkpoint(src).state_dict)
    for given in (src, src / "checkpoints"):
        p = _train(shared_data / "videos", tmp_path, f"from_{given.name}", "--deepspeed_config", "cpu_fp32",
                   "--tune-from", str(given))
        assert f"--tune-from {given} (DeepSpeed checkpoint {f}): {n} tensors loaded, replaced (shape differs): " \
               "none" in p.stdout + p.stderr


ZERO3_SCRIPT = """
import sys, torch, deepspeed
from tsm_ds.models import build_model
torch.manual_seed(0)
model = build_model("resnet18", 3, num_segments=2)
torch.save({k: v.clone() for k, v in model.state_dict().items()}, sys.argv[1] + "/reference.pt")
deepspeed.init_distributed(dist_backend="gloo")
cfg = {"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
       "zero_optimization": {"stage": 3}, "zero_allow_untested_optimizer": True}
engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
engine.save_checkpoint(sys.argv[1] + "/checkpoints", tag="step00000001",
                       client_state={"model_config": model.config, "class_names": ["a", "b", "c"], "img_size": 32})
"""


@pytest.mark.slow
def test_zero3_checkpoint_is_consolidated(tmp_path):
    """ZeRO-3 partitions the parameters: the model-states file holds empty placeholders and the reader
    consolidates the shards with DeepSpeed's zero_to_fp32."""
    p = subprocess.run([sys.executable, "-c", ZERO3_SCRIPT, str(tmp_path)], env=_env(), capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    f = tmp_path / "checkpoints" / "step00000001" / "zero_pp_rank_0_mp_rank_00_model_states.pt"
    ref = torch.load(tmp_path / "reference.pt", weights_only=True)
    assert torch.load(f, weights_only=False)["module"]["base_model.conv1.weight"].numel() == 0
    c = read_checkpoint(tmp_path)
    assert (c.source, c.path, c.class_names, c.img_size) == ("deepspeed", f, ["a", "b", "c"], 32)
    _assert_same(c.state_dict, ref)
    dst = build_model("resnet18", 3, num_segments=2)
    assert load_finetune_weights(dst, tmp_path / "checkpoints")["loaded"] == len(ref)
    _assert_same(dst.state_dict(), ref)
    assert load_for_inference(tmp_path / "checkpoints" / "step00000001").class_names == ["a", "b", "c"]
