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


class Lease:
    """One driver per output. ``lease.json`` (a path or URI) names the holder (host, pid, a
    random id) and when the lease expires; the holder renews it every ``ttl / 4`` seconds from a
    daemon thread and deletes it at the end. A lease is stale once it has expired, or at once when
    its holder was a process of this host that has exited (a killed driver's same command resumes
    without waiting); a live one is refused unless ``take_over``. Object stores have no atomic
    create, so after writing, the lease is read back ``settle`` seconds later: of two drivers
    starting together, the one whose write landed last keeps it and the other is refused."""

    def __init__(self, ref: str, ttl: float = 120, settle: float = 1.0):
        self.ref, self.ttl, self.settle = ref, ttl, settle
        self.me = {"host": socket.gethostname(), "pid": os.getpid(), "id": uuid.uuid4().hex[:12]}
        self.lost: str | None = None  # set once another driver has taken the output over
        self._stop = threading.Event()

    def _read(self) -> dict | None:
        text = storage.read_text(self.ref)
        try:
            return json.loads(text) if text else None
        except ValueError:  # a torn local write cannot happen (atomic); treat junk as no lease
            return None

    def _write(self) -> None:
        now = time.time()
        storage.write_text(self.ref, json.dumps({**self.me, "renewed": now, "expires": now + self.ttl}))

    def _stale(self, held: dict) -> str | None:
        """Why ``held`` may be taken without asking, or None while its driver may be running."""
        if held["expires"] < time.time():
            return f"it expired {time.time() - held['expires']:.0f}s ago"
        if held["host"] == self.me["host"] and (held["pid"] == self.me["pid"] or not _alive(held["pid"])):
            return "its process has exited" if held["pid"] != self.me["pid"] else "same process"
        return None

    def acquire(self, take_over: bool = False) -> str | None:
        """Take the lease and start renewing it; returns a note when a stale or live lease was
        taken over. Raises :class:`LeaseHeld` (one line) while another driver holds it."""
        held, note, out = self._read(), None, self.ref.removesuffix("/lease.json")
        if held and held.get("id") != self.me["id"]:
            who = f"driver pid {held['pid']} on {held['host']}"
            why = self._stale(held)
            if why is None and not take_over:
                left = held["expires"] - time.time()
                raise LeaseHeld(f"output {out} is in use by {who} (its lease expires in {left:.0f}s unless "
                                f"renewed); wait for it to finish, or if it is gone rerun with --take-over")
            note = f"took over the lease of {who} ({why or '--take-over'})"
        self._write()
        time.sleep(self.settle)
        now = self._read()
        if not now or now.get("id") != self.me["id"]:
            who = f"driver pid {now['pid']} on {now['host']}" if now else "another driver"
            raise LeaseHeld(f"output {out} was taken by {who}, which started at the same time")
        threading.Thread(target=self._renew, name="taskspec-lease", daemon=True).start()
        return note

    def _renew(self) -> None:
        while not self._stop.wait(self.ttl / 4):
            try:
                held = self._read()
                if not held or held.get("id") != self.me["id"]:  # taken over, or the output was removed
                    who = f"driver pid {held['pid']} on {held['host']}" if held else "someone (lease deleted)"
                    self.lost = f"the lease on {self.ref} was taken by {who}: this driver stops"
                    print(f"[lease] {self.lost}", file=sys.stderr, flush=True)
                    return
                self._write()
            except OSError as e:  # the store is unreachable for a moment: the next beat retries
                print(f"[lease] renewing {self.ref} failed: {e}", file=sys.stderr, flush=True)

    def check(self) -> None:
        """Raise if another driver has taken the output over (call before writing shared state)."""
        if self.lost:
            raise LeaseHeld(self.lost)

    def release(self) -> None:
        self._stop.set()
        try:
            if not self.lost and (self._read() or {}).get("id") == self.me["id"]:
                storage.remove(self.ref)
        except OSError as e:  # it expires by itself
            print(f"[lease] releasing {self.ref} failed ({e}); it expires in {self.ttl:.0f}s", file=sys.stderr)
