"""tsm-ds doctor without measuring: the verdict on stored ratios, the advice's numbers against the
JSON, the section runner, the reports (tsm_ds.doctor.{verdict,core,report})."""
from __future__ import annotations

import json
import re

import pytest

from tsm_ds.doctor import SECTIONS, Context, DoctorSettings, Section, section_result, verdict
from tsm_ds.doctor import comm as dcomm
from tsm_ds.doctor import compute as dcompute
from tsm_ds.doctor import data as ddata
from tsm_ds.doctor.core import run_sections
from tsm_ds.doctor.doctor_report import build_report, write_report
from tsm_ds.engine.config.recipes import load_config

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
FACTOR = re.compile(r"(?<![\w.])x\d+(?:\.\d+)?")


def _sections(*, step_s, batch=2, loader=None, allreduce_s=None, data_extra=None, compute_extra=None):
    """Sections as measured ones store them (only the values the verdict reads, plus extras)."""
    res = {"compute": section_result("compute", values={"step_s": step_s, "micro_batch": batch,
                                                        "clips_per_s": batch / step_s, **(compute_extra or {})},
                                     rows=[{"variant": "base", "precision": "fp32", "clips_per_s": batch / step_s}])}
    if loader is not None:
        res["data"] = section_result("data", values={"loader_clips_per_s": loader, "workers_available": 2,
                                                     **(data_extra or {})},
                                     rows=[{"measure": "loader alone", "workers": 2, "clips_per_s": loader},
                                           {"measure": "pipeline (loader + training steps)", "workers": 2,
                                            "clips_per_s": 0.75}])
    if allreduce_s is None:
        res["communication"] = section_result("communication", status="not_measured",
                                              values={"how": "deepspeed --num_gpus 2 --module tsm_ds.cli.doctor"})
    else:
        res["communication"] = section_result("communication", values={
            "allreduce_s": allreduce_s, "speedup_bf16": 1.6, "speedup_onebit": 0.8, "bytes_ratio_onebit": 31.0})
    return res


def _verdict(res, cuda=False):
    ctx = Context(settings=DoctorSettings().resolved(cuda), cuda=cuda)
    res = dict(res)
    res["verdict"] = verdict.run(ctx, res)
    return res


def _check_numbers(report: dict) -> int:
    """Every number quoted by the advice is the value stored in the JSON; returns how many."""
    n = 0
    v = report["sections"]["verdict"]
    for item in v["values"]["advice"]:
        shown = [num["shown"] for num in item["numbers"]]
        for num in item["numbers"]:
            assert report["sections"][num["section"]]["values"][num["key"]] == num["value"]
            assert verdict.shown(num["value"], "count" if num["shown"].isdigit() else
                                 "factor" if num["shown"].startswith("x") else "rate") == num["shown"]
            assert num["shown"] in item["text"]
            n += 1
        for tok in FACTOR.findall(item["text"]):
            assert tok in shown, f"{tok} in {item['text']!r} is not a stored ratio"
    if v["values"]["factor"] is not None:
        assert verdict.shown(v["values"]["factor"]) in v["summary"]
    return n


def test_data_bound_on_stored_ratios(tmp_path):
    # compute 2 clips in 0.5 s = 4 clips/s; the loader gives 1.25: data-bound by 3.2
    res = _verdict(_sections(step_s=0.5, loader=1.25, data_extra={
        "workers_needed": 7, "reencode_speedup": 3.14159, "reencode_clips": 3, "workers_needed_reencoded": 3,
        "pipeline_vs_alone": 0.6, "pipeline_clips_per_s": 0.75}))
    v = res["verdict"]["values"]
    assert v["bound"] == "data" and v["factor"] == pytest.approx(4.0 / 1.25)
    assert v["train_clips_per_s"] == 1.25
    texts = " | ".join(a["text"] for a in v["advice"])
    assert "needs 7 loader workers per device" in texts and "2 core(s) per device" in texts
    assert "tsm-ds prepare SRC OUT --short-side 256`" in texts and "x3.1 loader clips/s on a sample of 3" in texts
    assert "x0.60 of the slower" in texts and "deepspeed --num_gpus 2" in texts
    # stored, written, parsed back: every factor in the advice equals the ratio in the JSON
    report = build_report(DoctorSettings().as_dict(), res)
    paths = write_report(report, tmp_path)
    parsed = json.loads(paths["json"].read_text())
    assert _check_numbers(parsed) >= 6
    assert paths["png"].read_bytes()[:8] == PNG_MAGIC
    md = paths["md"].read_text()
    assert "## Verdict" in md and "data-bound by x3.2" in md and "![clips/s per device](doctor.png)" in md


