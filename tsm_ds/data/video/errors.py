"""Why a video cannot be used (:class:`VideoError` and subclasses), and once-per-file warnings.

Every decoder function of :mod:`tsm_ds.data.video` raises these (never a raw PyAV/FFmpeg error)
for a file that cannot be opened, has no video stream or has no decodable frame; ``path`` and
``reason`` name the problem for the user. Recoverable problems (a stream that ends early, a
timestamp fallback) are reported once per (file, kind) per process by :func:`warn_once`.
"""
from __future__ import annotations

import errno
import os
import stat
import threading
import warnings

__all__ = ["VideoError", "VideoOpenError", "NoVideoStreamError", "VideoDecodeError", "warn_once",
           "check_readable_file"]


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


def _stat_reason(path: str, e: OSError) -> str:
    """Why ``os.stat(path)`` failed, in words; the errno name is kept for searching the logs."""
    code = errno.errorcode.get(e.errno or 0, str(e.errno))
    if e.errno == errno.ENOENT:
        if os.path.islink(path):
            return (f"broken symbolic link (ENOENT: its target {os.readlink(path)!r} does not exist)")
        return "file not found (ENOENT; check the list file's paths and the data root)"
    if e.errno == errno.ELOOP:
        return ("symbolic link loop (ELOOP: too many levels of symbolic links; a link points back to "
                "itself or to another link of the chain)")
    if e.errno in (errno.EACCES, errno.EPERM):
        return f"permission denied ({code}: the training user cannot read the file or a folder above it)"
    if e.errno == errno.ENOTDIR:
        return "a component of the path is a file, not a folder (ENOTDIR)"
    return f"cannot stat the file ({code}: {e.strerror})"


def check_readable_file(path: str | os.PathLike) -> os.stat_result:
    """``os.stat(path)`` of a regular file, or :class:`VideoOpenError` with the real reason.

    The reason names the cause and its errno: a missing file (ENOENT), a broken symbolic link (its
    target), a symbolic link loop (ELOOP, not "file not found"), permission denied (EACCES), a
    path through a file (ENOTDIR), or a path that is not a regular file (a folder, a FIFO).

    Raises:
        VideoOpenError: as above; ``path`` and ``reason`` name the problem.
    """
    path = str(path)
    try:
        st = os.stat(path)
    except OSError as e:
        raise VideoOpenError(path, _stat_reason(path, e)) from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a folder" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise VideoOpenError(path, f"{kind}, not a video file")
    return st


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
