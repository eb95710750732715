"""The readers' per-process settings, carried by the dataset: :class:`ReaderOptions`.

Frame indexes (:mod:`tsm_ds.data.video.index`), shard readers (:mod:`tsm_ds.data.shards`) and the
heap trim (:mod:`tsm_ds.data.memory`) keep caches per process: the process that reads an item owns
them, a DataLoader worker as much as the main process. Their settings (``--index-cache``,
``--index-cache-size``, ``--shard-cache``, ``--shard-cache-mb``, ``--no-malloc-trim``) are
therefore an argument of the dataset (:class:`~tsm_ds.data.dataset.VideoClipDataset`'s
``reader_options``), which applies them in whichever process reads an item (:meth:`ReaderOptions.apply`,
once per process and options): no command flips a module global before the workers fork, and a
worker started with the ``spawn`` or ``forkserver`` method, which inherits no global, reads with
the same settings as a forked one.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["ReaderOptions"]

#: default bound of the local cache of remote shards (MiB; :data:`tsm_ds.data.shards.DEFAULT_CACHE_MB`)
DEFAULT_SHARD_CACHE_MB = 20480.0
#: the options applied in this process last (:meth:`ReaderOptions.apply`), with its PID
_applied: dict[int, "ReaderOptions"] = {}


@dataclass(frozen=True)
class ReaderOptions:
    """What a dataset's readers use in every process that reads it.

    Attributes:
        index_cache: also keep per-file frame indexes on disk in this folder (``--index-cache``);
            None: in memory only.
        index_cache_size: frame indexes kept in memory per process (``--index-cache-size``, >= 1).
        malloc_trim: hand freed heap back to the OS after every item (``--no-malloc-trim`` turns it off;
            :func:`tsm_ds.data.memory.release_freed_heap`).
        shard_cache: local cache folder of remote shards (``--shard-cache``; None: a folder under the
            system's temporary folder named after the URL).
        shard_cache_mb: size bound of that cache in MiB (``--shard-cache-mb``, > 0).

    Raises:
        ValueError: ``index_cache_size`` < 1 or ``shard_cache_mb`` <= 0 (the message names the flag).
    """

    index_cache: str | None = None
    index_cache_size: int = 8192
    malloc_trim: bool = True
    shard_cache: str | None = None
    shard_cache_mb: float = DEFAULT_SHARD_CACHE_MB

    def __post_init__(self):
        if int(self.index_cache_size) < 1:
            raise ValueError(f"--index-cache-size {self.index_cache_size}: keep at least 1 frame index in memory")
        if not float(self.shard_cache_mb) > 0:
            raise ValueError(f"--shard-cache-mb {self.shard_cache_mb}: give the cache bound in MiB, > 0")

    @classmethod
    def from_config(cls, d) -> "ReaderOptions":
        """The options of the tree's ``data`` section (:class:`tsm_ds.config.tree.DataConfig`).
        Raises ValueError as the class."""
        return cls(index_cache=d.index_cache, index_cache_size=d.index_cache_size, malloc_trim=d.malloc_trim,
                   shard_cache=d.shard_cache, shard_cache_mb=d.shard_cache_mb)

    def apply(self) -> None:
        """Configure this process's frame-index cache and shard readers with these options, unless this
        process already reads with them (a PID and an equality check: cheap per item)."""
        pid = os.getpid()
        if _applied.get(pid) == self:
            return
        from tsm_ds.data.shards import set_shard_cache
        from tsm_ds.data.video.index import set_index_cache_dir, set_index_cache_size

        set_index_cache_dir(self.index_cache)
        set_index_cache_size(self.index_cache_size)
        set_shard_cache(self.shard_cache, self.shard_cache_mb)
        _applied.clear()
        _applied[pid] = self
