"""The readers' caches are the dataset's options (tsm_ds.data.options), applied in the process that
reads: a DataLoader worker started with ``spawn`` (which inherits no module state) writes its frame
indexes to the dataset's --index-cache folder, as a forked one does; bad values name their flag."""
from __future__ import annotations

import pytest
import torch

from tsm_ds.config import tree_with
from tsm_ds.data.dataset import VideoClipDataset
from tsm_ds.data.options import ReaderOptions
from tsm_ds.data.records import VideoRecord


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_a_workers_index_cache_is_the_datasets_whatever_the_start_method(shared_data, tmp_path, start):
    from tsm_ds.data.video import clear_index_cache

    clear_index_cache()   # a forked worker inherits this process's in-memory indexes: start it cold
    videos = sorted((shared_data / "videos").rglob("*.mp4"))[:2]
    cache = tmp_path / "index_cache"
    ds = VideoClipDataset([VideoRecord(str(v), i) for i, v in enumerate(videos)], num_segments=2, img_size=32,
                          mode="val", reader_options=ReaderOptions(index_cache=str(cache)))
    loader = torch.utils.data.DataLoader(ds, batch_size=1, num_workers=1, multiprocessing_context=start)
    items = [b["index"].item() for b in loader]
    assert items == [0, 1]
    assert len(list(cache.glob("*.npz"))) == 2   # one index per video, written by the worker


def test_options_from_the_tree_and_bad_values_name_the_flag():
    opts = ReaderOptions.from_config(tree_with({"data.index_cache": "/x", "data.index_cache_size": 3,
                                                "data.malloc_trim": False, "data.shard_cache_mb": 5.0}).data)
    assert opts == ReaderOptions(index_cache="/x", index_cache_size=3, malloc_trim=False, shard_cache_mb=5.0)
    with pytest.raises(ValueError, match="--shard-cache-mb 0"):
        ReaderOptions(shard_cache_mb=0)
    with pytest.raises(ValueError, match="--index-cache-size 0"):
        ReaderOptions(index_cache_size=0)
