"""Fixtures shared by the data tests."""
from __future__ import annotations

import pytest

from tsm_ds.data.testvideo import write_numbered_video


@pytest.fixture()
def tree(tmp_path):
    """A class-folder tree ``src/{a,b}``: a/one.mp4 (20 numbered H.264 frames, B-frames), b/two.avi
    (13 MPEG-4 frames) and b/broken.mp4 (not a video)."""
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    (src / "b").mkdir()
    write_numbered_video(src / "a" / "one.mp4", 20, gop=20, bframes=2)
    write_numbered_video(src / "b" / "two.avi", 13, codec="mpeg4", gop=13, bframes=0)
    (src / "b" / "broken.mp4").write_bytes(b"\x00\x01" * 500)
    return src