def test_compute_bound_and_variants():
    res = _verdict(_sections(step_s=8.0, loader=3.0, data_extra={"workers_needed": 1},
                             compute_extra={"speedup_channels_last": 1.31, "speedup_bf16": 0.97}))
    v = res["verdict"]["values"]
    assert v["bound"] == "compute" and v["factor"] == pytest.approx(3.0 / 0.25)
    texts = [a["text"] for a in v["advice"]]
    assert "`--channels-last`: compute x1.3 faster" in texts
    assert "training in bf16: compute x0.97 (no gain here)" in texts
    assert any("a GPU is the change that matters" in t for t in texts)
    assert _check_numbers({"sections": res}) >= 3
    # on CUDA the CPU hint goes
    cuda = _verdict(_sections(step_s=8.0, loader=3.0), cuda=True)["verdict"]["values"]["advice"]
    assert not any("GPU is the change" in a["text"] for a in cuda)


def test_communication_bound():
    # compute 0.2 s, all-reduce 0.5 s per step; the loader keeps up (100 clips/s)
    res = _verdict(_sections(step_s=0.2, loader=100.0, allreduce_s=0.5))
    v = res["verdict"]["values"]
    assert v["bound"] == "communication" and v["factor"] == pytest.approx(2.5)
    assert v["compute_comm_clips_per_s"] == pytest.approx(2 / 0.7)
    texts = " | ".join(a["text"] for a in v["advice"])
    assert "x2.5 the compute of a step" in texts and "bf16" in texts and "x1.6 faster" in texts
    assert "1-bit" not in texts          # measured slower (x0.8): not advised
    _check_numbers({"sections": res})
    # compute-bound with a measured all-reduce: its share is said; no loader measured: said so
    res = _verdict(_sections(step_s=1.0, allreduce_s=0.25))
    assert res["verdict"]["values"]["bound"] == "compute" and "loader was not measured" in res["verdict"]["summary"]
    assert any("adds x0.25 of a step's compute time" in a["text"] for a in res["verdict"]["values"]["advice"])
    _check_numbers({"sections": res})
    # a slow loader still binds first: data-bound, with the all-reduce in the device's rate
    res = _verdict(_sections(step_s=0.2, loader=1.0, allreduce_s=0.5))
    assert res["verdict"]["values"]["bound"] == "data"
    assert res["verdict"]["values"]["factor"] == pytest.approx((2 / 0.7) / 1.0)


def test_no_verdict_without_compute():
    res = {"compute": section_result("compute", status="failed", error="RuntimeError: x")}
    v = _verdict(res)["verdict"]
    assert v["status"] == "not_measured" and v["values"]["bound"] is None


def test_shown_formats():
    assert [verdict.shown(x) for x in (31.4, 3.14, 0.523)] == ["x31", "x3.1", "x0.52"]
    assert verdict.shown(11.0, "count") == "11" and verdict.shown(0.12345, "rate") == "0.123"


def test_runner_failed_section_only_and_schema():
    calls = []

    def boom(ctx, results):
        raise RuntimeError("no such device")

    def fine(ctx, results):
        calls.append(sorted(results))
        return section_result("fine", values={"a": 1})
    secs = [Section("boom", "Boom", boom), Section("fine", "Fine", fine),
            Section("off", "Off", fine, enabled=lambda s: False)]
    res = run_sections(Context(settings=DoctorSettings()), secs)
    assert list(res) == ["boom", "fine"] and calls == [["boom"]]
    assert res["boom"]["status"] == "failed" and "RuntimeError: no such device" in res["boom"]["error"]
    assert set(res["fine"]) == {"name", "title", "status", "seconds", "summary", "values", "rows", "notes", "error"}
    assert build_report({}, res)["exit_status"] == 1
    res = run_sections(Context(settings=DoctorSettings(only=("off",))), secs)
    assert list(res) == ["off"]
    with pytest.raises(ValueError, match="unknown section"):
        run_sections(Context(settings=DoctorSettings(only=("nope",))), secs)
    with pytest.raises(ValueError, match="status"):
        section_result("x", status="great")
    assert [s.name for s in SECTIONS][-1] == "verdict"


