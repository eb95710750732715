"""Packed videos in shards (issue 30): written and read by litdata, sampled by our own sampler.

Why shards: one file per clip is one open per clip on a shared filesystem; shards are a few large
files read sequentially or fetched whole from an object store (S3-compatible), with a local cache
of bounded size.

Which library does what (the README's "Shards" section has the evidence):

- storage: litdata 0.2.76 (``BinaryWriter`` writes the chunks and their ``index.json``,
  ``StreamingDataset[i]`` reads sample ``i`` by its global index, locally or from ``s3://`` through
  a cache folder bounded by ``max_cache_size``);
- sampling: ours. litdata's own iteration forces ``drop_last`` in a distributed run and shuffles
  chunks, not samples, so it cannot keep the per-file loader's rules. Every loader here keeps its
  sampler (:class:`tsm_ds.engine.settings.ResumableDistributedSampler` in training, the
  ``DistributedSampler`` of evaluation); the dataset only asks a shard reader for sample ``i``'s
  bytes instead of opening a ``.jpack`` file. The items are therefore those of the per-file packs
  for the same (seed, epoch, index) (tested), and resume, padding and evaluation are unchanged.

A shard folder (local, or ``s3://bucket/prefix``; ``AWS_ENDPOINT_URL`` names an S3-compatible
server) holds litdata's ``chunk-*.bin`` + ``index.json`` and our ``samples.json``::

    {"format": "tsm_ds.shards", "version": 1, "classes": [names],
     "samples": [[key, label], ...]}          # key: the pack's path relative to the prepare output

Sample ``i`` of the chunks is ``{"key": str, "label": int, "jpack": bytes}`` (the whole ``.jpack``
file). A record of a shard sample has the path ``<shard folder>!/<key>``
(:data:`SHARD_SEP`): bad-sample messages name it like a bad video.

Shard contents are data: only litdata's ``str`` / ``int`` / ``bytes`` serializers are accepted
(``index.json`` is checked before litdata reads it), so nothing in a shard is unpickled or run.
"""
from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from tsm_ds.utils.io import atomic_write_text

__all__ = ["SHARD_SEP", "SAMPLES_FILE", "INDEX_FILE", "DEFAULT_CACHE_MB", "is_shard_path", "is_shard_source",
           "split_shard_path", "write_shards", "read_samples", "shard_records", "set_shard_cache",
           "shard_cache", "ShardReader", "get_reader", "open_packed"]

#: separates the shard folder from the sample key in a record path: ``<folder>!/<key>``
SHARD_SEP = "!/"
#: our sample list beside litdata's files
SAMPLES_FILE = "samples.json"
#: litdata's chunk index
INDEX_FILE = "index.json"
#: default bound of the local cache of remote shards (MiB)
DEFAULT_CACHE_MB = 20480.0
#: the only item layout accepted (litdata's serializers of key, label, jpack): nothing is unpickled
_FORMATS = ["str", "int", "bytes"]

_cache = {"dir": None, "mb": DEFAULT_CACHE_MB}   # set by the commands from --shard-cache / --shard-cache-mb


def set_shard_cache(cache_dir: str | None, max_mb: float | None) -> None:
    """Where remote shards are cached and how large the cache may grow (``--shard-cache``,
    ``--shard-cache-mb``), for this process and the DataLoader workers it forks afterwards.

    Args:
        cache_dir: a folder (None: ``$TMPDIR/tsm_ds_shards/<hash of the source>``).
        max_mb: MiB; None keeps the current bound (default :data:`DEFAULT_CACHE_MB`).

    Raises:
        ValueError: ``max_mb`` <= 0 (names ``--shard-cache-mb``).
    """
    if max_mb is not None:
        if not float(max_mb) > 0:
            raise ValueError(f"--shard-cache-mb {max_mb}: give the cache bound in MiB, > 0")
        _cache["mb"] = float(max_mb)
    _cache["dir"] = str(cache_dir) if cache_dir else None
    _READERS.clear()


