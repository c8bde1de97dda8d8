"""manifest.json: every unit of work (key, stage, status, attempts, error, output files), atomic.

A unit is done when it is recorded done and its files are there; a Parquet file it lists must
also read back (its footer) with the row count recorded in ``file_rows``, else the unit is redone.

lease.json, next to it: which driver owns the output now (one at a time, see :class:`Lease`).
"""
from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from drafters.atomic import write_text_atomic

from . import storage

STAGES = ("features", "train", "merge", "eval", "report")


def parquet_rows(path: str | os.PathLike) -> int | None:
    """Rows of a Parquet file from its footer (cheap); None if it is missing or does not read back."""
    try:
        return pq.read_metadata(path).num_rows
    except (OSError, pa.ArrowException):
        return None


class Manifest:
    """``present``: for a run whose artifacts live at a URI, the files known to exist there (one
    listing at start, plus every file recorded since); None checks the manifest's own directory.
    Parquet files are read back only in the second case: at a URI objects are published whole
    (a single or multipart upload completes or leaves nothing), and reading every footer there
    would cost requests per unit on each resume."""

    def __init__(self, path: str | os.PathLike, present: set[str] | None = None):
        self.path = Path(path)
        self._lock = threading.Lock()
        self.present = present
        try:
            self.data = json.loads(self.path.read_text()) if self.path.is_file() else {"cells": {}}
        except ValueError as e:
            raise ValueError(f"{self.path} is not a manifest (not valid JSON: {e}); move it away to start "
                             f"the run afresh") from e
        self.recorded: dict[str, int] = {}  # units recorded done by this process, per stage

    def _exists(self, rel: str) -> bool:
        return rel in self.present if self.present is not None else Path(self.path.parent, rel).exists()

    def get(self, key: str) -> dict | None:
        return self.data["cells"].get(key)

    def done(self, key: str) -> bool:
        c = self.get(key)
        if not (c and c["status"] == "done" and all(self._exists(f) for f in c.get("files", []))):
            return False
        return self.present is not None or self._reads_back(c)

    def _reads_back(self, c: dict) -> bool:
        """Every Parquet file of a done unit has a readable footer and the rows recorded for it
        (``file_rows``; records made before it existed only need the footer)."""
        expected = c.get("file_rows", {})
        for f in c.get("files", []):
            if not f.endswith(".parquet"):
                continue
            n = parquet_rows(Path(self.path.parent, f))
            if n is None or (f in expected and n != expected[f]):
                got = "does not read back" if n is None else f"has {n} rows"
                want = f", expected {expected[f]}" if n is not None else ""
                print(f"[manifest] {c['name']}: {f} {got}{want}; redoing the unit", file=sys.stderr, flush=True)
                return False
        return True

    def record(self, key: str, stage: str, name: str, status: str, attempts: int = 1, error: str | None = None,
               files: list[str] = (), **extra) -> None:
        with self._lock:
            if self.present is not None:  # recorded only once published
                self.present.update(files)
            self.data["cells"][key] = {"stage": stage, "name": name, "status": status, "attempts": attempts,
                                       "error": error, "files": list(files), **extra}
            if status == "done":
                self.recorded[stage] = self.recorded.get(stage, 0) + 1
            self._flush()

    def record_stage(self, stage: str, seconds: float, units_run: int, machine: str) -> None:
        """A stage's wall time in this invocation, kept only when it ran units (a resume that
        found everything done leaves the earlier timing): what orchestrator/rates.py measures."""
        if units_run < 1:
            return
        with self._lock:
            self.data.setdefault("stages", {})[stage] = {"seconds": seconds, "units_run": units_run, "machine": machine}
            self._flush()

    def set_plan(self, stage: str, keys) -> None:
        """The unit keys ``stage`` has under this invocation's configuration. Records of an earlier
        configuration (a retrained drafter gives its cells new eval keys) stay, files and all, but
        what reads the run (the report, rates) takes only the planned units' files."""
        with self._lock:
            self.data.setdefault("plan", {})[stage] = sorted(set(keys))
            self._flush()

    def forget_from(self, stage: str) -> int:
        """--force STAGE: drop that stage's records and every later stage's."""
        later = set(STAGES[STAGES.index(stage):])
        with self._lock:
            drop = [k for k, c in self.data["cells"].items() if c["stage"] in later]
            for k in drop:
                del self.data["cells"][k]
            self._flush()
        return len(drop)

    def cells(self, stage: str | None = None) -> dict:
        return {k: c for k, c in self.data["cells"].items() if stage is None or c["stage"] == stage}

    def _flush(self) -> None:
        write_text_atomic(self.path, json.dumps(self.data, indent=1, sort_keys=True))


