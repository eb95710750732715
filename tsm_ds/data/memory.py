"""Flat memory in long epochs: hand the heap that decoding freed back to the OS after every item.

Decoding a clip allocates and frees tens of MB (FFmpeg frame buffers, RGB frames, transform
intermediates, each size depending on the video). glibc keeps freed heap memory for reuse and
returns only the top of the heap; holes between longer-lived blocks (frame indexes, Python
objects) stay resident. No object leaks (the heap's used bytes stay flat), yet the RSS of a
decoding process grows with every clip: the issue measured 878 MB after 200 clips, 1,092 MB after
5,000; here, on 10,000 distinct small clips, see docs/performance.md ("Memory in long epochs").

Options measured (docs/performance.md): ``malloc_trim(0)`` after every item (chosen: flat, 0.6 ms per
~95 ms item on this CPU, 0.3 %), ``mallopt`` of ``M_MMAP_THRESHOLD`` / ``M_TRIM_THRESHOLD``,
``MALLOC_ARENA_MAX`` and persistent DataLoader workers (which keep a worker's growth across
epochs; the trainer's non-persistent ones restart every epoch, which does not help long epochs).

Where: in a DataLoader worker after every item (the worker does nothing else). In the main
process (``num_workers=0``, the inference tools) every :data:`MAIN_PROCESS_EVERY` items: there the
heap also serves the training step, whose freed pages a trim after every item handed back only for
the step to fault them in again (measured: TSM-ResNet-18 112 px, 2 clips per step, 1 thread, trim
after every item made the item + step iteration 5.6-6.5 % slower; every 64 items costs ~0.1 %).

The dataset calls it unless its ``reader_options.malloc_trim`` is False (``--no-malloc-trim``,
``TSM_DS_MALLOC_TRIM=0``; :mod:`tsm_ds.data.options`). On a C library without ``malloc_trim`` (musl,
macOS) :func:`release_freed_heap` does nothing.
"""
from __future__ import annotations

import ctypes
import ctypes.util

__all__ = ["release_freed_heap"]

_trim = None   # libc's malloc_trim, False when unavailable; resolved on first use (per process)
#: items between two trims in the main process (DataLoader workers trim after every item)
MAIN_PROCESS_EVERY = 64
_calls = 0


def release_freed_heap() -> bool:
    """Return the heap memory glibc holds free to the OS (``malloc_trim(0)``); call after each item.

    In a DataLoader worker every call trims; in any other process every :data:`MAIN_PROCESS_EVERY`-th
    (see the module docstring).

    Returns:
        True when memory was released (glibc's return value), False when nothing was released,
        this call was skipped or the C library has no ``malloc_trim``.
    """
    global _trim, _calls
    _calls += 1
    from torch.utils.data import get_worker_info

    if get_worker_info() is None and _calls % MAIN_PROCESS_EVERY:
        return False
    if _trim is None:
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _trim = libc.malloc_trim
            _trim.argtypes, _trim.restype = [ctypes.c_size_t], ctypes.c_int
        except (OSError, AttributeError):
            _trim = False
    return bool(_trim(0)) if _trim else False
