"""Start a test file's own rank code (its ``if __name__ == "__main__"`` block reading ``--spec``) as
the trainer's users start theirs: ``world`` ranks under the deepspeed launcher, or one plain
``python`` process (a world of one). Shared by tests/engine/test_reshard.py and
tests/engine/test_multigrid_run.py (their resume-on-another-world-size runs)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tsm_ds.utils.node import free_port

REPO = Path(__file__).resolve().parents[2]


def launch_worker(worker: str | Path, world: int | None, spec: dict, log: Path, timeout: float = 300) -> str:
    """Run ``worker --spec JSON`` on ``world`` ranks (``deepspeed --num_gpus world``; None: plain
    ``python``, one process), one thread each, DeepSpeed's CPU accelerator. Writes the output to
    ``log`` and returns it; asserts exit status 0 (the output's tail in the message). DeepSpeed's
    CPU all-reduce buffers of the run's port (69 MB per rank in /dev/shm) are removed if a rank left
    them."""
    bindir = Path(sys.executable).parent
    port = free_port()
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", PYTHONPATH=str(REPO),
               PATH=f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    cmd = ([str(bindir / "deepspeed"), "--num_gpus", str(world), "--master_port", str(port)] if world
           else [sys.executable]) + [str(worker), "--spec", json.dumps(spec)]
    try:
        p = subprocess.run(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=timeout)
    finally:
        for f in Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_{os.getuid()}_*_{port}_*"):
            f.unlink(missing_ok=True)
    log.write_text(p.stdout)
    assert p.returncode == 0, p.stdout[-5000:]
    return p.stdout