class LeaseHeld(PermissionError):
    """Another live driver holds the output's lease (the message is one line)."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _read_id(path: str) -> str:
    try:
        return os.readlink(path) if os.path.islink(path) else Path(path).read_text().strip()
    except OSError:
        return ""


def pid_space() -> str:
    """Where this process's PID means something: the kernel boot (``boot_id``, shared by every
    container of one machine) and the PID namespace (one per container unless it shares the
    host's). Two processes with the same value can compare PIDs; hostnames cannot tell that
    (containers on the host network share the host's name, each with its own PIDs). '' where
    /proc does not say (then no PID is ever compared, and only the TTL frees a lease)."""
    boot, ns = _read_id("/proc/sys/kernel/random/boot_id"), _read_id("/proc/self/ns/pid")
    return f"{boot}/{ns}" if boot and ns else ""


class Lease:
    """One driver per output. ``lease.json`` (a path or URI) names the holder (host, pid, its PID
    space, a random id), when it last renewed (``renewed``) and until when it holds (``expires`` =
    renewed + ``ttl``); the holder renews it every ``ttl / 4`` seconds from a daemon thread and
    deletes it on every way out (the end, an exception, Ctrl-C, SIGTERM via experiments/full_grid.py).

    Staleness, the rule a starting driver applies to a lease it finds:

    1. The holder is known dead only when it shares this process's PID space (same kernel boot
       and PID namespace, :func:`pid_space`) and its PID is not running (or is this very process):
       the same command rerun after a crash resumes at once. A PID is never compared across PID
       spaces: another container, even under the same hostname, may run that PID for itself.
    2. Otherwise the lease is stale only after a full ``ttl`` without a heartbeat (``expires`` in
       the past, by this machine's clock: hosts' clocks must agree to well within the TTL, as NTP
       keeps them).
    3. A live lease is refused (:class:`LeaseHeld`) unless ``take_over``.

    The holder fences itself: :meth:`check` (called before the driver writes shared state) raises
    once another driver holds the lease, and, when no heartbeat has landed for ``ttl / 2`` (the
    store unreachable, the process paused), confirms the lease synchronously before it lets the
    driver write, so a driver never writes after its lease could have expired in others' eyes.

    Object stores have no atomic create, so after writing, the lease is read back ``settle``
    seconds later: of two drivers starting together, the one whose write landed last keeps it and
    the other is refused."""

    def __init__(self, ref: str, ttl: float = 120, settle: float = 1.0):
        self.ref, self.ttl, self.settle = ref, ttl, settle
        self.me = {"host": socket.gethostname(), "pid": os.getpid(), "pid_space": pid_space(),
                   "id": uuid.uuid4().hex[:12]}
        self.lost: str | None = None  # set once another driver has taken the output over
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._confirmed = 0.0  # time.monotonic() of the last heartbeat that landed

    def _read(self) -> dict | None:
        text = storage.read_text(self.ref)
        try:
            return json.loads(text) if text else None
        except ValueError:  # a torn local write cannot happen (atomic); treat junk as no lease
            return None

    def _write(self) -> None:
        now = time.time()
        storage.write_text(self.ref, json.dumps({**self.me, "renewed": now, "expires": now + self.ttl}))
        self._confirmed = time.monotonic()

    def _stale(self, held: dict) -> str | None:
        """Why ``held`` may be taken without asking, or None while its driver may be running (the
        rule in the class docstring)."""
        space, pid = self.me["pid_space"], held["pid"]
        if space and held.get("pid_space") == space and (pid == self.me["pid"] or not _alive(pid)):
            return "its process has exited" if pid != self.me["pid"] else "same process"
        if held["expires"] < time.time():
            return f"no heartbeat for the full TTL; it expired {time.time() - held['expires']:.0f}s ago"
        return None

    @staticmethod
    def _who(held: dict) -> str:
        return f"driver pid {held['pid']} on {held['host']}"

    def acquire(self, take_over: bool = False) -> str | None:
        """Take the lease and start renewing it; returns a note when a stale or live lease was
        taken over. Raises :class:`LeaseHeld` (one line) while another driver holds it. Whatever
        interrupts it once the lease is written (KeyboardInterrupt in the settle) removes it again."""
        held, note, out = self._read(), None, self.ref.removesuffix("/lease.json")
        if held and held.get("id") != self.me["id"]:
            why = self._stale(held)
            if why is None and not take_over:
                left = held["expires"] - time.time()
                raise LeaseHeld(f"output {out} is in use by {self._who(held)} (its lease expires in "
                                f"{left:.0f}s unless renewed); wait for it to finish, or if it is gone rerun "
                                f"with --take-over")
            note = f"took over the lease of {self._who(held)} ({why or '--take-over'})"
        try:
            self._write()
            time.sleep(self.settle)
            now = self._read()
            if not now or now.get("id") != self.me["id"]:
                who = self._who(now) if now else "another driver"
                self.lost = f"output {out} was taken by {who}, which started at the same time"
                raise LeaseHeld(self.lost)
        except BaseException:
            self.release()
            raise
        self._thread = threading.Thread(target=self._renew, name="taskspec-lease", daemon=True)
        self._thread.start()
        return note

    def _beat(self) -> None:
        """One heartbeat: read the lease, and renew it if it is still this driver's (else ``lost``)."""
        held = self._read()
        if not held or held.get("id") != self.me["id"]:  # taken over, or the output was removed
            who = self._who(held) if held else "someone (lease deleted)"
            self.lost = f"the lease on {self.ref} was taken by {who}: this driver stops"
            print(f"[lease] {self.lost}", file=sys.stderr, flush=True)
            return
        self._write()

    def _renew(self) -> None:
        while not self._stop.wait(self.ttl / 4) and not self.lost:
            try:
                self._beat()
            except OSError as e:  # the store is unreachable for a moment: the next beat retries
                print(f"[lease] renewing {self.ref} failed: {e}", file=sys.stderr, flush=True)

    def check(self) -> None:
        """Raise if another driver has taken the output over, or if the lease cannot be confirmed
        after ``ttl / 2`` without a heartbeat (call before writing shared state)."""
        if not self.lost and time.monotonic() - self._confirmed > self.ttl / 2:
            silent = time.monotonic() - self._confirmed
            try:
                self._beat()
            except OSError as e:
                self.lost = (f"the lease on {self.ref} was not renewed for {silent:.0f}s ({e}); another driver "
                             f"may hold it after {self.ttl:.0f}s: this driver stops")
        if self.lost:
            raise LeaseHeld(self.lost)

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=30)  # a heartbeat in flight lands before the lease is removed
        try:
            if not self.lost and (self._read() or {}).get("id") == self.me["id"]:
                storage.remove(self.ref)
        except OSError as e:  # it expires by itself
            print(f"[lease] releasing {self.ref} failed ({e}); it expires in {self.ttl:.0f}s", file=sys.stderr)
