"""tsm-ds doctor end to end: launch/gpu_check.sh --dry-run (the doctor, compute variants, the
recipe smoke and the 1-bit check on CPU at tiny sizes), the doctor under the deepspeed launcher
(communication measured), option errors."""
from __future__ import annotations

import json
import math
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tsm_ds.cli import doctor as cli
from tsm_ds.doctor import verdict

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
                      "fusedlamb": "skipped", "onebit": "ok", "gpudecode": "ok", "largebatch": "ok",
                      "compile": "skipped"}
    doc = {x["section"]: x["doctor"] for x in lines}

    # the large-batch GPU loop at tiny sizes on the CPU: every run of its plan, bf16, ghost BatchNorm
    lb = doc["largebatch"]
    assert [r["name"] for r in lb["rows"]] == ["sgd_b8", "sgd_b32", "lars_b32", "lamb_b32"]
    assert lb["settings"]["bf16"] and lb["settings"]["ghost_bn_clips"] == 8 and lb["device"] == "cpu"
    assert all(r["status"] == "completed" and r["steps"] == 64 // r["batch"] for r in lb["rows"])

    # batched decoding on the CPU (the GPU run: cuda): the same pixels as the workers' path
    g = doc["gpudecode"]
    assert g["device"] == "cpu" and g["videos"] == 4 and g["items_compared"] == 4
    assert g["pixel_max_abs_diff"] == 0 and g["pixel_mean_abs_diff"] == 0
    assert g["cpu_workers"]["clips"] > 0 and g["decode_device"]["clips"] > 0
    assert g["ratio"] == pytest.approx(g["decode_device"]["clips_per_s"] / g["cpu_workers"]["clips_per_s"], rel=1e-2)

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
    assert comm["status"] == "not_measured" \
        and "deepspeed --num_gpus 2 --module tsm_ds.cli.doctor" in comm["values"]["how"]
    v = secs["verdict"]["values"]
    assert v == {**verdict.decide(secs), "advice": v["advice"]}
    _advice_matches_json(rep)
    assert (out / "doctor.png").read_bytes()[:8] == PNG_MAGIC
    assert "## Verdict" in (out / "doctor.md").read_text()

    # compute variants (the dry run measures them in the doctor section): bf16, channels-last, fp32 base
    rows = {r["variant"]: r for r in secs["compute"]["rows"]}
    # (threads_1: the one-thread step, measured on a multi-core CPU)
    assert set(rows) - {"threads_1"} == {"base", "channels_last", "bf16"} and rows["bf16"]["precision"] == "bf16"
    assert rows["channels_last"]["channels_last"] \
        and rows["base"]["threads"] >= rows.get("threads_1", rows["base"])["threads"]
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
    code = ("import sys; from tsm_ds.engine.checkpoint import safe_load; "
            "safe_load.SAFE_GLOBALS.pop(sys.argv[1], None); "
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
                r"its checkpoint does not load weights-only: "
                r"\S+/step00000001/zero_pp_rank_0_mp_rank_00_optim_states.pt "
                f"asks to unpickle {drop}, which tsm_ds does not load", row["message"]), row["message"]


@pytest.mark.slow
def test_communication_under_the_launcher(tmp_path):
    from tsm_ds.engine.comm.dist import free_port

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


def test_report_header_names_the_model_the_doctor_measured():
    """doctor.md's header: the model the sections built, after the doctor's own defaults; none for a
    cluster-only run (the launch preflight), whatever training's flags are."""
    from tsm_ds.doctor import DoctorSettings, section_result
    from tsm_ds.doctor.doctor_report import build_report, markdown, measured

    s = DoctorSettings(arch="resnet18", num_segments=2, img_size=32, recipe="cpu_fp32").as_dict()
    comp = section_result("compute", values={"arch": "resnet18", "num_segments": 2, "img_size": 32})
    rep = build_report(s, {"environment": section_result("environment"), "compute": comp,
                           "data": section_result("data")})
    assert measured(rep) == "model resnet18 2x32 (compute, data), recipe cpu_fp32"
    assert markdown(rep).splitlines()[2].endswith("; model resnet18 2x32 (compute, data), recipe cpu_fp32")
    quick = DoctorSettings(quick=True).resolved(False).as_dict()          # resnet18 8x64 after the defaults
    failed = section_result("compute", status="failed")
    assert measured(build_report(quick, {"compute": failed})) == "model resnet18 8x64 (compute), recipe cpu_fp32"
    rec = section_result("recipes", values={"arch": "resnet18", "num_segments": 8, "img_size": 64})
    assert (measured(build_report(quick, {"environment": section_result("environment"), "recipes": rec}))
            == "recipe smoke model resnet18 8x64, recipe cpu_fp32")
    full = DoctorSettings().resolved(False).as_dict()                     # resnet50 8x224: not measured here
    assert measured(build_report(full, {"cluster": section_result("cluster")})) == "no model measured (cluster)"


def _local_ssh(tmp_path: Path, monkeypatch) -> None:
    """An ``ssh`` on PATH that runs its command on this machine (options and host dropped): the
    cluster section's remote probes, without sshd."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "ssh").write_text('#!/bin/sh\nwhile [ $# -gt 1 ]; do case "$1" in -o|-p) shift 2;; *) shift; break;; '
                                'esac; done\nexec sh -c "$*"\n')
    (bindir / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")


def _cluster_doctor(tmp_path, name, *args):
    hf = tmp_path / "hosts"
    hf.write_text("localhost slots=1\n")
    out = tmp_path / name
    rc = cli.main(["--hostfile", str(hf), "--run-dir", str(tmp_path / "run"), "--out", str(out), "--no-progress",
                   *args])
    rep = json.loads((out / "doctor.json").read_text())
    rows = {(r["host"], r["check"]): r for r in rep["sections"]["cluster"]["rows"]}
    return rc, rep, rows, out


def test_cluster_check_of_a_master_addr_that_does_not_resolve_says_only_that(tmp_path, monkeypatch, capsys):
    _local_ssh(tmp_path, monkeypatch)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rc, rep, rows, out = _cluster_doctor(tmp_path, "unresolved", "--master-addr", "no-such-host.invalid",
                                         "--master-port", str(port))
    assert rc == 1
    assert rows[("localhost", "ssh")]["status"] == "ok" and rows[("localhost", "python")]["status"] == "ok"
    addr = rows[("localhost", "master address")]
    assert addr["status"] == "failed"
    assert addr["detail"].startswith("no-such-host.invalid does not resolve on localhost: ")
    # the fix names the option as the launch scripts and this command spell it
    assert "launch scripts: --master_addr, tsm-ds doctor: --master-addr" in addr["fix"]
    assert rows[("localhost", "master port")] == {
        "host": "localhost", "check": "master port", "status": "skipped", "fix": "",
        "detail": "not checked: no-such-host.invalid does not resolve on localhost"}
    assert "another process holds" not in (out / "doctor.json").read_text()
    table = capsys.readouterr().out.split("cluster checks that failed:", 1)[1]
    assert "master address" in table and "master port" not in table and table.count("fix:") == 1
    assert rep["sections"]["cluster"]["values"]["failed_checks"] == 1
    # the header names no model: the preflight measured none (it said "model resnet50 8x224")
    assert (out / "doctor.md").read_text().splitlines()[2].endswith("; no model measured (cluster)")


def test_cluster_check_of_a_held_port_and_of_a_foreign_address(tmp_path, monkeypatch):
    _local_ssh(tmp_path, monkeypatch)
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        rc, _, rows, _ = _cluster_doctor(tmp_path, "held", "--master-addr", "127.0.0.1", "--master-port", str(port))
    assert rc == 1
    assert rows[("localhost", "master address")]["status"] == "ok"
    row = rows[("localhost", "master port")]
    assert row["status"] == "failed" and "Address already in use" in row["detail"]
    assert row["fix"] == (f"another process holds port {port} on localhost: pick another MASTER_PORT "
                          "(launch scripts: --master_port, tsm-ds doctor: --master-port), or stop it")
    # 192.0.2.1 (TEST-NET-1) resolves but is no address of this host: not "another process holds"
    rc, _, rows, _ = _cluster_doctor(tmp_path, "foreign", "--master-addr", "192.0.2.1", "--master-port", str(port))
    row = rows[("localhost", "master port")]
    assert rc == 1 and row["status"] == "failed" and "another process" not in row["fix"]
    assert row["fix"].startswith("192.0.2.1 (192.0.2.1) is not an address of localhost, where rank 0 listens")
