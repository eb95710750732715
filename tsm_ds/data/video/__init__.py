"""Decode exactly the frames a clip needs from a video file (PyAV) or a JPEG frame folder.

Modules:

- :mod:`~tsm_ds.data.video.errors`: :class:`VideoError` and subclasses, :func:`warn_once`.
- :mod:`~tsm_ds.data.video.frames`: JPEG frame folders (``img_00001.jpg`` ..., official layout).
- :mod:`~tsm_ds.data.video.packed`: the training-ready packed format (``.jpack``: a video's JPEG
  frames and an index in one file), its reader :class:`PackedVideo` and writer :func:`write_packed`.
- :mod:`~tsm_ds.data.video.index`: the demux-only frame index (:class:`VideoIndex`), its
  in-process and on-disk caches, :func:`count_frames`.
- :mod:`~tsm_ds.data.video.decode`: :func:`decode_frames` (exact frames: seek only forward past
  the decode position, convert only what is asked for).
- :mod:`~tsm_ds.data.video.sequential`: whole videos in order: :func:`iter_decoded` (the one
  sequential decode loop, :class:`DecodeStats`), :func:`iter_frames` (streaming),
  :func:`decode_all_frames` (the reference decoder).
- :mod:`~tsm_ds.data.video.convert`: a decoded frame as RGB (:func:`to_rgb`), rotation metadata
  applied (:func:`rotate`).

A frame index is the i-th frame in presentation order, counted from 0, for video files, frame
folders and packs alike. Frames are np.uint8 (H, W, 3) RGB.
"""
from __future__ import annotations

from .convert import rotate, to_rgb
from .decode import decode_frames
from .errors import NoVideoStreamError, VideoDecodeError, VideoError, VideoOpenError, warn_once
from .frames import FRAME_TEMPLATE, frame_folder_count, is_frame_folder, read_frame_folder, read_frame_folder_list
from .index import (
                     VideoIndex,
                     build_index,
                     clear_index_cache,
                     count_frames,
                     get_index,
                     open_video,
                     set_index_cache_dir,
                     set_index_cache_size,
                     video_stream,
)
from .packed import (
                     PACK_EXTENSION,
                     PackedVideo,
                     decode_jpeg_batch,
                     is_packed,
                     packed_count,
                     read_packed_frames,
                     write_packed,
)
from .sequential import DecodeStats, decode_all_frames, iter_decoded, iter_frames

__all__ = [
    "VideoError", "VideoOpenError", "NoVideoStreamError", "VideoDecodeError", "warn_once",
    "FRAME_TEMPLATE", "is_frame_folder", "frame_folder_count", "read_frame_folder", "read_frame_folder_list",
    "PACK_EXTENSION", "PackedVideo", "is_packed", "packed_count", "read_packed_frames", "write_packed",
    "decode_jpeg_batch",
    "VideoIndex", "build_index", "get_index", "count_frames", "set_index_cache_dir", "set_index_cache_size",
    "clear_index_cache", "open_video", "video_stream",
    "DecodeStats", "decode_frames", "decode_all_frames", "iter_frames", "iter_decoded", "to_rgb",
    "rotate",
]
