"""Hang watchdog: a rank that makes no progress writes every thread's Python stack and exits.

A hung data-parallel job (a rank stuck in a decoder, a dead NFS mount, a deadlocked collective)
otherwise sits idle until someone notices. :class:`Watchdog` runs a daemon thread on every rank;
the trainer reports progress (:meth:`Watchdog.beat`): an optimizer step, an evaluation batch, a
checkpoint write. A beat only updates a few attributes (the time, the last optimizer step, a beat
count): nothing is written on the hot path. When no progress came within the limit, the rank

1. writes the Python stacks of all its threads (``faulthandler.dump_traceback``) to
   ``<run>/stacks/rank<k>.txt``, after a header saying why (phase, limit, last progress);
2. creates ``<run>/stacks/hang.json`` (the trigger: ``{"first_fired": {rank, host, pid, reason,
   time}, "stalled_ranks": null}``; the first rank to fire wins), which the other ranks' watchdogs
   poll every second: they write their stacks at once too, so that every rank has left its stacks
   before the launcher tears the job down (the run directory is shared by all hosts, as for
   checkpoints);
3. every rank, the first one or a follower, then writes its progress record
   ``<run>/stacks/rank<k>.json`` (atomically: rank, host, pid, ``step`` (its last optimizer step,
   null before the first), ``beats`` (all its beats), ``last_progress``, ``idle_s`` (seconds since its
   last beat), ``followed`` (the rank whose ``hang.json`` it followed; null: its own limit fired));
   it is there only once the rank's stacks are;
4. removes its DeepSpeed CPU all-reduce buffer in /dev/shm (``os._exit`` skips the ``atexit``
   clean-up of :func:`tsm_ds.engine.comm.dist.release_cpu_shm_at_exit`);
5. waits (up to ``grace`` seconds) for the records of all ``world_size`` ranks, and rewrites
   ``hang.json`` atomically as the report, from whatever records arrived:

   - ``stalled_ranks``: the ranks that made the least progress (the smallest ``(step, beats)``;
     ties listed together), ``stalled_step`` and ``stalled_since`` their last optimizer step and
     last progress; ``waited_ranks``: the ranks with more progress (waiting for the stalled ones,
     e.g. in a collective); ``unknown_ranks``: the ranks whose record never came (their watchdog
     could not run: a thread holding the GIL, see the backstop below; or the process is gone);
   - ``first_fired``: who fired first (not necessarily the stalled rank: a rank waiting in a
     collective for a sleeping peer may reach its limit first, its own last beat is later but
     the ranks' 1 s polls are not in step);
   - ``ranks`` (the records by rank), ``world_size``, ``time`` and ``summary``, the line each rank
     logs: "rank 1 made no progress since step 1 (last beat 12 s before its watchdog fired); rank 0
     waited for it; rank 0 (host) fired first".

   A report already there with more records is kept (ranks that time out at different moments);
6. exits with status :data:`EXIT_HUNG` (6) via ``os._exit`` (a hung main thread cannot be
   unwound). Every rank waits for the records before exiting, so the first rank to exit (after
   which the launcher kills the others) has written a complete report, unless a record never came.

Files in ``stacks/`` older than this rank's :meth:`Watchdog.start` (an earlier hang of a resumed run
dir) are ignored.

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

Test hook: ``test_hang="<rank>:<step>[:<seconds>]"`` (the train command's hidden ``debug.test_hang``,
set from ``TSM_DS_TEST_HANG``) makes that rank sleep (default 3600 s)
in the beat of that optimizer step, inside :func:`_sleep_for_test` (a frame the stacks show),
before the beat counts: that rank's last progress stays the step before.

Kept whole: 60 of its lines are this description, and the rest is one hook whose firing,
following and reporting steps share the same files under ``stacks/`` and the same state.
"""
from __future__ import annotations

import faulthandler
import json
import logging
import os
import socket
import sys
import threading
import time
from pathlib import Path

from tsm_ds.engine.loop.hooks import TrainHook

# EXIT_HUNG (6): the exit status of a rank stopped by the watchdog (the one table: tsm_ds.utils.exits)
from tsm_ds.utils.exits import EXIT_HUNG

__all__ = ["EXIT_HUNG", "BACKSTOP_S", "Watchdog"]

log = logging.getLogger("tsm_ds.train")

