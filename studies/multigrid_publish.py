"""Publish the multigrid study as it stands (finished or in progress) and put its numbers into the
guides: the report of the rows recorded so far into ``results/multigrid`` (``tsm-ds bench multigrid
--report-only --results-dir``: ``multigrid.json`` / ``.md`` and ``rows/``), then the block between the
``multigrid-report`` markers of docs/multigrid.md and the count of landed runs on README.md's multigrid
line, from that JSON (tests/experiments/test_multigrid_study.py keeps them equal).

    python studies/multigrid_publish.py [--out-dir bench_out/multigrid]
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LANDED = re.compile(r"(all \d+ runs landed|\d+ of \d+ runs landed)")


def sync(rep: dict) -> list[Path]:
    """Write the report's block into docs/multigrid.md and its count into README.md's multigrid line;
    returns the files changed."""
    from tsm_ds.experiments.multigrid_study.report import GUIDE_BEGIN, GUIDE_END, guide_block, landed_text

    changed = []
    guide = REPO / "docs" / "multigrid.md"
    text = guide.read_text()
    a, b = text.index(GUIDE_BEGIN), text.index(GUIDE_END) + len(GUIDE_END)
    new = text[:a] + guide_block(rep) + text[b:]
    readme = REPO / "README.md"
    lines = readme.read_text().splitlines(keepends=True)
    lines = [LANDED.sub(landed_text(rep), ln) if ln.startswith("| multigrid") else ln for ln in lines]
    for path, body in ((guide, new), (readme, "".join(lines))):
        if body != path.read_text():
            path.write_text(body)
            changed.append(path)
    return changed


def main(argv: list[str] | None = None) -> int:
    """Publish (``tsm-ds bench multigrid --report-only``), then sync the guides. Returns its exit status."""
    sys.path.insert(0, str(REPO))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", default="bench_out/multigrid")
    ap.add_argument("--results-dir", default="results/multigrid")
    a = ap.parse_args(argv)
    from tsm_ds.cli.bench_multigrid import main as bench
    from tsm_ds.experiments.multigrid_study.report import landed_text

    code = bench(["--report-only", "--out-dir", a.out_dir, "--results-dir", a.results_dir])
    rep = json.loads((Path(a.results_dir) / "multigrid.json").read_text())
    for p in sync(rep):
        print(f"updated {p.relative_to(REPO)}")
    print(landed_text(rep))
    return code


if __name__ == "__main__":
    sys.exit(main())
