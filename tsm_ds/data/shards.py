"""Packed videos in shards (issue 30): written and read by litdata, sampled by our own sampler.

Why shards: one file per clip is one open per clip on a shared filesystem; shards are a few large
files read sequentially or fetched whole from an object store (S3-compatible), with a local cache
of bounded size.

Which library does what (docs/shards.md has the evidence):

- storage: litdata 0.2.76 (``BinaryWriter`` writes the chunks and their ``index.json``,
  ``StreamingDataset[i]`` reads sample ``i`` by its global index, locally or from ``s3://`` through
  a cache folder bounded by ``max_cache_size``);
- sampling: ours. litdata's own iteration forces ``drop_last`` in a distributed run and shuffles
  chunks, not samples, so it cannot keep the per-file loader's rules. Every loader here keeps its
  sampler (:class:`tsm_ds.engine.loop.loaders.ResumableDistributedSampler` in training, the
  ``DistributedSampler`` of evaluation); the dataset only asks a shard reader for sample ``i``'s
  bytes instead of opening a ``.jpack`` file. The items are therefore those of the per-file packs
  for the same (seed, epoch, index) (tested), and resume, padding and evaluation are unchanged.

A shard folder (local, or ``s3://bucket/prefix``; ``AWS_ENDPOINT_URL`` names an S3-compatible
server) holds litdata's ``chunk-*.bin`` + ``index.json`` and our ``samples.json``::

    {"format": "tsm_ds.shards", "version": 2, "classes": [names],
     "samples": [[key, label, first, frames, width, height], ...], "split": {...}}

``split`` (optional, written by ``tsm-ds prepare --dataset NAME --shards``): the dataset's own split,
``{"dataset", "dataset_split", "flip", "train" / "val" / "test": [keys], "missing": {side: [ids]}}``
(:func:`shard_split`).

``key``: the pack's path relative to the prepare output; ``first``: the litdata sample index of the
video's frame 0; ``frames``, ``width``, ``height``: the pack's header. One litdata sample is ONE
JPEG frame, ``{"v": video number, "f": frame number, "jpeg": bytes}`` (the pack's frame bytes,
unchanged): an item reads only the frames it keeps (8 for a T=8 train clip), never the whole video,
and decodes them as :class:`~tsm_ds.data.video.PackedVideo` does (:class:`ShardVideo` is one), so
the items are bit-identical to the per-file packs'. Measured against one sample per whole pack in
docs/shards.md. A record of a shard sample has the path ``<shard folder>!/<key>``
(:data:`SHARD_SEP`): bad-sample messages name it like a bad video.

Shard contents are data: only litdata's ``int`` / ``int`` / ``bytes`` serializers are accepted
(``index.json`` is checked before litdata reads it), so nothing in a shard is unpickled or run.

litdata internals we depend on are in one place, :func:`_litdata_plain_http_s3` (tested by
``tests/data/test_shards.py::test_litdata_private_switch_still_there``); everything else is its
public API (``BinaryWriter``, ``StreamingDataset(batch_decode=0)[i]``, ``on_demand_bytes``).
"""
from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path

from tsm_ds.data.video.packed import PackedVideo
from tsm_ds.utils.io import atomic_write_text

__all__ = ["SHARD_SEP", "SAMPLES_FILE", "INDEX_FILE", "DEFAULT_CACHE_MB", "is_shard_path", "is_shard_source",
           "split_shard_path", "write_shards", "read_samples", "shard_records", "shard_split", "set_shard_cache",
           "shard_cache", "ShardReader", "ShardVideo", "get_reader", "open_packed"]

#: separates the shard folder from the sample key in a record path: ``<folder>!/<key>``
SHARD_SEP = "!/"
#: our sample list beside litdata's files
SAMPLES_FILE = "samples.json"
#: litdata's chunk index
INDEX_FILE = "index.json"
#: default bound of the local cache of remote shards (MiB)
DEFAULT_CACHE_MB = 20480.0
#: the only item layout accepted (litdata's serializers of v, f, jpeg): nothing is unpickled
_FORMATS = ["int", "int", "bytes"]
#: samples.json version: 2 = one litdata sample per frame (1, one sample per whole pack, is gone)
_VERSION = 2
_SOI, _EOI = b"\xff\xd8", b"\xff\xd9"

