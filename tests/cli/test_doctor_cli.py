"""tsm-ds doctor end to end: launch/gpu_check.sh --dry-run (the doctor, compute variants, the
recipe smoke and the 1-bit check on CPU at tiny sizes), the doctor under the deepspeed launcher
(communication measured), option errors."""
from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tsm_ds.bench.doctor import verdict
from tsm_ds.cli import doctor as cli

REPO = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TINY = ["--arch", "resnet18", "--num-segments", "2", "--img-size", "32", "--micro-batch-size", "2", "--quick",
        "--no-progress"]


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    """2 classes x 2 small H.264 clips (class-folder tree)."""
    from tsm_ds.data.testvideo import write_numbered_video

    root = tmp_path_factory.mktemp("doctor_clips")
    for c in ("a", "b"):
        (root / c).mkdir()
        for i in range(2):
            write_numbered_video(root / c / f"{c}{i}.mp4", 40 + 10 * i, gop=12)
    return root


def _env():
    env = dict(os.environ, DS_ACCELERATOR="cpu", PYTHONPATH=str(REPO))
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".venv" / "torch_extensions"))
    return env


def _advice_matches_json(report: dict) -> None:
    """Every number the advice quotes equals the value stored in its section (the done-when)."""
    for item in report["sections"]["verdict"]["values"]["advice"]:
        for num in item["numbers"]:
            assert report["sections"][num["section"]]["values"][num["key"]] == num["value"]
            assert num["shown"] in item["text"]
        for tok in re.findall(r"(?<![\w.])x\d+(?:\.\d+)?", item["text"]):
            assert tok in [n["shown"] for n in item["numbers"]]


def test_bad_options(capsys):
    assert cli.main(["--only", "nope", "--no-progress", "--out", "/tmp/unused_doctor"]) == 2
    assert "unknown section(s) ['nope']" in capsys.readouterr().err
    assert cli.main(["--precisions", "fp8"]) == 2
    assert "--precisions fp8" in capsys.readouterr().err


@pytest.mark.slow
def test_gpu_check_dry_run(tmp_path, clips):
    out = tmp_path / "out"
    r = subprocess.run(["bash", str(REPO / "launch" / "gpu_check.sh"), "--dry-run", "--out", str(out),
                        "--data", str(clips)], env=dict(_env(), GPU_CHECK_WORK=str(tmp_path / "work")),
                       capture_output=True, text=True, timeout=900)
    log = (out / "gpu_check.log").read_text() if (out / "gpu_check.log").is_file() else r.stdout + r.stderr
    assert r.returncode == 0, log[-4000:]
    lines = [json.loads(x) for x in (out / "gpu_check.jsonl").read_text().splitlines()]
    status = {x["section"]: x["status"] for x in lines}
    assert status == {"setup": "skipped", "doctor": "ok", "precisions": "skipped", "recipes": "ok",
                      "fusedlamb": "skipped", "onebit": "ok", "compile": "skipped"}
    doc = {x["section"]: x["doctor"] for x in lines}

    # the doctor: schema, every section, measured values consistent with each other
    rep = doc["doctor"]
    assert rep["schema"] == "tsm_ds.doctor/1" and rep["exit_status"] == 0
    secs = rep["sections"]
    assert list(secs) == ["environment", "compute", "data", "communication", "verdict"]
    c, d = secs["compute"]["values"], secs["data"]["values"]
    assert c["clips_per_s"] == pytest.approx(c["micro_batch"] / c["step_s"]) and c["micro_batch"] == 2
    assert d["clips"] == 4 and d["workers_needed"] == math.ceil(c["clips_per_s"] / d["per_worker_clips_per_s"])
    assert [r["workers"] for r in secs["data"]["rows"]][:2] == [0, 1]
    assert d["reencode_clips"] == 1 and d["reencode_speedup"] > 0
    assert d["pipeline_vs_alone"] == pytest.approx(
        d["pipeline_clips_per_s"] / min(d["loader_clips_per_s"], c["clips_per_s"]))
    comm = secs["communication"]
    assert comm["status"] == "not_measured" and "deepspeed --num_gpus 2 --module tsm_ds.cli.doctor" in comm["values"]["how"]
    v = secs["verdict"]["values"]
    assert v == {**verdict.decide(secs), "advice": v["advice"]}
    _advice_matches_json(rep)
    assert (out / "doctor.png").read_bytes()[:8] == PNG_MAGIC
    assert "## Verdict" in (out / "doctor.md").read_text()

    # compute variants (the dry run measures them in the doctor section): bf16, channels-last, fp32 base
    rows = {r["variant"]: r for r in secs["compute"]["rows"]}
    # (threads_1: the one-thread step, measured on a multi-core CPU)
    assert set(rows) - {"threads_1"} == {"base", "channels_last", "bf16"} and rows["bf16"]["precision"] == "bf16"
    assert rows["channels_last"]["channels_last"] and rows["base"]["threads"] >= rows.get("threads_1", rows["base"])["threads"]
    assert c["speedup_bf16"] == pytest.approx(rows["base"]["step_s"] / rows["bf16"]["step_s"])

    # recipe smoke: one runs, one is refused with its message, the 1,536-GPU one is resolved only
    rec = {r["recipe"]: r for r in doc["recipes"]["sections"]["recipes"]["rows"]}
    assert rec["cpu_fp32"]["status"] == "ok" and rec["cpu_fp32"]["steps"] == 2
    assert rec["cpu_fp32"]["message"].endswith(", checkpoint loads weights-only")
    assert math.isfinite(rec["cpu_fp32"]["loss"])
    assert rec["gpu_fp16"]["status"] == "refused" and "fp16" in rec["gpu_fp16"]["message"]
    assert rec["gpu_kinetics_1536"]["status"] == "resolved" and "lr 1.92" in rec["gpu_kinetics_1536"]["message"]

    # the 1-bit check on CPU tensors: both paths agree, both ranks hold the same result
    ob = doc["onebit"]["sections"]["onebit"]["values"]
    assert ob["rel_diff_vs_cpu"] == 0.0 and ob["same_on_ranks"] and ob["rel_error_1step"] < 1.5


