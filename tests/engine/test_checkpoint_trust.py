"""Loading a checkpoint never runs code from it (issue 26; tsm_ds.engine.checkpoint.safe_load).

A crafted run directory whose model-states file pickles ``os.system("touch MARKER")`` (a control step
shows that full unpickling does run it) is refused by eval, predict, export, ``--tune-from`` and
``--resume``, naming the file and the global, and the marker never appears; ``trust=True`` unpickles
it in full. Genuine checkpoints of every shipped CPU recipe (and a ZeRO-3 engine) are read, fine-tuned
from and resumed weights-only, and each allowlisted class is needed by one of them.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from tsm_ds.engine.checkpoint.safe_load import SAFE_GLOBALS, UntrustedCheckpointError, safe_globals

REPO = Path(__file__).resolve().parents[2]
SYSTEM = f"{os.system.__module__}.system"   # the global the crafted pickle names (posix.system)
T, SIZE, NAMES = 2, 32, ["a", "b", "c"]
#: fp16 is GPU-only here: its entry is read from DeepSpeed's source (see SAFE_GLOBALS), not saved
GPU_ONLY = {"deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler"}


class _RunsCode:
    """Unpickled in full, runs ``touch marker`` (as the issue's ``os.system`` payload would run anything)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {shlex.quote(str(self.marker))}",)


def _resnet18() -> nn.Module:
    from tsm_ds.models import build_model

    torch.manual_seed(0)
    return build_model("resnet18", len(NAMES), num_segments=T)


def _crafted_run(root: Path, marker: Path, *, module_too: bool = False) -> Path:
    """``root/run/checkpoints``: ``latest`` -> ``step1``, ``step1/mp_rank_00_model_states.pt`` (a real
    model's weights and client state, plus the payload; ``module_too``: the payload *is* the module
    entry), ``complete.json`` and a plain ``rank00000.pt`` (so that ``--resume auto`` picks it)."""
    model = _resnet18()
    ck = root / "run" / "checkpoints"
    tag = ck / "step1"
    tag.mkdir(parents=True)
    states = {"module": _RunsCode(marker) if module_too else model.state_dict(), "ds_version": "0.19.8",
              "global_steps": 1, "model_config": model.config, "class_names": NAMES, "img_size": SIZE,
              "payload": _RunsCode(marker)}
    torch.save(states, tag / "mp_rank_00_model_states.pt")
    torch.save({"epoch": 0, "micro_in_epoch": 0}, tag / "rank00000.pt")
    (tag / "complete.json").write_text(json.dumps({"step": 1, "world_size": 1, "files": {}}))
    (ck / "latest").write_text("step1")
    return root / "run"


@pytest.fixture
def crafted(tmp_path):
    """The crafted run dir and its marker; the control step proves the payload runs when unpickled in full."""
    control = tmp_path / "control"
    control.mkdir()
    torch.save({"payload": _RunsCode(control / "ran")}, control / "evil.pt")
    torch.load(control / "evil.pt", weights_only=False)
    assert (control / "ran").is_file()   # full unpickling executes it: a real code-execution attempt
    marker = tmp_path / "MARKER"
    run = _crafted_run(tmp_path, marker)
    return {"run": run, "marker": marker, "file": run / "checkpoints" / "step1" / "mp_rank_00_model_states.pt"}


def _refusal(path) -> str:
    """The refusal's message pattern: names the file, the global and --trust-checkpoint."""
    return re.escape(f"{path} asks to unpickle {SYSTEM}, which tsm_ds does not load from a checkpoint") + \
        r".*pass --trust-checkpoint"


# ------------------------------------------------------------------ the allowlist


def test_allowlist_entries_import_and_say_which_files_need_them():
    objs = safe_globals()
    assert len(objs) == len(SAFE_GLOBALS) == 8
    for name, obj in zip(SAFE_GLOBALS, objs):
        assert f"{obj.__module__}.{obj.__qualname__}" == name
    for name, why in SAFE_GLOBALS.items():
        assert re.search(r"cpu_zero1|ZeRO|fp16|rank\*\.pt", why), (name, why)


# ------------------------------------------------------------------ a crafted run directory: refused


@pytest.mark.parametrize("rel", ["run", "run/checkpoints", "run/checkpoints/step1",
                                 "run/checkpoints/step1/mp_rank_00_model_states.pt"])
def test_reader_refuses_the_crafted_run_and_runs_nothing(crafted, rel):
    from tsm_ds.engine.checkpoint.manager import load_finetune_weights, read_checkpoint
    from tsm_ds.inference.loading import load_for_inference

    path = crafted["run"].parent / rel
    for load in (read_checkpoint, load_for_inference, lambda p: load_finetune_weights(_resnet18(), p)):
        with pytest.raises(UntrustedCheckpointError, match=_refusal(crafted["file"])) as e:
            load(path)
        assert e.value.global_name == SYSTEM and e.value.path == crafted["file"] and "ZeRO-3" not in str(e.value)
    assert not crafted["marker"].exists()


def test_trust_unpickles_in_full_with_a_warning_and_never_calls_it_zero3(crafted, tmp_path, caplog):
    from tsm_ds.engine.checkpoint.manager import read_checkpoint

    c = read_checkpoint(crafted["run"], trust=True)   # the old behaviour, asked for: the payload runs
    assert crafted["marker"].is_file()
    ref = _resnet18().state_dict()
    assert sorted(c.state_dict) == sorted(ref) and all(torch.equal(c.state_dict[k], ref[k]) for k in ref)
    assert f"--trust-checkpoint: {crafted['file']} asks to unpickle {SYSTEM}; loading it with full unpickling" \
        in caplog.text
    # the payload in place of the weights: named as what it is, not as ZeRO-3 shards to consolidate
    bad = _crafted_run(tmp_path / "other", tmp_path / "MARKER2", module_too=True)
    f = bad / "checkpoints" / "step1" / "mp_rank_00_model_states.pt"
    with pytest.raises(ValueError, match=re.escape(f"{f} is not a DeepSpeed model-states file of a whole model: its "
                                                   "'module' entry is a int")) as e:
        read_checkpoint(bad, trust=True)
    assert "ZeRO-3" not in str(e.value) and "consolidate" not in str(e.value)


def test_eval_predict_export_commands_refuse_the_crafted_run(crafted, tmp_path, capsys):
    from tsm_ds.cli import eval as eval_cli
    from tsm_ds.cli import export as export_cli
    from tsm_ds.cli import predict as predict_cli

    run = str(crafted["run"])
    for prog, main, argv in (
            ("tsm-ds eval", eval_cli.main, ["--checkpoint", run, "--out", str(tmp_path / "ev")]),
            ("tsm-ds predict", predict_cli.main, ["--checkpoint", run, str(tmp_path / "video.mp4")]),
            ("tsm-ds export", export_cli.main, ["--checkpoint", run, "--out", str(tmp_path / "x")])):
        assert main(argv) == 2, prog
        err = capsys.readouterr().err
        assert re.search(_refusal(crafted["file"]), err), err
        assert f"{prog}: {crafted['file']} asks to unpickle" in err
    assert not crafted["marker"].exists() and not (tmp_path / "ev").exists() and not (tmp_path / "x").exists()


def test_train_tune_from_refuses_the_crafted_run(crafted, shared_data, tmp_path, caplog):
    from tsm_ds import train

    status = train.main(["--data", str(shared_data / "videos"), "--output-dir", str(tmp_path / "runs"), "--arch",
                         "resnet18", "--num-segments", str(T), "--img-size", str(SIZE), "--tune-from",
                         str(crafted["run"]), "--deepspeed_config", "cpu_fp32"])
    assert status == 2
    assert re.search(f"--tune-from {re.escape(str(crafted['run']))}: " + _refusal(crafted["file"]), caplog.text)
    assert not crafted["marker"].exists()


@pytest.mark.parametrize("evil", ["mp_rank_00_model_states.pt", "rank00000.pt"])
def test_resume_checks_every_file_of_the_tag_before_deepspeed_reads_it(tmp_path, evil):
    """CheckpointManager.load refuses before the engine is touched (engine=None here), on every rank alike."""
    from tsm_ds.engine.checkpoint.manager import CheckpointManager

    marker = tmp_path / "MARKER"
    run = _crafted_run(tmp_path, marker)
    tag = run / "checkpoints" / "step1"
    if evil == "rank00000.pt":   # the model-states file genuine, the per-rank file crafted
        states = torch.load(tag / "mp_rank_00_model_states.pt", weights_only=False)
        os.remove(marker)
        del states["payload"]
        torch.save(states, tag / "mp_rank_00_model_states.pt")
        torch.save({"epoch": 0, "rng": _RunsCode(marker)}, tag / "rank00000.pt")
    manager = CheckpointManager(run / "checkpoints")
    assert manager.pick_resume_tag("auto") == "step1"
    with pytest.raises(UntrustedCheckpointError, match=_refusal(tag / evil)):
        manager.load(engine=None, tag="step1")
    assert not marker.exists()


def test_deepspeeds_own_loads_are_forced_weights_only_inside_the_scope(crafted, monkeypatch):
    """DeepSpeed passes weights_only=False itself: inside weights_only_loading that load is refused too
    (naming the checkpoint given), and torch's environment switches are restored afterwards."""
    from tsm_ds.engine.checkpoint.safe_load import weights_only_loading

    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")   # a user's setting: lifted inside, kept after
    monkeypatch.delenv("TORCH_FORCE_WEIGHTS_ONLY_LOAD", raising=False)
    tag = crafted["file"].parent
    with pytest.raises(UntrustedCheckpointError, match=re.escape(f"{tag} asks to unpickle {SYSTEM}")):
        with weights_only_loading(tag):
            torch.load(crafted["file"], weights_only=False)   # as deepspeed's TorchCheckpointEngine.load does
    assert not crafted["marker"].exists()
    assert os.environ["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"] == "1" and "TORCH_FORCE_WEIGHTS_ONLY_LOAD" not in os.environ
    with weights_only_loading(tag, trust=True):   # trusted: DeepSpeed unpickles as it does by itself
        torch.load(crafted["file"], weights_only=False)
    assert crafted["marker"].is_file()


@pytest.mark.slow
def test_train_resume_refuses_the_crafted_run(crafted, shared_data, tmp_path):
    """``python -m tsm_ds.train ... --resume auto`` in the crafted run directory: exit 2, nothing run."""
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    p = subprocess.run([sys.executable, "-m", "tsm_ds.train", "--data", str(shared_data / "videos"), "--output-dir",
                        str(crafted["run"].parent), "--run-name", "run", "--arch", "resnet18", "--num-segments",
                        str(T), "--img-size", str(SIZE), "--batch-size", "2", "--micro-batch-size", "2",
                        "--num-workers", "0", "--no-progress", "--epochs", "1", "--resume", "auto",
                        "--deepspeed_config", "cpu_fp32"], env=env, capture_output=True, text=True, timeout=600)
    out = p.stdout + p.stderr
    assert p.returncode == 2, out[-3000:]
    assert re.search(_refusal(crafted["file"]), out), out[-3000:]
    assert not crafted["marker"].exists()


# ------------------------------------------------------------------ genuine checkpoints of every CPU recipe (slow)


class Tiny(nn.Module):
    """(N, T, 3, 8, 8) -> (N, 3): conv, BN, average, fc head (``new_fc``)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.new_fc = nn.Linear(4, 3)
        self.config = {"arch": "tiny", "num_classes": 3}

    def forward(self, x):
        n, t = x.shape[:2]
        return self.new_fc(self.bn(self.conv(x.flatten(0, 1))).relu().mean((2, 3))).view(n, t, -1).mean(1)


class Clips(torch.utils.data.Dataset):
    """Random clips (T, 3, size, size), a function of (epoch, index)."""

    def __init__(self, n: int, size: int = 8):
        self.n, self.size, self.epoch = n, size, 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(self.epoch * 10_007 + i)
        return {"clip": torch.randn(T, 3, self.size, self.size, generator=g), "label": i % 3, "index": i, "bad": 0}


def _recipes() -> list[str]:
    from tsm_ds.engine.config.recipes import recipe_names

    return [n for n in recipe_names() if not n.startswith("gpu_")] + ["zero3"]


def _engine_json(name: str) -> dict:
    from tsm_ds.engine.config.recipes import load_config

    if name in ("zero3", "zero3_resnet18"):   # no shipped recipe: cpu_zero1 at stage 3 (partitioned parameters)
        return {**load_config("cpu_zero1"), "zero_optimization": {"stage": 3}}
    return load_config(name)


def _worker(spec: dict) -> None:
    """A plain ``python`` process (a world of one): per recipe, train 2 steps (a checkpoint), then resume
    it for a 3rd step with the trainer's default (weights-only) loading; results to results.json."""
    from tsm_ds.config import tree_with
    from tsm_ds.engine.loop.trainer import Trainer, TrainSettings

    torch.set_num_threads(1)
    out, results = Path(spec["out"]), {}
    for name in spec["recipes"]:
        model, size = (_resnet18, SIZE) if name == "zero3_resnet18" else (Tiny, 8)

        def settings(**kw):
            config = tree_with({"schedule.epochs": 1, "data.num_workers": 0, "logging.progress": False,
                                "schedule.batch_size": 2, "schedule.micro_batch_size": 2, "output.keep_last": 1, **kw})
            return TrainSettings(run_dir=out / name, config=config, class_names=NAMES)

        try:
            Trainer(model(), Clips(8, size), None, _engine_json(name), settings(**{"schedule.max_steps": 2})).fit()
            tr = Trainer(model(), Clips(8, size), None, _engine_json(name), settings(**{"schedule.max_steps": 3,
                                                                                "output.resume": "auto"}))
            tr.fit()
            results[name] = {"step": tr.state.step}
        except Exception as e:  # noqa: BLE001 - reported per recipe
            results[name] = {"error": f"{type(e).__name__}: {e}"}
    (out / "results.json").write_text(json.dumps(results))


@pytest.fixture(scope="module")
def recipe_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("recipes")
    spec = {"out": str(out), "recipes": _recipes() + ["zero3_resnet18"]}
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    p = subprocess.run([sys.executable, __file__, json.dumps(spec)], env=env, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    return {"out": out, "results": json.loads((out / "results.json").read_text())}


@pytest.mark.slow
def test_every_cpu_recipe_resumes_weights_only(recipe_runs):
    assert set(recipe_runs["results"]) == set(_recipes()) | {"zero3_resnet18"}
    assert recipe_runs["results"] == {name: {"step": 3} for name in recipe_runs["results"]}


@pytest.mark.slow
@pytest.mark.parametrize("name", _recipes())
def test_every_cpu_recipe_reads_and_tunes_from_weights_only(recipe_runs, name):
    from tsm_ds.engine.checkpoint.manager import load_finetune_weights, read_checkpoint

    run = recipe_runs["out"] / name
    c, export = read_checkpoint(run), read_checkpoint(run / "last_model.pt")
    assert c.source == "deepspeed" and c.path.parent.name == "step00000003" and c.class_names == NAMES
    assert sorted(c.state_dict) == sorted(export.state_dict)
    for k, v in export.state_dict.items():
        assert torch.equal(c.state_dict[k], v), k
    dst = Tiny()
    assert load_finetune_weights(dst, run)["loaded"] == len(export.state_dict)
    assert all(torch.equal(v, export.state_dict[k]) for k, v in dst.state_dict().items())


@pytest.mark.slow
def test_each_allowlisted_global_is_needed_and_together_they_suffice(recipe_runs):
    """Every file of every recipe's checkpoint loads weights-only with the allowlist; without any one
    entry (but fp16's, GPU-only) some file no longer loads."""
    from tsm_ds.engine.checkpoint import safe_load

    files = sorted(f for name in _recipes() for f in (recipe_runs["out"] / name / "checkpoints").rglob("*.pt"))
    assert len(files) >= 2 * len(_recipes())

    def refused(allow: list) -> set[str]:
        out = set()
        for f in files:
            try:
                with torch.serialization.safe_globals(allow):
                    torch.load(f, map_location="cpu", weights_only=True)
            except Exception as e:  # noqa: BLE001
                out.add(safe_load.refused_global(e) or repr(e))
        return out

    objs = dict(zip(SAFE_GLOBALS, safe_globals()))
    assert refused(list(objs.values())) == set()
    for name in set(SAFE_GLOBALS) - GPU_ONLY:
        assert name in refused([o for n, o in objs.items() if n != name]), name


@pytest.mark.slow
def test_commands_on_a_genuine_zero3_run(recipe_runs, shared_data, tmp_path, capsys):
    """eval, predict and export read a real ZeRO-3 run (its shards consolidated weights-only)."""
    from tsm_ds.cli import eval as eval_cli
    from tsm_ds.cli import export as export_cli
    from tsm_ds.cli import predict as predict_cli

    run = str(recipe_runs["out"] / "zero3_resnet18")
    videos = sorted((shared_data / "videos").rglob("*.mp4"))[:2]
    (tmp_path / "list.txt").write_text("".join(f"{v} {i}\n" for i, v in enumerate(videos)))
    assert eval_cli.main(["--checkpoint", run, "--list", str(tmp_path / "list.txt"), "--out", str(tmp_path / "ev"),
                          "--no-plot"]) == 0
    metrics = json.loads(next((tmp_path / "ev").glob("*.json")).read_text())
    assert metrics["videos"] == 2
    assert predict_cli.main(["--checkpoint", run, str(videos[0]), "--top-k", "3"]) == 0
    shown = capsys.readouterr().out
    assert all(f" {n} " in shown for n in NAMES)
    assert export_cli.main(["--checkpoint", run, "--out", str(tmp_path / "x"), "--formats", "pt2"]) == 0
    assert (tmp_path / "x" / "model.pt2").is_file()


if __name__ == "__main__":
    _worker(json.loads(sys.argv[1]))