def shard_cache() -> dict:
    """``{"dir": str | None, "mb": float}``: the cache settings in force (see :func:`set_shard_cache`)."""
    return dict(_cache)


def is_shard_path(path: str | os.PathLike) -> bool:
    """True when ``path`` names a sample inside shards (``<folder>!/<key>``)."""
    return SHARD_SEP in str(path)


def _is_remote(root: str) -> bool:
    return str(root).startswith("s3://")


def is_shard_source(data: str | os.PathLike | None) -> bool:
    """True when ``--data`` names shards: an ``s3://`` URL, or a folder holding :data:`SAMPLES_FILE`
    and litdata's :data:`INDEX_FILE`."""
    if data is None:
        return False
    d = str(data)
    if _is_remote(d):
        return True
    return os.path.isfile(os.path.join(d, SAMPLES_FILE)) and os.path.isfile(os.path.join(d, INDEX_FILE))


def split_shard_path(path: str) -> tuple[str, str]:
    """``"<folder>!/<key>"`` -> ``(folder, key)``. Raises ValueError for a path without :data:`SHARD_SEP`."""
    root, sep, key = str(path).partition(SHARD_SEP)
    if not sep:
        raise ValueError(f"{path}: not a shard sample path (<shard folder>{SHARD_SEP}<key>)")
    return root, key


def write_shards(pack_root: str | os.PathLike, rows: list[tuple[str, int]], out_dir: str | os.PathLike, *,
                 shard_mb: float, classes: list[str] | None = None) -> dict:
    """Write the packs ``rows`` into litdata chunks of about ``shard_mb`` MB under ``out_dir``.

    Args:
        pack_root: the folder the rows' paths are relative to (``tsm-ds prepare``'s output).
        rows: ``(relative .jpack path, label)`` in sample order (sample i = row i).
        out_dir: the shard folder (created; must not hold shards already).
        shard_mb: target shard size in MB (10^6 bytes); a pack larger than that gets a shard of its own.
        classes: class names recorded in :data:`SAMPLES_FILE` (None: ``class_<i>``).

    Returns:
        ``{"samples": n, "shards": number of chunk files, "bytes": total bytes of the chunks}``.

    Raises:
        ValueError: ``shard_mb`` <= 0 (names ``--shards``), no rows, or ``out_dir`` already holds shards.
        OSError: a pack cannot be read, or ``out_dir`` is not writable.
    """
    from litdata.streaming.writer import BinaryWriter

    if not shard_mb > 0:
        raise ValueError(f"--shards {shard_mb}: give the shard size in MB, > 0")
    if not rows:
        raise ValueError(f"no packs to put into shards under {out_dir} (every video failed?)")
    out = Path(out_dir)
    if (out / INDEX_FILE).exists():
        raise ValueError(f"{out} already holds shards ({INDEX_FILE}); remove the folder to write them again")
    out.mkdir(parents=True, exist_ok=True)
    w = BinaryWriter(str(out), chunk_bytes=int(shard_mb * 1e6))
    for i, (rel, label) in enumerate(rows):
        data = Path(pack_root, rel).read_bytes()
        w.add_item(i, {"key": str(rel), "label": int(label), "jpack": data})
    w.done()
    w.merge(1)
    if classes is None:
        classes = [f"class_{i}" for i in range(1 + max(int(r[1]) for r in rows))]
    atomic_write_text(out / SAMPLES_FILE, json.dumps(
        {"format": "tsm_ds.shards", "version": 1, "classes": list(classes),
         "samples": [[str(r), int(lab)] for r, lab in rows]}) + "\n")
    chunks = [p for p in out.iterdir() if p.name.startswith("chunk-") and p.suffix == ".bin"]
    return {"samples": len(rows), "shards": len(chunks), "bytes": sum(p.stat().st_size for p in chunks)}


