"""Unreadable videos: the real reason (a symbolic link loop is ELOOP, not "file not found"), one
warning per file over DataLoader workers, items that name their replaced files, and the tracker
that counts distinct files (across ranks: tests/engine/test_channels_last_compile.py, through the
trainer)."""
from __future__ import annotations

import os
import warnings

import pytest
import torch

from tsm_ds.data.bad_videos import BadVideoTracker, parse_bad_files
from tsm_ds.data.dataset import VideoClipDataset
from tsm_ds.data.records import VideoRecord
from tsm_ds.data.testvideo import write_numbered_video
from tsm_ds.data.video import VideoOpenError, count_frames, decode_frames


@pytest.fixture()
def links(tmp_path):
    loop_a, loop_b, broken = tmp_path / "loop_a.mp4", tmp_path / "loop_b.mp4", tmp_path / "broken.mp4"
    os.symlink(loop_b, loop_a)
    os.symlink(loop_a, loop_b)
    os.symlink(tmp_path / "gone.mp4", broken)
    return loop_a, broken


def test_symlink_loop_and_broken_link_name_their_real_reason(links, tmp_path):
    loop, broken = links
    for call in (lambda p: count_frames(p), lambda p: decode_frames(p, [0])):
        with pytest.raises(VideoOpenError, match=r"symbolic link loop \(ELOOP") as e:
            call(loop)
        assert "not found" not in e.value.reason
        with pytest.raises(VideoOpenError, match=r"broken symbolic link \(ENOENT: its target .*gone.mp4"):
            call(broken)
    with pytest.raises(VideoOpenError, match=r"file not found \(ENOENT"):
        count_frames(tmp_path / "missing.mp4")


def test_item_names_each_replaced_file_with_its_reason(links, tmp_path):
    loop, _ = links
    good = tmp_path / "good.mp4"
    write_numbered_video(good, 8)
    ds = VideoClipDataset([VideoRecord(str(loop), 0), VideoRecord(str(good), 1)], num_segments=2, mode="val",
                          img_size=32)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        item = ds[0]
        ds[0]
    files = parse_bad_files(item["bad_files"])
    assert item["bad"] == len(files) >= 1 and item["label"] == 1
    assert "ELOOP" in files[str(loop)]
    assert sum(str(loop) in str(x.message) and "ELOOP" in str(x.message) for x in w) == 1
    assert ds[1]["bad_files"] == "" and ds[1]["bad"] == 0
    batch = torch.utils.data.default_collate([ds[0], ds[1]])   # strings survive the default collate
    assert list(parse_bad_files(batch["bad_files"])) == [str(loop)]


def _log_warnings_to(path):
    """worker_init_fn: every warning of the worker appended to ``path`` (pytest records, not prints, them)."""
    def init(_worker_id):
        warnings.simplefilter("always")
        warnings.showwarning = lambda msg, *a, **k: open(path, "a").write(f"{msg}\n")
    return init


def test_one_warning_per_file_over_workers_and_epochs(tmp_path):
    good = tmp_path / "good.mp4"
    write_numbered_video(good, 8)
    missing = str(tmp_path / "missing.mp4")
    records = [VideoRecord(missing, 0)] + [VideoRecord(str(good), 1)] * 5
    ds = VideoClipDataset(records, num_segments=2, mode="train", img_size=32)
    log = tmp_path / "warnings.txt"
    loader = torch.utils.data.DataLoader(ds, batch_size=1, num_workers=2, timeout=120,
                                         worker_init_fn=_log_warnings_to(log))
    bad = 0
    for epoch in range(2):                       # new workers every epoch (not persistent)
        ds.set_epoch(epoch)
        bad += sum(int(b["bad"].sum()) for b in loader)
    text = log.read_text()
    assert bad >= 2                              # item 0 in both epochs (and any replacement draws)
    # a worker of each epoch met the file (before: one warning per worker process, 2 or more)
    assert text.count(f"unreadable video, replaced by another sample: {missing}") == 1, text
    ds.warn_bad_files = False                    # the trainer's setting: its tracker warns instead
    ds._bad_warned.zero_()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert ds[0]["bad"] >= 1
    assert not [x for x in w if "unreadable" in str(x.message)]


def test_tracker_counts_distinct_files_and_encounters_once(caplog):
    ds = VideoClipDataset([VideoRecord("/nowhere.mp4", 0)], num_segments=2)
    t = BadVideoTracker(ds, rank=0, world_size=1)
    assert ds.warn_bad_files is False
    b1 = {"bad": torch.tensor([1, 2]), "bad_files": ['[["/a.mp4", "no video stream"]]',
                                                      '[["/b.mp4", "x"], ["/a.mp4", "no video stream"]]']}
    assert t.add(b1) == 3 and t.num_pending() == 2
    with caplog.at_level("WARNING", logger="tsm_ds.data"):
        assert t.sync(t.num_pending(), 3) == (2, 3)
        assert t.add({"bad": torch.tensor([1]), "bad_files": ['[["/a.mp4", "no video stream"]]', ""]}) == 1
        assert t.num_pending() == 0 and t.sync(0, 1) == (2, 4)   # nothing new: no exchange, no warning
    assert [r.getMessage().count("/a.mp4") for r in caplog.records] == [1, 0]
    assert "/b.mp4: x" in caplog.records[1].getMessage()
    u = BadVideoTracker(rank=0, world_size=1)
    u.load_state_dict(t.state_dict())
    assert u.files == t.files and u.encounters == 4
    u.add({"bad": torch.tensor([1]), "bad_files": ['[["/b.mp4", "x"]]']})
    assert u.num_pending() == 0                  # known from the checkpoint: not warned again
    u.load_state_dict(7)                         # a checkpoint from before files were tracked
    assert u.files == {} and u.encounters == 7
    assert parse_bad_files(None) == {} and parse_bad_files("") == {}
