"""tsm-ds bench dispatch (tsm_ds.cli.bench), the combined 'all' run (tsm_ds.bench.runner; scale
only here: fast), plots and the report helpers (tsm_ds.utils.io)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tsm_ds.bench import plots, runner
from tsm_ds.bench import scaling as S  # noqa: F401  (the package imports without torch)
from tsm_ds.cli import bench as cli
from tsm_ds.utils import io as report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_dispatch_scale_writes_a_prediction(tmp_path, capsys):
    assert cli.main(["scale", "--out-dir", str(tmp_path), "--no-plot"]) == 0
    payload = json.loads((tmp_path / "scale.json").read_text())
    pred, cal = payload["meta"]["prediction"], payload["meta"]["calibration"]
    assert cal["model_time_s"] == pytest.approx(49 * 3600 + 55 * 60, rel=1e-12)
    assert pred["gpus"] == 1536 and pred["paper_time_s"] == 853
    assert pred["error_pct"] == pytest.approx(100 * (pred["train_time_s"] - 853) / 853)
    assert f"error {pred['error_pct']:+.1f} %" in capsys.readouterr().out
    md = (tmp_path / "scale.md").read_text()
    assert "### What-ifs" in md and "I3D-R50 32f" in md
    # a flag reaches the model: a slower network predicts a longer run
    assert cli.main(["scale", "--out-dir", str(tmp_path / "slow"), "--no-plot",
                     "--inter-bandwidth", "1"]) == 0
    slow = json.loads((tmp_path / "slow" / "scale.json").read_text())["meta"]["prediction"]
    assert slow["train_time_s"] > pred["train_time_s"]


def test_dispatch_errors(capsys):
    assert cli.main(["nope"]) == 2
    assert "unknown bench 'nope'" in capsys.readouterr().err
    assert cli.main([]) == 0 and "tsm-ds bench <bench>" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli.main(["scale", "--overlap", "2"])


def test_bench_argv_asks_the_bench_parser():
    assert cli.bench_argv("scale", "R", quick=True) == ["--out-dir", "R", "--quick"]
    assert cli.bench_argv("scale", "R", quick=False, extra=["--gpus", "12"]) == [
        "--out-dir", "R", "--gpus", "12"]


def test_all_runs_scale_and_writes_summary_and_plots(tmp_path):
    """'all' restricted to the scaling model (seconds): subprocess, summary, scaling.png."""
    rc = cli.main(["all", "--only", "scale", "--quick", "--out-dir", str(tmp_path)])
    assert rc == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [r["bench"] for r in summary["rows"]] == ["scale"]
    assert summary["rows"][0]["status"] == "ok"
    md = (tmp_path / "summary.md").read_text()
    assert "error" in md and "## Key numbers" in md and "![scale](scaling.png)" in md
    assert "models: no models.json" in md
    assert (tmp_path / "scaling.png").read_bytes()[:8] == PNG_MAGIC
    assert "=== bench scale: ok" in (tmp_path / "bench_all.log").read_text()


def test_plots_survive_missing_and_broken_json(tmp_path):
    res = plots.make_plots(tmp_path)
    assert res == {"models": "no models.json", "data": "no data.json", "comm": "no comm.json",
                   "scale": "no scale.json"}
    (tmp_path / "models.json").write_text("{broken")
    (tmp_path / "comm.json").write_text(json.dumps({"rows": [{"method": "fp32", "note": "x"}]}))
    res = plots.make_plots(tmp_path)
    assert res["models"] == "models.json: no plottable rows"
    assert res["comm"] == "comm.json: no plottable rows"
    assert plots.plot_scaling(tmp_path / "missing.json", tmp_path / "x.png") is None


def test_plots_from_bench_rows(tmp_path):
    report.write_report("models", [
        {"model": "tsm_resnet50", "frames": 8, "train_clips_per_s": 1.2, "infer_clips_per_s": 4.0,
         "train_clips_per_s_iqr": 0.1},
        {"model": "i3d_resnet50", "frames": 32, "train_clips_per_s": 0.3, "infer_clips_per_s": 1.0}],
        tmp_path)
    report.write_report("data", [
        {"input": "real clips (17)", "loader": "tsm_ds", "clips_per_s": 25.0},
        {"input": "real clips (17)", "loader": "decode_all", "clips_per_s": 17.0},
        {"input": "1-min 360p, keyframe every 250", "loader": "tsm_ds", "clips_per_s": 3.0},
        {"input": "1-min 360p, keyframe every 250", "loader": "decord", "clips_per_s": None,
         "error": "ModuleNotFoundError"}], tmp_path)
    report.write_report("comm", [{"method": "fp32", "bytes_per_step": 9.7e7},
                                 {"method": "onebit", "bytes_per_step": 3.1e6}], tmp_path)
    res = plots.make_plots(tmp_path)
    for name in ("models", "comm", "data"):
        assert isinstance(res[name], Path) and res[name].read_bytes()[:8] == PNG_MAGIC
    assert plots.numeric_columns(json.loads((tmp_path / "models.json").read_text())["rows"],
                                 contains=("clips_per_s",), exclude=("iqr",)) == [
        "train_clips_per_s", "infer_clips_per_s"]
    assert plots.row_label({"model": "i3d_resnet50", "frames": 32}) == "i3d_resnet50 32f"


def test_report_atomic_and_read(tmp_path):
    j, m = report.write_report("x", [{"a": 1.23456, "b": None}], tmp_path, meta={"k": "v"})
    assert report.read_report(j)["rows"] == [{"a": 1.23456, "b": None}]
    assert "| 1.235 |  |" in m.read_text()
    report.append_markdown(m, "extra\n")
    assert m.read_text().endswith("extra\n") and "| a | b |" in m.read_text()
    report.append_markdown(m, "only\n", replace=True)
    assert m.read_text() == "only\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.json", "x.md"]   # no temp files left
    (tmp_path / "bad.json").write_text('{"rows": 3}')
    assert report.read_report(tmp_path / "bad.json") is None
    assert report.read_report(tmp_path / "absent.json") is None


def test_summary_collects_headline_numbers(tmp_path):
    report.write_report("models", [
        {"model": "TSM-R50", "frames": 8, "train_clips_per_s": 0.5, "infer_clips_per_s": 2.0},
        {"model": "TSN-R50", "frames": 8, "train_clips_per_s": 0.625, "infer_clips_per_s": 2.5},
        {"model": "I3D-R50-32f", "frames": 32, "train_clips_per_s": 0.125, "infer_clips_per_s": 0.4}],
        tmp_path)
    report.write_report("comm", [{"method": "fp32", "bytes_sent_per_rank": 97.3e6, "time_ms": 400.0},
                                 {"method": "onebit", "bytes_sent_per_rank": 3.05e6, "time_ms": 200.0}],
                        tmp_path, meta={"world_size": 2})
    report.write_report("shift_op", [{"op": "inplace", "median_s": 0.01}], tmp_path)
    report.write_report("data", [
        {"input": "real clips (17)", "loader": "tsm_ds", "clips_per_s": 25.0},
        {"input": "real clips (17)", "loader": "decode_all", "clips_per_s": 12.5},
        {"input": "real clips (17)", "loader": "decord", "clips_per_s": None, "error": "absent"}], tmp_path)
    results = [{"bench": "models", "argv": "--out X", "rc": 0, "seconds": 1.0, "status": "ok"},
               {"bench": "comm", "argv": "", "rc": 1, "seconds": 2.0, "status": "failed (exit 1)"}]
    md = runner.write_summary(tmp_path, results, plots.make_plots(tmp_path), quick=True, started=0.0)
    text = md.read_text()
    assert "- TSM-R50 / TSN-R50 throughput (measured here): train 0.80x, infer 0.80x" in text
    assert "- TSM-R50 / I3D-R50-32f throughput (measured here): train 4.00x, infer 5.00x" in text
    assert "fp32 97.30 MB (400 ms), onebit 3.05 MB (200 ms)" in text
    assert "- loader on real clips (17) (measured here): tsm_ds 25 clips/s; others (tsm_ds / other): " \
        "decode_all 12.5 (2.00x)" in text
    assert "failed (exit 1)" in text and "<!-- shift_op.md -->" in text
    assert "![models](models_throughput.png)" in text and "![comm](comm_bytes.png)" in text


def test_scale_uses_bench_decode_rate_unless_it_makes_the_paper_node_data_bound(tmp_path):
    def run(clips_per_s):
        report.write_report("data", [{"input": "real clips (17)", "loader": "tsm_ds",
                                      "clips_per_s": clips_per_s}], tmp_path)
        assert cli.main(["scale", "--out-dir", str(tmp_path), "--no-plot"]) == 0
        return json.loads((tmp_path / "scale.json").read_text())["meta"]

    meta = run(5.0)                         # 40 sampled frames/s per core: used
    assert meta["workloads"]["tsm"]["decode_fps_per_core"] == 40.0
    assert "data.json: 40 sampled frames/s per core" in meta["assumptions"]["bench_notes"]
    meta = run(0.5)                         # 4 frames/s: 64 frames on 7 cores > 0.72 s per step
    assert meta["workloads"]["tsm"]["decode_fps_per_core"] == 200.0
    assert "not used" in meta["assumptions"]["bench_notes"]


def test_all_reports_a_bench_past_its_time_limit(tmp_path):
    rc = cli.main(["all", "--only", "scale", "--quick", "--out-dir", str(tmp_path),
                   "--time-limit-scale", "0.0001"])       # 60 s x 1e-4 = 6 ms
    assert rc == 1
    row = json.loads((tmp_path / "summary.json").read_text())["rows"][0]
    assert row["status"] == "timed out after 0 s" and row["rc"] == -1
    assert "timed out" in (tmp_path / "summary.md").read_text()
    assert not (tmp_path / "scale.json").exists()
