"""Hang watchdog: a rank that makes no progress writes every thread's Python stack and exits.

A hung data-parallel job (a rank stuck in a decoder, a dead NFS mount, a deadlocked collective)
otherwise sits idle until someone notices. :class:`Watchdog` runs a daemon thread on every rank;
the trainer reports progress (:meth:`Watchdog.beat`): an optimizer step, an evaluation batch, a
checkpoint write. When no progress came within the limit, the rank

1. writes the Python stacks of all its threads (``faulthandler.dump_traceback``) to
   ``<run>/stacks/rank<k>.txt``, after a header saying why (phase, limit, last progress);
2. creates ``<run>/stacks/hang.json`` (the first rank to fire: rank, host, pid, reason), which the
   other ranks' watchdogs poll every second: they write their stacks at once too, so that every
   rank has left its stacks before the launcher tears the job down (the run directory is shared
   by all hosts, as for checkpoints);
3. removes its DeepSpeed CPU all-reduce buffer in /dev/shm (``os._exit`` skips the ``atexit``
   clean-up of :func:`tsm_ds.engine.dist.release_cpu_shm_at_exit`), waits a few seconds for the
   peers, and exits with status :data:`EXIT_HUNG` (6) via ``os._exit`` (a hung main thread cannot
   be unwound).

Two limits: ``startup_timeout`` from :meth:`Watchdog.start` (in ``Trainer.setup``: DeepSpeed's op
builds, ``deepspeed.initialize``, resuming, the first DataLoader workers) to the end of the first
optimizer step, then ``step_timeout`` between any two beats. Defaults (``--step-timeout`` 1800 s,
``--startup-timeout`` 3600 s) are far above anything the suite, the quickstart or a CPU
ResNet-50 step needs; 0 turns a limit off. Rendezvous and collective timeouts are the process
group's business (``--dist-timeout``), not this module's.

A thread stuck in C code that holds the GIL stops the Python watchdog too: as a backstop,
``faulthandler.dump_traceback_later`` (a C thread, no GIL needed) is armed at every beat for the
limit + :data:`BACKSTOP_S`; it prints the stacks to the rank's stderr (the launcher's log) and
exits with status 1. It replaces any ``dump_traceback_later`` the program armed itself.

Test hook: ``TSM_DS_TEST_HANG=<rank>:<step>[:<seconds>]`` makes that rank sleep (default 3600 s)
in the beat of that optimizer step, inside :func:`_sleep_for_test` (a frame the stacks show).
"""
from __future__ import annotations

import faulthandler
import functools
import json
import logging
import os
import socket
import sys
import threading
import time
from pathlib import Path

__all__ = ["EXIT_HUNG", "BACKSTOP_S", "Watchdog", "watched_setup", "watched_run"]

log = logging.getLogger("tsm_ds.train")

#: exit status of a rank stopped by the watchdog (2: configuration, 3: diverged, 4: save failed,
#: 5: rendezvous failed, 75: preempted)
EXIT_HUNG = 6
#: seconds after the limit at which the faulthandler backstop fires (see the module docstring)
BACKSTOP_S = 60.0
TRIGGER = "hang.json"


def _secs(x: float) -> str:
    return f"{x:.0f}" if x >= 10 else f"{x:.2g}"


def _sleep_for_test(rank: int, step: int | None) -> None:
    """The ``TSM_DS_TEST_HANG`` hook (see the module docstring); nothing when unset."""
    spec = os.environ.get("TSM_DS_TEST_HANG")
    if not spec or step is None:
        return
    parts = spec.split(":")
    if int(parts[0]) == rank and int(parts[1]) == step:
        time.sleep(float(parts[2]) if len(parts) > 2 else 3600.0)