def _s3_get(url: str) -> bytes:
    """The object at ``s3://bucket/key`` (boto3; ``AWS_ENDPOINT_URL`` for an S3-compatible server)."""
    import boto3

    bucket, _, key = url[len("s3://"):].partition("/")
    try:
        return boto3.client("s3").get_object(Bucket=bucket, Key=key)["Body"].read()
    except Exception as e:   # botocore's errors: no such key, no server, no credentials
        raise FileNotFoundError(f"{url}: cannot read ({type(e).__name__}: {e}); check the URL, AWS_ENDPOINT_URL "
                                "and the credentials (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY)") from None


def _read_file(root: str, name: str) -> bytes:
    if _is_remote(root):
        return _s3_get(root.rstrip("/") + "/" + name)
    p = Path(root, name)
    if not p.is_file():
        raise FileNotFoundError(f"{p} does not exist: not a shard folder (write one with tsm-ds prepare "
                                "SRC OUT --shards MB)")
    return p.read_bytes()


def _check_index(root: str, raw: bytes) -> None:
    """Refuse an ``index.json`` whose items are not our (str, int, bytes) layout: litdata would
    unpickle other formats."""
    try:
        cfg = json.loads(raw)["config"]
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{root}/{INDEX_FILE}: not a litdata index ({type(e).__name__}: {e})") from None
    if (cfg.get("data_format") != _FORMATS or cfg.get("compression") or cfg.get("encryption")
            or cfg.get("item_loader") != "PyTreeLoader"):
        raise ValueError(f"{root}/{INDEX_FILE}: items stored as {cfg.get('data_format')} "
                         f"(loader {cfg.get('item_loader')}, compression {cfg.get('compression')}, encryption "
                         f"{cfg.get('encryption')}); tsm_ds reads only uncompressed {_FORMATS} items written by "
                         "tsm-ds prepare --shards (nothing else is unpickled)")


def read_samples(root: str | os.PathLike) -> tuple[list[str], list[int], list[str]]:
    """The sample list of a shard folder: ``(keys, labels, class names)``, sample i = ``keys[i]``.

    Raises:
        FileNotFoundError: no :data:`SAMPLES_FILE` (or the remote cannot be read; named).
        ValueError: a file that is not a tsm_ds sample list (named).
    """
    root = str(root)
    raw = _read_file(root, SAMPLES_FILE)
    try:
        doc = json.loads(raw)
        if doc.get("format") != "tsm_ds.shards" or doc.get("version") != 1:
            raise ValueError(f"format {doc.get('format')!r} version {doc.get('version')!r}")
        keys = [str(k) for k, _ in doc["samples"]]
        labels = [int(lab) for _, lab in doc["samples"]]
        classes = [str(c) for c in doc["classes"]]
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{root}/{SAMPLES_FILE}: not a tsm_ds shard sample list ({e}); write the shards "
                         "with tsm-ds prepare SRC OUT --shards MB") from None
    return keys, labels, classes


def shard_records(root: str | os.PathLike) -> tuple[list, list[str]]:
    """Records of every sample of a shard folder (path ``<root>!/<key>``), sorted by key (the order
    of ``read_class_folders`` on the packs), and the class names. Raises as :func:`read_samples`."""
    from tsm_ds.data.records import VideoRecord

    root = str(root) if _is_remote(str(root)) else os.path.abspath(root)
    keys, labels, classes = read_samples(root)
    recs = [VideoRecord(f"{root}{SHARD_SEP}{k}", lab) for k, lab in zip(keys, labels)]
    recs.sort(key=lambda r: r.path)
    return recs, classes