@pytest.mark.slow
def test_recipe_smoke_checks_that_the_checkpoint_loads_weights_only(tmp_path):
    """cpu_zero1's optimizer states pickle DeepSpeed classes (allowlisted); with one of them taken off the
    allowlist (a DeepSpeed upgrade that pickles a new class), the recipe fails, naming the file and class."""
    code = ("import sys; from tsm_ds.engine import safe_load; safe_load.SAFE_GLOBALS.pop(sys.argv[1], None); "
            "from tsm_ds.cli import doctor; sys.exit(doctor.main(sys.argv[2:]))")
    args = ["--only", "recipes", "--recipes", "--recipe-names", "cpu_zero1", "--recipe-steps", "1", "--num-segments",
            "2", "--no-progress"]
    drop = "deepspeed.runtime.zero.config.ZeroStageEnum"
    for name, expect in (("", 0), (drop, 1)):
        out = tmp_path / (name or "all")
        r = subprocess.run([sys.executable, "-c", code, name, *args, "--out", str(out)],
                           env=dict(_env(), OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=600,
                           cwd=str(tmp_path))
        assert r.returncode == expect, (r.stdout + r.stderr)[-3000:]
        row = json.loads((out / "doctor.json").read_text())["sections"]["recipes"]["rows"][0]
        if not name:
            assert row["status"] == "ok" and row["message"].endswith(", checkpoint loads weights-only")
        else:
            assert row["status"] == "failed" and re.search(
                r"its checkpoint does not load weights-only: \S+/step00000001/zero_pp_rank_0_mp_rank_00_optim_states.pt "
                f"asks to unpickle {drop}, which tsm_ds does not load", row["message"]), row["message"]


@pytest.mark.slow
def test_communication_under_the_launcher(tmp_path):
    from tsm_ds.engine.dist import free_port

    port = free_port()
    cmd = [str(Path(sys.executable).parent / "deepspeed"), "--num_gpus", "2", "--master_port", str(port),
           "--module", "tsm_ds.cli.doctor", *TINY, "--arch", "mobilenet_v2", "--num-classes", "10",
           "--only", "compute,communication,verdict",
           "--out", str(tmp_path)]
    try:
        r = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=600, cwd=str(tmp_path))
    finally:
        for f in Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_{os.getuid()}_*_{port}_*"):
            f.unlink(missing_ok=True)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    rep = json.loads((tmp_path / "doctor.json").read_text())
    comm = rep["sections"]["communication"]
    assert comm["status"] == "ok" and comm["values"]["world_size"] == 2
    assert [row["method"] for row in comm["rows"]] == ["fp32", "bf16", "onebit"]
    m, c = comm["values"], rep["sections"]["compute"]["values"]
    assert m["grad_numel"] == c["grad_numel"] and c["world_size"] == 2
    assert m["speedup_bf16"] == pytest.approx(m["allreduce_ms_fp32"] / m["allreduce_ms_bf16"])
    assert m["bytes_ratio_onebit"] > 20
    v = rep["sections"]["verdict"]["values"]
    assert v["comm_vs_compute"] == pytest.approx(m["allreduce_s"] / c["step_s"])
    assert v["bound"] in ("compute", "communication")   # no data section: the loader is not in play