class Watchdog:
    """Per-rank hang watchdog (see the module docstring).

    Args:
        run_dir: the run folder (shared by all ranks); stacks go to ``<run_dir>/stacks``.
        rank: this rank (names the stacks file).
        step_timeout: seconds allowed between two beats after the first optimizer step (<= 0: off).
        startup_timeout: seconds allowed from :meth:`start` to the end of the first optimizer
            step (<= 0: off).
        poll: seconds between two checks of the clock and of ``hang.json``.
        grace: seconds the first rank to fire waits before exiting, for the peers to dump theirs
            (default 3 polls + 2 s).
        exit: ``os._exit``-like function called with :data:`EXIT_HUNG` (tests replace it).

    Raises:
        ValueError: a negative ``poll`` or ``grace``.
    """

    def __init__(self, run_dir: str | os.PathLike, *, rank: int, step_timeout: float = 1800.0,
                 startup_timeout: float = 3600.0, poll: float = 1.0, grace: float | None = None, exit=os._exit):
        if poll <= 0 or (grace is not None and grace < 0):
            raise ValueError(f"watchdog: poll must be > 0 and grace >= 0, got {poll} and {grace}")
        self.dir = Path(run_dir) / "stacks"
        self.rank = int(rank)
        self.step_timeout, self.startup_timeout = float(step_timeout or 0), float(startup_timeout or 0)
        self.poll = poll
        self.grace = 3 * poll + 2.0 if grace is None else grace
        self._exit = exit
        self.phase = "start-up"
        self.last_what = "start"
        self._last = self._started = time.monotonic()
        self._started_wall = time.time()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.fired: str | None = None   # the reason, once fired

    @property
    def enabled(self) -> bool:
        """True when at least one of the two limits is on."""
        return self.step_timeout > 0 or self.startup_timeout > 0

    def limit(self) -> float:
        """The limit in force now (seconds; 0: none)."""
        return self.startup_timeout if self.phase == "start-up" else self.step_timeout

    def start(self) -> "Watchdog":
        """Start the clock (the start-up phase) and the watch thread; returns self."""
        self._last = self._started = time.monotonic()
        self._started_wall = time.time()
        if self.enabled and self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="tsm_ds-watchdog", daemon=True)
            self._thread.start()
            self._arm_backstop()
        return self

    def beat(self, what: str, step: int | None = None) -> None:
        """Report progress: ``what`` is ``"step"`` (an optimizer step, ``step`` its number; the first
        one ends the start-up phase), ``"eval"`` or ``"checkpoint"``."""
        _sleep_for_test(self.rank, step if what == "step" else None)
        self._last = time.monotonic()
        self.last_what = what if step is None else f"{what} {step}"
        if what == "step":
            self.phase = "training"
        self._arm_backstop()

    def beating(self, iterable, what: str = "eval"):
        """Iterate ``iterable`` (a DataLoader) with a beat after every item."""
        for item in iterable:
            yield item
            self.beat(what)

    def stop(self) -> None:
        """Stop watching (the run ended, normally or by an exception); idempotent."""
        self._stop.set()
        if self._thread is not None:
            faulthandler.cancel_dump_traceback_later()
            self._thread.join(timeout=5 * self.poll)
            self._thread = None

    # ------------------------------------------------------------------ inside the thread
    def _arm_backstop(self) -> None:
        lim = self.limit()
        if self._thread is None or lim <= 0:
            faulthandler.cancel_dump_traceback_later()
            return
        try:
            faulthandler.dump_traceback_later(lim + BACKSTOP_S, exit=True, file=sys.__stderr__)
        except (ValueError, AttributeError, OSError, RuntimeError):   # no usable stderr (a daemon)
            pass

    def _peer_fired(self) -> dict | None:
        f = self.dir / TRIGGER
        try:
            if f.stat().st_mtime < self._started_wall - 1.0:   # left by an earlier hang of this run dir
                return None
            return json.loads(f.read_text() or "{}")
        except (OSError, ValueError):
            return None

    def _loop(self) -> None:
        while not self._stop.wait(self.poll):
            lim = self.limit()
            idle = time.monotonic() - self._last
            if lim > 0 and idle > lim:
                self._fire(f"no progress for {_secs(idle)} s (the {self.phase} limit is {_secs(lim)} s; last "
                           f"progress: {self.last_what})", first=True)
                return
            peer = self._peer_fired()
            if peer is not None:
                self._fire(f"rank {peer.get('rank')} ({peer.get('host')}) found no progress: {peer.get('reason')}; "
                           f"this rank's last progress: {self.last_what}, {_secs(idle)} s ago", first=False)
                return

    def _fire(self, reason: str, *, first: bool) -> None:
        self.fired = reason
        faulthandler.cancel_dump_traceback_later()
        out = self.dir / f"rank{self.rank}.txt"
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            with open(out, "w") as fh:
                fh.write(f"rank {self.rank}, host {socket.gethostname()}, pid {os.getpid()}, "
                         f"{time.strftime('%Y-%m-%d %H:%M:%S')}: watchdog: {reason}\n"
                         f"Python stacks of every thread (most recent call first):\n\n")
                fh.flush()
                faulthandler.dump_traceback(file=fh, all_threads=True)
            if first:
                self._write_trigger(reason)
        except OSError as e:   # the run dir is gone or full: the stacks go to stderr instead
            log.error("watchdog: cannot write %s (%s); stacks follow on stderr", out, e)
            faulthandler.dump_traceback(file=sys.__stderr__, all_threads=True)
        self._release_shm()
        log.error("watchdog (rank %d): %s; Python stacks of every thread written to %s; exiting with status %d",
                  self.rank, reason, out, EXIT_HUNG)
        for h in logging.getLogger().handlers + log.handlers:
            try:
                h.flush()
            except Exception:
                pass
        if first:
            time.sleep(self.grace)   # let the peers see hang.json and write their stacks
        self._exit(EXIT_HUNG)

    def _write_trigger(self, reason: str) -> None:
        payload = json.dumps({"rank": self.rank, "host": socket.gethostname(), "pid": os.getpid(),
                              "reason": reason, "time": time.time()})
        f = self.dir / TRIGGER
        tmp = self.dir / f".{TRIGGER}.rank{self.rank}.tmp"
        tmp.write_text(payload)
        try:   # the first rank wins: later ones keep its file
            os.link(tmp, f)
        except FileExistsError:
            if self._peer_fired() is None:   # a stale one from an earlier hang of this run dir
                os.replace(tmp, f)
                return
        finally:
            tmp.unlink(missing_ok=True)

    @staticmethod
    def _release_shm() -> None:
        """Unlink this rank's DeepSpeed CPU all-reduce buffer (``os._exit`` skips ``atexit``)."""
        try:
            from tsm_ds.engine.dist import release_cpu_shm_now
            release_cpu_shm_now()
        except Exception:   # exiting anyway: the buffer is only RAM to give back
            pass


