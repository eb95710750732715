"""Why a video cannot be used (:class:`VideoError` and subclasses), and once-per-file warnings.

Every decoder function of :mod:`tsm_ds.data.video` raises these (never a raw PyAV/FFmpeg error)
for a file that cannot be opened, has no video stream or has no decodable frame; ``path`` and
``reason`` name the problem for the user. Recoverable problems (a stream that ends early, a
timestamp fallback) are reported once per (file, kind) per process by :func:`warn_once`.
"""
from __future__ import annotations

import os
import threading
import warnings

__all__ = ["VideoError", "VideoOpenError", "NoVideoStreamError", "VideoDecodeError", "warn_once"]


class VideoError(Exception):
    """Base class: a video file that cannot be used. ``path`` and ``reason`` name the problem."""

    def __init__(self, path: str | os.PathLike, reason: str):
        self.path = str(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")


class VideoOpenError(VideoError):
    """The file does not exist or FFmpeg cannot open it as a media container."""


class NoVideoStreamError(VideoError):
    """The container opens but holds no video stream (e.g. an audio-only file)."""


class VideoDecodeError(VideoError):
    """The video stream yields no decodable frame (or no packet at all)."""


# --------------------------------------------------------------------------------------------
# warnings: once per (file, kind) per process
_warned: set[tuple[str, str]] = set()
_warn_lock = threading.Lock()


def warn_once(path: str | os.PathLike, kind: str, message: str) -> bool:
    """Issue ``RuntimeWarning(message)`` the first time ``(path, kind)`` is seen in this process.

    The warning is attributed to the caller of the function that calls ``warn_once``
    (``stacklevel=3``). Thread-safe.

    Args:
        path: the file the warning is about (compared as ``str(path)``).
        kind: what went wrong (e.g. ``"partial"``, ``"pts"``, ``"demux"``, ``"bad"``); one
            warning per kind and file.
        message: the warning text.

    Returns:
        True when the warning was issued, False when it had been issued before.
    """
    key = (str(path), kind)
    with _warn_lock:
        if key in _warned:
            return False
        _warned.add(key)
    warnings.warn(message, RuntimeWarning, stacklevel=3)
    return True