#: seconds after the limit at which the faulthandler backstop fires (see the module docstring)
BACKSTOP_S = 60.0
TRIGGER = "hang.json"
RECORD = "rank{}.json"


def _secs(x: float) -> str:
    return f"{x:.0f}" if x >= 10 else f"{x:.2g}"


def _sleep_for_test(rank: int, step: int | None, spec: str | None) -> None:
    """The test-hang hook (``debug.test_hang``, ``TSM_DS_TEST_HANG``; see the module docstring);
    nothing when ``spec`` is None."""
    if not spec or step is None:
        return
    parts = spec.split(":")
    if int(parts[0]) == rank and int(parts[1]) == step:
        time.sleep(float(parts[2]) if len(parts) > 2 else 3600.0)


def _write_json(path: Path, obj: dict, tag: str) -> None:
    """Write ``obj`` to ``path`` atomically (a temporary file of this writer, then ``os.replace``)."""
    tmp = path.with_name(f".{path.name}.{tag}.tmp")
    tmp.write_text(json.dumps(obj, indent=1))
    os.replace(tmp, path)


def _progress_key(record: dict) -> tuple[int, int]:
    """How far a rank got: (last optimizer step, -1 before the first; beats), compared in that order."""
    step = record.get("step")
    return (-1 if step is None else int(step), int(record.get("beats") or 0))


def _ranks(ks) -> str:
    ks = list(ks)
    return f"rank {ks[0]}" if len(ks) == 1 else "ranks " + ", ".join(map(str, ks))


def _since(record: dict) -> str:
    """``record``'s last progress in words: "step 4", "eval after step 4", "start-up (no beat yet)"."""
    last, step = record.get("last_progress") or "start", record.get("step")
    if last == "start":
        return "start-up (no beat yet)"
    if last.startswith("step") or step is None:
        return last
    return f"{last} after step {step}"


def _summary(report: dict) -> str:
    """The report's one line (see the module docstring)."""
    recs, stalled, waited = report["ranks"], report["stalled_ranks"], report["waited_ranks"]
    unknown, first = report["unknown_ranks"], report.get("first_fired") or {}
    parts = []
    if unknown:
        parts.append(f"{_ranks(unknown)} left no progress record (the likeliest culprit: a thread holding the GIL, "
                     f"see {'its' if len(unknown) == 1 else 'their'} stderr, or the process is gone)")
    if stalled:
        rec = recs[str(stalled[0])]
        since = f"{_since(rec)} (last beat {_secs(float(rec.get('idle_s') or 0))} s before its watchdog fired)"
        if waited:
            parts.append(f"{_ranks(stalled)} made no progress since {since}; {_ranks(waited)} waited for "
                         f"{'it' if len(stalled) == 1 else 'them'}")
        elif len(stalled) > 1:
            parts.append(f"{_ranks(stalled)} all stopped at the same progress, {since}: their stacks tell which "
                         f"one hangs")
        else:
            parts.append(f"{_ranks(stalled)} made no progress since {since}")
    if first:
        parts.append(f"rank {first.get('rank')} ({first.get('host')}) fired first")
    return "; ".join(parts)