class ShardReader:
    """Sample bytes of one shard folder by key: litdata's ``StreamingDataset[i]`` under a lock.

    Args:
        root: a local shard folder or ``s3://bucket/prefix``.
        cache_dir, max_mb: the local cache of remote shards (:func:`set_shard_cache`).
        cache_chunks: remote chunks are fetched whole into the cache (default); False: litdata's
            on-demand byte ranges of each sample, nothing cached.

    Attributes:
        reads: samples read by this process.

    Raises:
        FileNotFoundError / ValueError: as :func:`read_samples`, or an ``index.json`` that is not ours.
    """

    def __init__(self, root: str, *, cache_dir: str | None = None, max_mb: float = DEFAULT_CACHE_MB,
                 cache_chunks: bool = True):
        import hashlib

        from litdata import StreamingDataset

        self.root = root
        _check_index(root, _read_file(root, INDEX_FILE))
        keys, _, _ = read_samples(root)
        self.index = {k: i for i, k in enumerate(keys)}
        kw = {}
        if _is_remote(root):
            import tempfile

            cache_dir = cache_dir or os.path.join(tempfile.gettempdir(), "tsm_ds_shards",
                                                  hashlib.sha1(root.encode()).hexdigest()[:12])
            os.makedirs(cache_dir, exist_ok=True)
            kw = dict(cache_dir=cache_dir, max_cache_size=f"{int(max_mb)}MB")
            endpoint = os.environ.get("AWS_ENDPOINT_URL")
            if endpoint:
                kw["storage_options"] = {"endpoint_url": endpoint}
            if endpoint and endpoint.startswith("http://"):
                # litdata 0.2.76 fetches whole chunks with obstore, whose S3 client it builds without
                # allow_http: a plain-http endpoint fails ("builder error"). Its boto3 path reads them.
                import litdata.streaming.downloader as _dl

                _dl._OBSTORE_AVAILABLE = False
        self.cache_dir = cache_dir
        self._ds = StreamingDataset(root, shuffle=False, drop_last=False, **kw)
        # litdata's random access fetches each sample's byte range anew (two requests a sample, no
        # cache); whole chunks into the bounded cache serve the next epochs and the chunk's other
        # samples from disk (README "Shards": requests per clip both ways)
        self._ds._on_demand_bytes = not cache_chunks
        self._lock = threading.Lock()
        self.reads = 0

    def read(self, key: str) -> bytes:
        """The ``.jpack`` bytes of sample ``key``.

        Raises:
            VideoOpenError: the key is not in the shards, or its chunk cannot be read / fetched
                (named ``<root>!/<key>``); the dataset replaces the item like a bad video.
        """
        from tsm_ds.data.video import VideoOpenError

        name = f"{self.root}{SHARD_SEP}{key}"
        i = self.index.get(key)
        if i is None:
            raise VideoOpenError(name, f"not in {SAMPLES_FILE}")
        try:
            with self._lock:
                item = self._ds[i]
        except Exception as e:   # litdata / botocore / OS errors: a missing or damaged chunk
            raise VideoOpenError(name, f"cannot read its shard ({type(e).__name__}: {e})") from None
        if not isinstance(item, dict) or item.get("key") != key or not isinstance(item.get("jpack"), (bytes, bytearray, memoryview)):
            raise VideoOpenError(name, f"sample {i} of the chunks is not this key (got "
                                       f"{item.get('key') if isinstance(item, dict) else type(item).__name__}); "
                                       "the sample list and the chunks disagree")
        self.reads += 1
        return bytes(item["jpack"])


_READERS: dict[tuple[int, str], ShardReader] = {}


def get_reader(root: str) -> ShardReader:
    """This process's :class:`ShardReader` of ``root`` (one per process: DataLoader workers open
    their own). Raises as :class:`ShardReader`."""
    k = (os.getpid(), root)
    r = _READERS.get(k)
    if r is None:
        r = _READERS[k] = ShardReader(root, cache_dir=_cache["dir"], max_mb=_cache["mb"])
    return r


def open_packed(path: str):
    """The :class:`~tsm_ds.data.video.PackedVideo` of shard sample ``path`` (``<folder>!/<key>``),
    held in memory.

    Raises:
        VideoOpenError: the shard or sample cannot be read. VideoDecodeError: a damaged pack
        (both name ``path``; the dataset replaces the item like a bad video).
    """
    from tsm_ds.data.video import PackedVideo, VideoOpenError

    root, key = split_shard_path(path)
    try:
        reader = get_reader(root)
    except (OSError, ValueError) as e:
        raise VideoOpenError(path, str(e)) from None
    return PackedVideo.from_bytes(reader.read(key), path)
