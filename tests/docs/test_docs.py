"""The guides' commands run as written: every ```bash block of docs/*.md announced by a
``<!-- run: NAME -->`` line is run here by NAME, with the variables the guide says it needs set to
small values."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
_BLOCK = re.compile(r"<!-- run: ([\w-]+) -->\n```bash\n(.*?)\n```", re.S)


def runnable_blocks() -> dict[str, tuple[Path, str]]:
    """NAME -> (guide, the bash block's text) of every announced block of docs/*.md."""
    out: dict[str, tuple[Path, str]] = {}
    for md in sorted(DOCS.glob("*.md")):
        for name, body in _BLOCK.findall(md.read_text(encoding="utf-8")):
            assert name not in out, f"{md.name}: block name {name!r} also in {out[name][0].name}"
            out[name] = (md, body)
    return out


#: the blocks a test below runs; a new announced block must be added here (and get a test)
RUN_BY_TESTS = {"shards-s3"}


def test_every_announced_block_has_a_test():
    assert set(runnable_blocks()) == RUN_BY_TESTS


def _run(name: str, env: dict, tmp_path: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    _, body = runnable_blocks()[name]
    script = tmp_path / f"{name}.sh"
    script.write_text("set -euo pipefail\n" + body + "\n")
    full = {**os.environ, **env, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(["bash", str(script)], cwd=REPO, env=full, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_shards_on_s3_guide(shared_data, tmp_path, moto_s3):
    """docs/shards.md: prepare, a new bucket, the upload, a 2-rank run from s3:// (moto on 127.0.0.1,
    its AWS_* variables set by the fixture) that loses nothing."""
    pytest.importorskip("litdata")
    videos = tmp_path / "videos"   # 3 classes x 2 real clips: a small copy of the guide's input
    for cls in ("tai_chi", "walking", "waving"):
        (videos / cls).mkdir(parents=True)
        for src in sorted((shared_data / "videos" / cls).iterdir())[:2]:
            (videos / cls / src.name).symlink_to(src)
    flags = ("--deepspeed_config ds_configs/cpu_fp32.json --arch resnet18 --num-segments 2 --img-size 32 "
             "--batch-size 2 --micro-batch-size 1 --num-workers 1 --no-progress --epochs 1 --max-steps 2 --seed 1 "
             f"--val-fraction 0.5 --output-dir {tmp_path / 'runs'} --run-name s3guide")
    p = _run("shards-s3", {"VIDEOS": str(videos), "PREPARED": str(tmp_path / "prepared"), "BUCKET": "tsm-guide",
                           "CACHE": str(tmp_path / "cache"), "GPUS": "2", "TRAIN_FLAGS": flags}, tmp_path)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    uploaded = {ln.split()[1] for ln in p.stdout.splitlines() if ln.startswith("uploaded ")}
    assert uploaded == {f.name for f in (tmp_path / "prepared" / "shards").iterdir()}
    assert {"index.json", "samples.json"} < uploaded
    res = json.loads((tmp_path / "runs" / "s3guide" / "result.json").read_text())
    assert res["status"] == "completed" and res["steps"] == 2 and res["val_clips"] == 3
    assert {k: v["count"] for k, v in res["data_lost"].items()} == {"train": 0, "val": 0}
    assert list((tmp_path / "cache").rglob("chunk-*.bin"))   # fetched into the guide's cache