class Watchdog(TrainHook):
    """Per-rank hang watchdog (see the module docstring).

    Args:
        run_dir: the run folder (shared by all ranks); stacks go to ``<run_dir>/stacks``.
        rank: this rank (names the stacks file).
        world_size: the number of ranks, whose progress records the report waits for (None: unknown;
            every rank then waits the whole ``grace`` and the report lists no ``unknown_ranks``).
        step_timeout: seconds allowed between two beats after the first optimizer step (<= 0: off).
        startup_timeout: seconds allowed from :meth:`start` to the end of the first optimizer
            step (<= 0: off).
        poll: seconds between two checks of the clock and of ``hang.json``.
        grace: seconds a rank that fired waits, at most, for the peers' progress records (and so
            their stacks) before writing the report and exiting (default 3 polls + 2 s).
        exit: ``os._exit``-like function called with :data:`EXIT_HUNG` (tests replace it).

    Raises:
        ValueError: a negative ``poll`` or ``grace``.
    """

    def __init__(self, run_dir: str | os.PathLike, *, rank: int, world_size: int | None = None,
                 step_timeout: float = 1800.0, startup_timeout: float = 3600.0, poll: float = 1.0,
                 grace: float | None = None, exit=os._exit, test_hang: str | None = None):
        if poll <= 0 or (grace is not None and grace < 0):
            raise ValueError(f"watchdog: poll must be > 0 and grace >= 0, got {poll} and {grace}")
        self.dir = Path(run_dir) / "stacks"
        self.rank = int(rank)
        self.world_size = int(world_size) if world_size else None
        self.step_timeout, self.startup_timeout = float(step_timeout or 0), float(startup_timeout or 0)
        self.poll = poll
        self.grace = 3 * poll + 2.0 if grace is None else grace
        self._exit = exit
        self.test_hang = test_hang   # test hook "<rank>:<step>[:<seconds>]" (see the module docstring)
        self.phase = "start-up"
        self.last_what = "start"
        self.step: int | None = None   # the last optimizer step reported
        self.beats = 0
        self._last = self._started = time.monotonic()
        self._started_wall = time.time()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.fired: str | None = None   # the reason, once fired
        self.report: dict | None = None   # the hang report, once written

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

    # ---- the trainer's hook interface (tsm_ds.engine.loop.hooks): start at set-up, beat on progress
    def on_setup_start(self, run_dir) -> None:
        """Start the start-up clock before set-up (op builds, ``deepspeed.initialize``, resume)."""
        self.dir = Path(run_dir) / "stacks"
        self.start()

    def on_setup_end(self, rank: int, world: int) -> None:
        """The rank and world size as the process group knows them (MPI launches set no ``$RANK``)."""
        self.rank, self.world_size = int(rank), int(world) or self.world_size

    def on_step(self, step: int, info: dict) -> None:
        """An optimizer step is progress."""
        self.beat("step", step)

    def on_progress(self, what: str) -> None:
        """An evaluation batch or a checkpoint write is progress."""
        self.beat(what)

    def on_end(self) -> None:
        """The run returned or raised (or its set-up failed): stop watching."""
        self.stop()

    def beat(self, what: str, step: int | None = None) -> None:
        """Report progress: ``what`` is ``"step"`` (an optimizer step, ``step`` its number; the first
        one ends the start-up phase), ``"eval"`` or ``"checkpoint"``. Nothing is written."""
        _sleep_for_test(self.rank, step if what == "step" else None, self.test_hang)
        self._last = time.monotonic()
        self.beats += 1
        if what == "step":
            self.phase = "training"
            if step is not None:
                self.step = int(step)
        self.last_what = what if step is None else f"{what} {step}"
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

    def progress(self, *, followed: int | None = None) -> dict:
        """This rank's progress record (step 3 of the module docstring), as of now."""
        now, idle = time.time(), time.monotonic() - self._last
        return {"rank": self.rank, "host": socket.gethostname(), "pid": os.getpid(), "step": self.step,
                "beats": self.beats, "last_progress": self.last_what, "phase": self.phase,
                "last_beat_time": round(now - idle, 3), "idle_s": round(idle, 3), "followed": followed,
                "reason": self.fired, "time": round(now, 3)}

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

    def _fresh(self, f: Path) -> bool:
        """``f`` was written after this rank started (not left by an earlier hang of this run dir)."""
        return f.stat().st_mtime >= self._started_wall - 1.0

    def _peer_fired(self) -> dict | None:
        """``hang.json`` of this hang (the trigger or the report), None when absent or stale."""
        f = self.dir / TRIGGER
        try:
            if not self._fresh(f):
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
                ff = peer.get("first_fired") or {}
                self._fire(f"rank {ff.get('rank')} ({ff.get('host')}) found no progress: {ff.get('reason')}; "
                           f"this rank's last progress: {self.last_what}, {_secs(idle)} s ago", first=False,
                           followed=ff.get("rank"))
                return

    def _fire(self, reason: str, *, first: bool, followed: int | None = None) -> None:
        self.fired = reason
        faulthandler.cancel_dump_traceback_later()
        record = self.progress(followed=followed)   # before the stack dump: idle_s as of the firing
        out = self.dir / f"rank{self.rank}.txt"
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            with open(out, "w") as fh:
                fh.write(f"rank {self.rank}, host {socket.gethostname()}, pid {os.getpid()}, "
                         f"{time.strftime('%Y-%m-%d %H:%M:%S')}: watchdog: {reason}\n"
                         f"progress: last optimizer step {'none yet' if self.step is None else self.step}, "
                         f"beat count {self.beats}; the hang report "
                         f"({TRIGGER}) compares the ranks' progress\n"
                         f"Python stacks of every thread (most recent call first):\n\n")
                fh.flush()
                faulthandler.dump_traceback(file=fh, all_threads=True)
        except OSError as e:   # the run dir is gone or full: the stacks go to stderr instead
            log.error("watchdog: cannot write %s (%s); stacks follow on stderr", out, e)
            faulthandler.dump_traceback(file=sys.__stderr__, all_threads=True)
        try:
            if first:
                self._write_trigger(reason)
            _write_json(self.dir / RECORD.format(self.rank), record, f"rank{self.rank}")
        except OSError as e:
            log.error("watchdog: cannot write %s or this rank's progress record (%s)", self.dir / TRIGGER, e)
        log.error("watchdog (rank %d): %s; Python stacks of every thread written to %s; exiting with status %d "
                  "once the other ranks' progress records are in (%s s at most)",
                  self.rank, reason, out, EXIT_HUNG, _secs(self.grace))
        self._release_shm()   # before the wait: the launcher may kill this rank once a peer exits
        self._flush_logs()
        self.report = self._write_report()
        log.error("watchdog (rank %d): hang report %s: %s", self.rank, self.dir / TRIGGER,
                  self.report.get("summary") if self.report else "not written")
        self._flush_logs()
        self._exit(EXIT_HUNG)

    @staticmethod
    def _flush_logs() -> None:
        for h in logging.getLogger().handlers + log.handlers:
            try:
                h.flush()
            except Exception:
                pass

    def _write_trigger(self, reason: str) -> None:
        payload = json.dumps({"first_fired": {"rank": self.rank, "host": socket.gethostname(), "pid": os.getpid(),
                                              "reason": reason, "time": round(time.time(), 3)},
                              "stalled_ranks": None})
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

    def _records(self) -> dict[int, dict]:
        """The progress records of this hang in ``stacks/`` (by rank)."""
        recs: dict[int, dict] = {}
        try:
            files = list(self.dir.glob(RECORD.format("*")))
        except OSError:
            return recs
        for f in files:
            try:
                if not self._fresh(f):
                    continue
                rec = json.loads(f.read_text())
                k = int(rec["rank"])
            except (OSError, ValueError, KeyError, TypeError):   # stale, half-visible on a network FS, foreign
                continue
            if self.world_size is None or 0 <= k < self.world_size:
                recs[k] = rec
        return recs

    def _write_report(self) -> dict | None:
        """Wait up to ``grace`` for every rank's record, then rewrite ``hang.json`` as the report (kept
        when the one there already has more records); returns the report in ``hang.json``."""
        deadline = time.monotonic() + self.grace
        while True:
            recs = self._records()
            if (self.world_size is not None and len(recs) >= self.world_size) or time.monotonic() >= deadline:
                break
            time.sleep(min(self.poll, 0.1))
        there = self._peer_fired() or {}
        if len(there.get("ranks") or {}) > len(recs):   # a peer that waited longer saw more
            return there
        world = self.world_size
        low = min(map(_progress_key, recs.values()), default=None)
        stalled = sorted(k for k, r in recs.items() if _progress_key(r) == low)
        report = {"stalled_ranks": stalled,
                  "stalled_step": recs[stalled[0]].get("step") if stalled else None,
                  "stalled_since": _since(recs[stalled[0]]) if stalled else None,
                  "waited_ranks": sorted(k for k in recs if k not in stalled),
                  "unknown_ranks": sorted(set(range(world)) - set(recs)) if world else [],
                  "first_fired": there.get("first_fired"),
                  "world_size": world, "time": round(time.time(), 3),
                  "ranks": {str(k): recs[k] for k in sorted(recs)}}
        report["summary"] = _summary(report)
        try:
            _write_json(self.dir / TRIGGER, report, f"report.rank{self.rank}")
        except OSError as e:
            log.error("watchdog: cannot write the hang report %s (%s)", self.dir / TRIGGER, e)
        return report

    @staticmethod
    def _release_shm() -> None:
        """Unlink this rank's DeepSpeed CPU all-reduce buffer (``os._exit`` skips ``atexit``)."""
        try:
            from tsm_ds.engine.comm.dist import release_cpu_shm_now
            release_cpu_shm_now()
        except Exception:   # exiting anyway: the buffer is only RAM to give back
            pass
