"""docs/contributing.md, "Adding an option": a training option touches two files. The guide's own
example (label smoothing) is applied to a copy of the package, and the copy's training command
parses the flag, records it in config.json's tree, reruns it from the record and its loss call
computes torch's label-smoothed cross-entropy, while ``tsm-ds config`` does not offer it."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[2]

CHECK = r'''
import json, sys
import torch
import torch.nn.functional as F
from tsm_ds.config import Config, parse, tree_with
from tsm_ds.config.commands import PLAN, TRAIN
from tsm_ds.config.record import tree_from_record, tree_to_record
cfg, _ = parse(TRAIN, Config, ["--label-smoothing", "0.1"])
rec = tree_to_record(cfg)
back, _ = tree_from_record({"schema_version": 2, "config": rec})
try:
    parse(PLAN, Config, ["--deepspeed_config", "cpu_fp32", "--world-size", "1", "--train-samples", "8",
                         "--label-smoothing", "0.1"])
    plan = "accepted"
except SystemExit:
    plan = "refused"
# the trainer's loss with it: one micro-step's loss equals torch's label-smoothed cross-entropy
from tsm_ds.engine.loop.trainer import Trainer, TrainSettings
t = Trainer.__new__(Trainer)
t.c = tree_with({"schedule.label_smoothing": 0.1})
src = open(sys.argv[1]).read()
logits, label = torch.tensor([[2.0, 0.0, -1.0]]), torch.tensor([0])
expr = re.search(r"F\.cross_entropy\(logits\.float\(\), label, [^\n]*?\)\)?", src).group(0).rstrip(")") + ")"
loss = eval(expr, {"F": F, "logits": logits, "label": label, "self": t})
print(json.dumps({"parsed": cfg.schedule.label_smoothing, "recorded": rec["schedule"]["label_smoothing"],
                  "rerun": back.schedule.label_smoothing, "plan": plan, "loss": float(loss),
                  "want": float(F.cross_entropy(logits, label, label_smoothing=0.1))}))
'''.replace("import json, sys", "import json, re, sys")


def _guide_example() -> tuple[str, str]:
    """(the field line, the loss call) of the guide's python block."""
    text = (REPO / "docs" / "contributing.md").read_text()
    block = re.search(r"```python\n(.*?)```", text[text.index("## Adding an option"):], re.S).group(1)
    lines = [ln for ln in block.splitlines() if ln.strip() and not ln.startswith("#")]
    assert len(lines) == 2, block
    return lines[0], lines[1]


def test_the_guides_option_touches_two_files(tmp_path):
    field_line, call = _guide_example()
    pkg = tmp_path / "tsm_ds"
    shutil.copytree(REPO / "tsm_ds", pkg, ignore=shutil.ignore_patterns("__pycache__"))
    tree = pkg / "config" / "tree.py"
    src = tree.read_text()
    cls = src.index("class ScheduleConfig")
    at = src.index("\n    def engine_flags", cls)
    tree.write_text(src[:at] + "\n    " + field_line + src[at:])
    trainer = pkg / "engine" / "loop" / "trainer.py"
    src = trainer.read_text()
    assert src.count("F.cross_entropy(logits.float(), label)") == 1
    trainer.write_text(src.replace("F.cross_entropy(logits.float(), label)", call))
    changed = [p.relative_to(tmp_path).as_posix() for p in sorted(pkg.rglob("*.py"))
               if p.read_bytes() != (REPO / p.relative_to(tmp_path)).read_bytes()]
    assert changed == ["tsm_ds/config/tree.py", "tsm_ds/engine/loop/trainer.py"]
    out = subprocess.run([sys.executable, "-c", CHECK, str(trainer)], cwd=tmp_path, capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path), "HOME": str(tmp_path)},
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["parsed"] == got["recorded"] == got["rerun"] == 0.1
    assert got["plan"] == "refused"
    plain = float(F.cross_entropy(torch.tensor([[2.0, 0.0, -1.0]]), torch.tensor([0])))
    assert abs(got["loss"] - got["want"]) < 1e-7 and got["want"] > plain + 0.05   # smoothing changed the loss