def test_recipe_readers_and_helpers():
    assert dcompute.recipe_precision(load_config("cpu_fp32")) == "fp32"
    assert dcompute.recipe_precision(load_config("cpu_bf16")) == "bf16"
    assert dcompute.recipe_precision(load_config("cpu_bf16_autocast")) == "autocast_bf16"
    assert dcompute.recipe_precision(load_config("gpu_fp16")) == "fp16"
    assert dcomm.recipe_comm_method(load_config("cpu_comm_bf16")) == "bf16"
    assert dcomm.recipe_comm_method(load_config("cpu_fp32_onebit")) == "onebit"
    assert dcomm.recipe_comm_method(load_config("gpu_fp16_comm_fp16")) == "fp16"
    assert dcomm.recipe_comm_method(load_config("cpu_fp32")) == "fp32"
    assert ddata.worker_counts(16, False) == [1, 2, 4, 8, 16] and ddata.worker_counts(6, False) == [1, 2, 4, 6]
    assert ddata.worker_counts(2, True) == [1, 2] and ddata.worker_counts(1, False) == [1]
    assert ddata.sample(list(range(17)), 3) == [0, 8, 16] and ddata.sample([5, 6], 3) == [5, 6]
    ctx = Context(settings=DoctorSettings(micro_batch=None, quick=True).resolved(False))
    assert dcompute.micro_batch(ctx, load_config("cpu_fp32")) == 1
    assert dcompute.micro_batch(ctx, load_config("gpu_kinetics_1536")) == 8
    hint = dcomm.launcher_hint(ctx)
    assert hint.startswith("deepspeed --num_gpus 2 --module tsm_ds.cli.doctor") and "--arch resnet18" in hint


def test_data_advice_names_the_format_and_the_cores_per_gpu():
    res = _verdict(_sections(step_s=0.5, loader=1.25, data_extra={
        "data_format": "raw video", "per_worker_clips_per_s": 4.0, "cores_per_gpu_a100": 75.0,
        "cores_per_gpu_h100": 150.0, "reencode_speedup": 5.5, "reencode_clips": 3,
        "reencode_command": "tsm-ds prepare SRC OUT --mode packed --short-side 256"}))
    advice = [a["text"] for a in res["verdict"]["values"]["advice"]]
    assert advice[0] == ("data format measured: raw video; one core loads 4 training clips/s, so feeding a GPU "
                         "takes 75 cores per A100 (~300 clips/s) and 150 per H100/H200 (~600 clips/s); "
                         "`tsm-ds prepare SRC OUT` writes the training-ready packed format")
    assert any(t.startswith("prepare with `tsm-ds prepare SRC OUT --mode packed --short-side 256`: x5.5"
                            .replace("`: ", "` and train on OUT: ")) for t in advice)
    assert _check_numbers({"sections": res}) >= 5


def test_detect_format(tmp_path):
    from tsm_ds.data.prepare import extract_frames, pack_video
    from tsm_ds.data.records import VideoRecord
    from tsm_ds.data.testvideo import write_numbered_video

    write_numbered_video(tmp_path / "raw.mp4", 80, gop=250)
    short = write_numbered_video(tmp_path / "short.mp4", 80, gop=16)
    pack_video(short, str(tmp_path / "p.jpack"), short_side=64)
    extract_frames(short, str(tmp_path / "frames"), short_side=64)
    got = {p: ddata.detect_format([VideoRecord(str(tmp_path / p), 0)])
           for p in ("raw.mp4", "short.mp4", "p.jpack", "frames")}
    assert {p: g["format"] for p, g in got.items()} == {"raw.mp4": "raw video", "short.mp4": "re-encoded video",
                                                        "p.jpack": "packed", "frames": "JPEG folders"}
    assert got["raw.mp4"]["keyframe_interval"] == 80 and got["short.mp4"]["keyframe_interval"] == 16
    mixed = ddata.detect_format([VideoRecord(str(tmp_path / p), 0) for p in ("raw.mp4", "p.jpack", "p.jpack")])
    assert mixed["format"] == "packed" and mixed["counts"] == {"raw video": 1, "packed": 2}


def test_plot_title_shows_the_whole_verdict():
    from tsm_ds.doctor.doctor_report import figure

    res = _verdict(_sections(step_s=0.5, loader=1.25, data_extra={"workers_needed": 7}))
    summary = res["verdict"]["summary"]
    assert len(summary) > 90                     # longer than a line: the old title was cut off here
    fig = figure(build_report(DoctorSettings().as_dict(), res))
    text = fig._suptitle
    assert " ".join(text.get_text().split("\n")) == summary and "\n" in text.get_text()
    fig.canvas.draw()
    box, page = text.get_window_extent(), fig.bbox
    assert page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0 and box.y1 <= page.y1
    import matplotlib.pyplot as plt
    plt.close(fig)
