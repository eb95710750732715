"""``launch/slurm_prepare.sbatch`` on the loopback cluster (launch/cluster/harness.py): an array job
of 2 tasks on node-a and node-b (each with a private /tmp, 1 CPU) packs the real clips in 2 parts
into an OUT under the harness's shared dir, a dependent job merges them; the lists, labels, report
and packs equal a one-node ``tsm-ds prepare`` byte for byte. Then part 1 is "killed midway" (its
report and one of its packs removed, a temporary file left) and resubmitted alone with
``--array=1 --parts 2``: only the removed pack is prepared again (counted in its report)."""
from __future__ import annotations

import json
import os
import time

from clusterlib import REPO, run

from tsm_ds.cli import prepare as prepare_cli

FINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")


def _states(cluster, job: str) -> list[dict]:
    out = run(["scontrol", "show", "job", "-o", job], cluster, timeout=30).stdout
    return [dict(kv.split("=", 1) for kv in line.split() if "=" in kv) for line in out.splitlines() if line.strip()]


def _wait(cluster, job: str, timeout: float = 150) -> list[dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        tasks = _states(cluster, job)
        if tasks and all(t.get("JobState") in FINAL for t in tasks):
            return tasks
        time.sleep(0.5)
    run(["scancel", job], cluster, timeout=30)
    raise AssertionError(f"job {job} not finished in {timeout} s: {_states(cluster, job)}")


def _sbatch(cluster, *args) -> str:
    sub = run(["sbatch", "--parsable", "--cpus-per-task", "1", "--output", str(cluster.shared / "prepare-%A_%a.out"),
               *args], cluster, timeout=60, cwd=REPO)
    assert sub.returncode == 0, sub.stdout
    return sub.stdout.strip().split(";")[0]


def _files(root) -> dict[str, bytes]:
    out = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            p = os.path.join(dirpath, f)
            rel = os.path.relpath(p, root)
            if not rel.startswith("parts" + os.sep):
                out[rel] = open(p, "rb").read()
    return out


def _logs(cluster) -> str:
    return "\n".join(f"== {p.name}\n{p.read_text()[-2000:]}" for p in sorted(cluster.shared.glob("prepare-*.out")))


def test_sbatch_array_prepares_in_two_parts_and_merges_like_one_node(cluster, shared_data, keep_logs, tmp_path):
    src = shared_data / "videos"
    out = cluster.shared / "prepared"
    t0 = time.monotonic()
    array = _sbatch(cluster, "--array=0-1", "launch/slurm_prepare.sbatch", str(src), str(out))
    merge = _sbatch(cluster, f"--dependency=afterany:{array}", "launch/slurm_prepare.sbatch", str(src), str(out),
                    "--merge")
    # meanwhile the one-node prepare here (the same code, 1 worker)
    one = tmp_path / "one"
    assert prepare_cli.main([str(src), str(one), "--workers", "1"]) == 0
    tasks = _wait(cluster, array)
    assert sorted(t.get("ArrayTaskId") for t in tasks) == ["0", "1"], tasks
    assert all(t["JobState"] == "COMPLETED" and t["ExitCode"] == "0:0" for t in tasks), (tasks, _logs(cluster))
    assert {t["NodeList"] for t in tasks} == {"node-a", "node-b"}, tasks   # 1 CPU each: one task per node
    (m,) = _wait(cluster, merge)
    assert m["JobState"] == "COMPLETED" and m["ExitCode"] == "0:0", (m, _logs(cluster))
    print(f"array of 2 parts + merge: {time.monotonic() - t0:.1f} s")
    reports = [json.loads((out / "parts" / f"part-000{i}-of-0002.json").read_text()) for i in range(2)]
    assert [r["counts"]["videos"] for r in reports] == [9, 8]
    assert {r["host"] for r in reports} == {"node-a", "node-b"}
    assert all(r["counts"]["done"] == r["counts"]["videos"] for r in reports)
    # lists, labels, report and every pack: byte for byte the one-node prepare's
    got, want = _files(out), _files(one)
    assert sorted(got) == sorted(want)
    assert len([k for k in want if k.endswith(".jpack")]) == 17
    for k in want:
        assert got[k] == want[k], k

    # part 1 killed midway: no report, one pack not written, the writer's temporary file left
    (out / "parts" / "part-0001-of-0002.json").unlink()
    lost = out / reports[1]["files"][0]["out"]
    lost.unlink()
    (lost.parent / f".{lost.name}.k1ll3d_x.jpack").write_bytes(b"half")
    again = _sbatch(cluster, "--array=1", "launch/slurm_prepare.sbatch", str(src), str(out), "--parts", "2")
    (task,) = _wait(cluster, again)
    assert task["JobState"] == "COMPLETED", (task, _logs(cluster))
    rerun = json.loads((out / "parts" / "part-0001-of-0002.json").read_text())
    assert rerun["counts"] == {"videos": 8, "done": 1, "skipped": 7, "failed": 0, "temporaries_removed": 1}
    assert lost.read_bytes() == want[str(lost.relative_to(out))]
    print(f"with the rerun of part 1: {time.monotonic() - t0:.1f} s")