def watched_setup(setup):
    """Decorator of ``Trainer.setup``: start ``trainer.watchdog`` (a :class:`Watchdog` with the limits of
    ``trainer.s``: ``run_dir``, ``step_timeout``, ``startup_timeout``; rank from ``$RANK``) before the
    set-up, so that its start-up limit covers the op builds and ``deepspeed.initialize``; stop it
    when the set-up raises (a caller that catches the error must not be killed an hour later)."""
    @functools.wraps(setup)
    def wrapper(trainer, *args, **kwargs):
        s = trainer.s
        trainer.watchdog = Watchdog(s.run_dir, rank=int(os.environ.get("RANK", "0")), step_timeout=s.step_timeout,
                                    startup_timeout=s.startup_timeout).start()
        try:
            out = setup(trainer, *args, **kwargs)
        except BaseException:
            trainer.watchdog.stop()
            raise
        trainer.watchdog.rank = int(getattr(trainer, "rank", trainer.watchdog.rank))   # MPI launches set no $RANK
        return out
    return wrapper


def watched_run(fit):
    """Decorator of ``Trainer.fit``: stop ``trainer.watchdog`` when the run returns or raises."""
    @functools.wraps(fit)
    def wrapper(trainer, *args, **kwargs):
        try:
            return fit(trainer, *args, **kwargs)
        finally:
            if getattr(trainer, "watchdog", None) is not None:
                trainer.watchdog.stop()
    return wrapper
