"""tsm_ds.cli.process_exit.exit_process: the status, atexit handlers and buffered output all
survive the frozen exit, and every entry point ends through it."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

_CHILD = r"""
import atexit, gc, sys
out = open(sys.argv[1], "w")                      # left open: closed by its destructor at exit
out.write("buffered line\n")
atexit.register(lambda: open(sys.argv[1] + ".atexit", "w").write(str(gc.get_freeze_count() > 0)))
print("stdout line", end="")                     # no newline, no flush
from tsm_ds.cli.process_exit import exit_process
exit_process(3)
"""


def test_status_atexit_and_buffered_output_survive(tmp_path):
    f = tmp_path / "out.txt"
    p = subprocess.run([sys.executable, "-c", _CHILD, str(f)], capture_output=True, text=True, cwd=REPO,
                       timeout=60)
    assert p.returncode == 3, p.stderr
    assert p.stdout == "stdout line"
    assert f.read_text() == "buffered line\n"
    assert Path(str(f) + ".atexit").read_text() == "True"   # the handler ran, after the freeze


_GROUP_CHILD = r"""
import atexit, os, sys
import torch.distributed as dist
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2])
dist.init_process_group("gloo", rank=0, world_size=1)
dist.all_reduce(__import__("torch").ones(2))
atexit.register(lambda: open(sys.argv[1], "w").write(f"{dist.is_initialized()}"))
from tsm_ds.cli.process_exit import exit_process
exit_process(0)
"""


def test_exit_leaves_the_process_group(tmp_path):
    """A process that made a group leaves it before it exits (seen by an atexit handler, which
    runs after the exit's own steps); a process without torch gets no torch import from it."""
    from tsm_ds.engine.comm.dist import free_port

    f = tmp_path / "initialized.txt"
    p = subprocess.run([sys.executable, "-c", _GROUP_CHILD, str(f), str(free_port())], capture_output=True,
                       text=True, cwd=REPO, timeout=120)
    assert p.returncode == 0, p.stderr
    assert f.read_text() == "False"
    q = subprocess.run([sys.executable, "-c", "import sys; from tsm_ds.cli.process_exit import leave_process_group; "
                        "print(leave_process_group(), 'torch' in sys.modules)"], capture_output=True, text=True,
                       cwd=REPO, timeout=60)
    assert q.returncode == 0 and q.stdout.split() == ["False", "False"], q.stderr


def test_every_entry_point_ends_through_exit_process():
    """Every ``if __name__ == "__main__"`` block of the package and the console script."""
    import re

    mains = []
    for path in sorted((REPO / "tsm_ds").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, ast.If) and ast.unparse(node.test) == "__name__ == '__main__'":
                mains.append((path.relative_to(REPO).as_posix(), ast.unparse(node)))
    assert len(mains) >= 20
    bare = [p for p, src in mains if "exit_process(" not in src and "run()" not in src]
    assert bare == [], f"entry points that end with a plain sys.exit: {bare}"
    setup = (REPO / "setup.py").read_text()
    assert re.search(r'"tsm-ds=tsm_ds\.cli:run"', setup)
    assert "run()" in (REPO / "tsm_ds" / "cli" / "__main__.py").read_text()