_cache = {"dir": None, "mb": DEFAULT_CACHE_MB}   # a dataset's reader_options set it (set_shard_cache)


def set_shard_cache(cache_dir: str | None, max_mb: float | None) -> None:
    """Where this process caches remote shards and how large the cache may grow (``--shard-cache``,
    ``--shard-cache-mb``); a dataset sets it in the process that reads it from its ``reader_options``
    (:meth:`tsm_ds.data.options.ReaderOptions.apply`). This process's readers are opened again.

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
                 shard_mb: float, classes: list[str] | None = None, split: dict | None = None) -> dict:
    """Write the frames of the packs ``rows`` into litdata chunks of about ``shard_mb`` MB under ``out_dir``.

    Every frame of every pack becomes one litdata sample (its JPEG bytes, unchanged), in row order
    then frame order; :data:`SAMPLES_FILE` records where each video's frames start and its header.

    Args:
        pack_root: the folder the rows' paths are relative to (``tsm-ds prepare``'s output).
        rows: ``(relative .jpack path, label)`` in video order (video v = row v).
        out_dir: the shard folder (created; must not hold shards already).
        shard_mb: target shard size in MB (10^6 bytes).
        classes: class names recorded in :data:`SAMPLES_FILE` (None: ``class_<i>``).
        split: a dataset's split recorded in :data:`SAMPLES_FILE` (module docstring; None: none, the
            readers hold out a share per class).

    Returns:
        ``{"samples": videos, "frames": litdata samples, "shards": number of chunk files,
        "bytes": total bytes of the chunks}``.

    Raises:
        ValueError: ``shard_mb`` <= 0 (names ``--shards``), no rows, or ``out_dir`` already holds shards.
        VideoOpenError / VideoDecodeError: a pack cannot be read or is damaged (names it; nothing is
            left half-written as shards: :data:`SAMPLES_FILE` is written last).
        OSError: ``out_dir`` is not writable.
    """
    from litdata.streaming.writer import BinaryWriter

    from tsm_ds.data.video import PackedVideo

    if not shard_mb > 0:
        raise ValueError(f"--shards {shard_mb}: give the shard size in MB, > 0")
    if not rows:
        raise ValueError(f"no packs to put into shards under {out_dir} (every video failed?)")
    out = Path(out_dir)
    if (out / INDEX_FILE).exists():
        raise ValueError(f"{out} already holds shards ({INDEX_FILE}); remove the folder to write them again")
    out.mkdir(parents=True, exist_ok=True)
    w = BinaryWriter(str(out), chunk_bytes=int(shard_mb * 1e6))
    table = []
    i = 0
    for v, (rel, label) in enumerate(rows):
        with PackedVideo(Path(pack_root, rel)) as pv:   # checks the index and every frame's SOI / EOI
            frames = pv.read_encoded(range(pv.num_frames))
            table.append([str(rel), int(label), i, pv.num_frames, pv.width, pv.height])
        for f in range(len(frames)):
            w.add_item(i, {"v": v, "f": f, "jpeg": frames[f]})
            i += 1
    w.done()
    w.merge(1)
    if classes is None:
        classes = [f"class_{i}" for i in range(1 + max(int(r[1]) for r in rows))]
    doc = {"format": "tsm_ds.shards", "version": _VERSION, "classes": list(classes), "samples": table}
    if split is not None:
        doc["split"] = split
    atomic_write_text(out / SAMPLES_FILE, json.dumps(doc) + "\n")
    chunks = [p for p in out.iterdir() if p.name.startswith("chunk-") and p.suffix == ".bin"]
    return {"samples": len(rows), "frames": i, "shards": len(chunks), "bytes": sum(p.stat().st_size for p in chunks)}


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


def _read_doc(root: str) -> tuple[list[list], list[str]]:
    """The rows ``[key, label, first, frames, width, height]`` of :data:`SAMPLES_FILE` and the class names."""
    raw = _read_file(root, SAMPLES_FILE)
    try:
        doc = json.loads(raw)
        if doc.get("format") != "tsm_ds.shards" or doc.get("version") != _VERSION:
            raise ValueError(f"format {doc.get('format')!r} version {doc.get('version')!r}, this reader knows "
                             f"version {_VERSION} (one sample per frame)")
        rows = [[str(k), int(lab), int(a), int(n), int(w), int(h)] for k, lab, a, n, w, h in doc["samples"]]
        classes = [str(c) for c in doc["classes"]]
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{root}/{SAMPLES_FILE}: not a tsm_ds shard sample list ({e}); write the shards "
                         "with tsm-ds prepare SRC OUT --shards MB") from None
    return rows, classes


def read_samples(root: str | os.PathLike) -> tuple[list[str], list[int], list[str]]:
    """The sample list of a shard folder: ``(keys, labels, class names)``, video v = ``keys[v]``.

    Raises:
        FileNotFoundError: no :data:`SAMPLES_FILE` (or the remote cannot be read; named).
        ValueError: a file that is not a tsm_ds sample list of this version (named).
    """
    rows, classes = _read_doc(str(root))
    return [r[0] for r in rows], [r[1] for r in rows], classes


def shard_split(root: str | os.PathLike) -> dict | None:
    """The dataset split recorded in a shard folder's :data:`SAMPLES_FILE` (``tsm-ds prepare --dataset
    NAME --shards``; its keys: module docstring), or None when the shards hold no split.

    Raises:
        FileNotFoundError, ValueError: as :func:`read_samples`; a ``split`` that is not an object.
    """
    root = str(root) if _is_remote(str(root)) else os.path.abspath(root)
    try:
        split = json.loads(_read_file(root, SAMPLES_FILE)).get("split")
    except (ValueError, AttributeError) as e:
        raise ValueError(f"{root}/{SAMPLES_FILE}: not a tsm_ds shard sample list ({e})") from None
    if split is not None and not isinstance(split, dict):
        raise ValueError(f"{root}/{SAMPLES_FILE}: \"split\" is not an object; write the shards again")
    return split


def shard_records(root: str | os.PathLike) -> tuple[list, list[str]]:
    """Records of every sample of a shard folder (path ``<root>!/<key>``), sorted by key (the order
    of ``read_class_folders`` on the packs), and the class names. Raises as :func:`read_samples`,
    and ValueError for an ``index.json`` that is not ours (checked before any reader opens it)."""
    from tsm_ds.data.records import VideoRecord

    root = str(root) if _is_remote(str(root)) else os.path.abspath(root)
    keys, labels, classes = read_samples(root)
    _check_index(root, _read_file(root, INDEX_FILE))   # refused here, at start-up, not in every worker
    recs = [VideoRecord(f"{root}{SHARD_SEP}{k}", lab) for k, lab in zip(keys, labels)]
    recs.sort(key=lambda r: r.path)
    return recs, classes


def _litdata_plain_http_s3() -> None:
    """Make litdata 0.2.76 fetch S3 chunks with boto3 instead of obstore, for a plain-http endpoint.

    litdata 0.2.76 builds obstore's ``S3Store`` itself (``downloader._build_obstore_s3_store``) from
    the boto3 client's endpoint and region, without ``allow_http`` and without a way to pass client
    options; obstore then refuses an ``http://`` endpoint ("builder error"), also with
    ``AWS_ALLOW_HTTP=true`` in the environment (checked). litdata has no public switch for its
    downloader; its boto3 path (taken when ``litdata.streaming.downloader._OBSTORE_AVAILABLE`` is
    false) reads plain http. This is the ONLY private litdata attribute tsm_ds touches; when an
    upgrade removes or renames it, ``test_litdata_private_switch_still_there`` fails. Only for
    ``http://`` endpoints (tests, moto, a local MinIO); https endpoints keep obstore.

    Raises:
        RuntimeError: the attribute is gone (a litdata upgrade): names the version and what to check.
    """
    import litdata
    import litdata.streaming.downloader as dl

    if not hasattr(dl, "_OBSTORE_AVAILABLE"):
        raise RuntimeError(f"litdata {litdata.__version__}: litdata.streaming.downloader._OBSTORE_AVAILABLE is gone "
                           "(tsm_ds switched it off to read a plain-http S3 endpoint with boto3, written for "
                           "litdata 0.2.76); check whether this litdata reads http:// endpoints itself and update "
                           "tsm_ds.data.shards._litdata_plain_http_s3")
    dl._OBSTORE_AVAILABLE = False


def _no_drop_last_warning(record: logging.LogRecord) -> bool:
    """Drop litdata's warning about ``drop_last=False`` under WORLD_SIZE > 1: it is about litdata's own
    iteration, which tsm_ds never uses (every read is by global index; our sampler pads)."""
    return "disabled the `drop_last` option" not in record.getMessage()


class ShardReader:
    """Frames of the videos of one shard folder: litdata's ``StreamingDataset[i]`` under a lock.

    Args:
        root: a local shard folder or ``s3://bucket/prefix``.
        cache_dir, max_mb: the local cache of remote shards (:func:`set_shard_cache`).
        cache_chunks: remote chunks are fetched whole into the cache (default: litdata's public
            ``on_demand_bytes`` off, set by an empty slice ``ds[0:0]`` before any read); False:
            litdata's on-demand byte range of each frame, nothing cached.

    Every frame is read as ``StreamingDataset[i]`` with ``i`` the GLOBAL sample index: litdata's
    distributed view (``WORLD_SIZE`` read at construction: ``len`` and slices cover 1/N of the
    samples, the same on every rank) is never used, so each rank can read every sample and the
    sampler alone decides which rank reads what. A slice ``ds[i:i + 1]`` past that view returns
    ``[]`` (litdata 0.2.76): reading by slice lost (N - 1)/N of the samples at N ranks (issue 36).

    Attributes:
        reads: videos opened by this process (:meth:`video`); samples: frames (litdata samples) read.

    Raises:
        FileNotFoundError / ValueError: as :func:`read_samples`, or an ``index.json`` that is not ours.
    """

    def __init__(self, root: str, *, cache_dir: str | None = None, max_mb: float = DEFAULT_CACHE_MB,
                 cache_chunks: bool = True):
        import hashlib

        from litdata import StreamingDataset

        self.root = root
        _check_index(root, _read_file(root, INDEX_FILE))
        rows, _ = _read_doc(root)
        self.index = {r[0]: (v, r[2], r[3], r[4], r[5]) for v, r in enumerate(rows)}
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
                _litdata_plain_http_s3()
        self.cache_dir = cache_dir
        # batch_decode=0: deserialize only the requested sample. litdata's default ("auto")
        # deserializes a window of up to 256 neighbours per read, for sequential iteration; under our
        # random access by index that cost ~0.9 ms a read instead of ~0.012 ms (docs/shards.md).
        logging.getLogger("litdata.streaming.dataset").addFilter(_no_drop_last_warning)
        self._ds = StreamingDataset(root, shuffle=False, drop_last=False, batch_decode=0, **kw)
        if cache_chunks:
            # an empty slice reads nothing; it makes litdata create its cache and switch its public
            # on_demand_bytes off, so every read by index fetches whole chunks into the cache
            self._ds[0:0]
        self._lock = threading.Lock()
        self.reads = 0
        self.samples = 0

    def video(self, key: str) -> "ShardVideo":
        """The video ``key`` (its header from :data:`SAMPLES_FILE`; frames read on demand).

        Raises:
            VideoOpenError: the key is not in the shards (named ``<root>!/<key>``).
        """
        from tsm_ds.data.video import VideoOpenError

        name = f"{self.root}{SHARD_SEP}{key}"
        entry = self.index.get(key)
        if entry is None:
            raise VideoOpenError(name, f"not in {SAMPLES_FILE}")
        self.reads += 1
        v, first, n, w, h = entry
        return ShardVideo(self, name, v, first, n, w, h)

    def frame(self, name: str, v: int, first: int, f: int) -> bytes:
        """The JPEG bytes of frame ``f`` of video number ``v`` (litdata sample ``first + f``).

        Raises:
            VideoOpenError: its chunk cannot be read / fetched, or the sample is not that frame
                (the sample list and the chunks disagree); named ``name``.
        """
        from tsm_ds.data.video import VideoOpenError

        i = first + f
        try:
            with self._lock:
                item = self._ds[i]
        except Exception as e:   # litdata / botocore / OS errors: a missing or damaged chunk
            raise VideoOpenError(name, f"cannot read frame {f} from its shard ({type(e).__name__}: {e})") from None
        if (not isinstance(item, dict) or item.get("v") != v or item.get("f") != f
                or not isinstance(item.get("jpeg"), (bytes, bytearray, memoryview))):
            got = (item.get("v"), item.get("f")) if isinstance(item, dict) else type(item).__name__
            raise VideoOpenError(name, f"sample {i} of the chunks is not frame {f} of video {v} (got {got}); "
                                       f"the sample list and the chunks disagree")
        self.samples += 1
        return bytes(item["jpeg"])


class ShardVideo(PackedVideo):
    """A video inside shards, read like a :class:`~tsm_ds.data.video.PackedVideo`: the header from
    :data:`SAMPLES_FILE`, each kept frame one litdata sample, the same checks (whole JPEG: SOI /
    EOI) and the same decoding (``PackedVideo.decode``), so items equal the per-file packs'.

    Attributes:
        path (``<root>!/<key>``), num_frames, width, height, meta (``{}``: the pack's metadata is not
        kept in the shards; nothing reads it to decode).
    """

    def __init__(self, reader: ShardReader, name: str, v: int, first: int, n: int, w: int, h: int):
        self.path, self._fd, self._buf, self.meta, self.offsets = name, None, None, {}, None
        self.num_frames, self.width, self.height = n, w, h
        self._reader, self._v, self._first = reader, v, first

    def _bad(self, what: str):
        from tsm_ds.data.video import VideoDecodeError

        return VideoDecodeError(self.path, f"damaged shard sample: {what} (write the shards again: tsm-ds prepare "
                                           "SRC OUT --shards MB into a new folder)")

    def read_encoded(self, indices) -> dict[int, bytes]:
        """The JPEG bytes of frames ``indices`` (clipped to [0, N - 1], repeats read once): one
        litdata sample each. Raises VideoOpenError (chunk) / VideoDecodeError (not a whole JPEG)."""
        n = self.num_frames
        out: dict[int, bytes] = {}
        for i in sorted({min(max(int(i), 0), n - 1) for i in indices}):
            data = self._reader.frame(self.path, self._v, self._first, i)
            if data[:2] != _SOI or data[-2:] != _EOI:
                raise self._bad(f"frame {i} is not a whole JPEG image")
            out[i] = data
        return out


_READERS: dict[tuple[int, str], ShardReader] = {}


def get_reader(root: str) -> ShardReader:
    """This process's :class:`ShardReader` of ``root`` (one per process: DataLoader workers open
    their own). Raises as :class:`ShardReader`."""
    k = (os.getpid(), root)
    r = _READERS.get(k)
    if r is None:
        r = _READERS[k] = ShardReader(root, cache_dir=_cache["dir"], max_mb=_cache["mb"])
    return r


def open_packed(path: str) -> ShardVideo:
    """The :class:`ShardVideo` of shard sample ``path`` (``<folder>!/<key>``): no frame is read
    until ``read_encoded`` / ``decode``.

    Raises:
        VideoOpenError: the shard folder or the sample cannot be read (names ``path``; the dataset
        replaces the item like a bad video).
    """
    from tsm_ds.data.video import VideoOpenError

    root, key = split_shard_path(path)
    try:
        reader = get_reader(root)
    except (OSError, ValueError) as e:
        raise VideoOpenError(path, str(e)) from None
    return reader.video(key)
