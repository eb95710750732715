"""tsm_ds.utils.io: the one atomic writer, markdown tables, reports."""
from __future__ import annotations

import errno
import json
import os
import stat

import pytest

from tsm_ds.utils import io


def _leftovers(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_atomic_write_replaces_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "sub" / "a.txt"              # the parent folder is created
    io.atomic_write_text(target, "one")
    io.atomic_write_text(target, "two")
    assert target.read_text() == "two"
    assert _leftovers(target.parent) == []
    mode = stat.S_IMODE(target.stat().st_mode)
    umask = os.umask(0)
    os.umask(umask)
    assert mode == 0o666 & ~umask                     # not mkstemp's 0600


def test_a_failed_write_keeps_the_previous_file(tmp_path):
    target = tmp_path / "ckpt.pt"
    io.atomic_write_bytes(target, b"good checkpoint")
    with pytest.raises(OSError, match="No space left"):
        with io.atomic_path(target) as tmp:
            tmp.write_bytes(b"half")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert target.read_bytes() == b"good checkpoint"
    assert _leftovers(tmp_path) == []


def test_atomic_path_keeps_the_suffix_and_replaces_folders(tmp_path):
    with io.atomic_path(tmp_path / "model.pt2", suffix=".pt2") as tmp:
        assert tmp.suffix == ".pt2" and tmp.parent == tmp_path
        tmp.write_bytes(b"x")
    assert (tmp_path / "model.pt2").read_bytes() == b"x"
    with io.atomic_path(tmp_path / "frames", directory=True) as d:
        assert d.is_dir() and list(d.iterdir()) == []
        (d / "img_00001.jpg").write_bytes(b"jpg")
    assert [p.name for p in (tmp_path / "frames").iterdir()] == ["img_00001.jpg"]
    with pytest.raises(RuntimeError):
        with io.atomic_path(tmp_path / "frames2", directory=True) as d:
            (d / "img_00001.jpg").write_bytes(b"jpg")
            raise RuntimeError("decoder died")
    assert not (tmp_path / "frames2").exists() and _leftovers(tmp_path) == []


def test_atomic_torch_save_round_trip(tmp_path):
    import torch

    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    io.atomic_torch_save({"w": t}, tmp_path / "m.pt")
    assert torch.equal(torch.load(tmp_path / "m.pt", weights_only=True)["w"], t)


def test_markdown_table_and_report_round_trip(tmp_path):
    rows = [{"model": "TSM", "clips_per_s": 12.3456, "note": None}, {"model": "TSN", "clips_per_s": 12.0}]
    assert io.markdown_table(rows) == ("| model | clips_per_s | note |\n|---|---|---|\n"
                                       "| TSM | 12.35 |  |\n| TSN | 12 |  |\n")
    assert io.markdown_table([]) == "(no rows)\n"
    j, md = io.write_report("bench", rows, tmp_path, meta={"reps": 3}, title="Bench")
    payload = io.read_report(j)
    assert payload["rows"] == rows and payload["meta"] == {"reps": 3} and "cpu_count" in payload["machine"]
    assert md.read_text().startswith("## Bench\n\n| model |") and "- reps: 3" in md.read_text()
    io.append_markdown(md, "more")
    assert md.read_text().endswith("\nmore")
    (tmp_path / "bad.json").write_text(json.dumps({"rows": "no list"}))
    assert io.read_report(tmp_path / "bad.json") is None and io.read_report(tmp_path / "missing.json") is None
