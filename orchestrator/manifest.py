"""The manifest: every unit of work (key, stage, status, attempts, error, output files), crash-safe.

A unit is done when it is recorded done and its files are there; a Parquet file it lists must
also read back (its footer) with the row count recorded in ``file_rows``, else the unit is redone.

Two files hold it. ``manifest.json`` is a snapshot (the whole state, as runs before the journal
wrote it, plus its ``generation``); ``manifest.jsonl``, the journal, holds what was recorded since:
one JSON line per change, appended and fsync'd, so recording a unit costs one short write whatever
the run's size (rewriting the whole JSON per record made a run quadratic: ~48k records at the
paper's size). The state is the snapshot with the journal's lines applied in order. Compaction
folds the journal into a new snapshot (temp file, fsync, rename) and starts the next journal (the
same way), once the journal holds as many lines as the snapshot has units (at least COMPACT_MIN: the
snapshots grow geometrically, so a record costs O(1) amortized), when the driver publishes the
manifest, and on ``close``. Crash safety:

- a line counts only when it is complete: a torn last line (a crash mid-append) is ignored with a
  warning, and cut off before the next append;
- the journal's first line names the snapshot it extends (``{"base": generation}``): after a crash
  between compaction's rename of the snapshot and the journal's reset, the journal's base is the
  snapshot's generation - 1, so its lines (already in the snapshot) are skipped; a journal of any
  other base is not this snapshot's (e.g. a local one beside a manifest fetched from a URI) and is
  ignored with a warning;
- a crash before compaction's rename leaves the old snapshot and its journal, which still hold
  every record (a stray temp file is ignored);
- a manifest.json written before the journal existed reads as generation 0, its units as they were.

Readers outside this class read the state with :func:`read_manifest`; after a driver's stage (and at
its end) manifest.json alone holds everything. With a URI output the journal stays on the driver's
disk: the driver compacts, then uploads manifest.json (object stores have no append), as before
at most every MANIFEST_SYNC_S seconds during evaluation and after every stage (docs/cluster.md).

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

from common import storage

STAGES = ("features", "train", "merge", "eval", "report")
COMPACT_MIN = 1000  # journal lines before compaction may run (then: as many lines as the snapshot has units)


def parquet_rows(path: str | os.PathLike) -> int | None:
    """Rows of a Parquet file from its footer (cheap); None if it is missing or does not read back."""
    try:
        return pq.read_metadata(path).num_rows
    except (OSError, pa.ArrowException):
        return None


def journal_path(path: str | os.PathLike) -> Path:
    """The journal beside a manifest.json: manifest.jsonl."""
    path = Path(path)
    return path.with_name(path.stem + ".jsonl")


def _warn(msg: str) -> None:
    print(f"[manifest] {msg}", file=sys.stderr, flush=True)


def _write_durable(path: Path, text: str) -> None:
    """Write ``text`` to a temp file beside ``path``, fsync it, rename it over ``path``, fsync the
    directory: after a crash ``path`` is the old file or the new one, never a part."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _apply(data: dict, op: dict) -> None:
    """One journal line applied to the state (the changes Manifest records)."""
    kind = op["op"]
    if kind == "record":
        data["cells"][op["key"]] = op["cell"]
    elif kind == "stage":
        data.setdefault("stages", {})[op["stage"]] = op["value"]
    elif kind == "plan":
        data.setdefault("plan", {})[op["stage"]] = op["keys"]
    elif kind == "forget":
        later = set(op["stages"])
        data["cells"] = {k: c for k, c in data["cells"].items() if c["stage"] not in later}
    else:
        raise ValueError(f"unknown journal operation {kind!r}")


def _read_journal(path: Path, warn: bool = True) -> tuple[int | None, list[dict], int]:
    """(base generation, the operations of its complete lines, bytes of those lines) of a journal;
    (None, [], 0) without one. A line counts only when complete (newline-terminated JSON): a torn
    last line is ignored with a warning; a broken line before the last is an error."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None, [], 0
    body, newline, tail = raw.rpartition(b"\n")
    lines = body.split(b"\n") if newline else []
    ops, good = [], 0
    for i, line in enumerate(lines):
        try:
            ops.append(json.loads(line))
        except ValueError as e:
            if i < len(lines) - 1:
                raise ValueError(f"{path} line {i + 1} is not a journal line ({e}); move {path.name} away to "
                                 f"read the run as of manifest.json") from e
            tail = line
            break
        good += len(line) + 1
    if tail and warn:
        _warn(f"{path}: its last line is incomplete ({len(tail)} bytes, an append cut off by a crash): "
              "ignored")
    if not ops:
        return None, [], good
    return int(ops[0].get("base", -1)), ops[1:], good


def load_state(path: str | os.PathLike) -> tuple[dict, int, int, int]:
    """(state, snapshot generation, journal lines applied, the snapshot's units) of the manifest at
    ``path``."""
    path = Path(path)
    for _ in range(5):  # a snapshot replaced between the two reads (a compaction): read both again
        try:
            data = json.loads(path.read_text()) if path.is_file() else {"cells": {}}
        except ValueError as e:
            raise ValueError(f"{path} is not a manifest (not valid JSON: {e}); move it away to start "
                             f"the run afresh") from e
        gen = int(data.pop("generation", 0))
        base, ops, _ = _read_journal(journal_path(path))
        if base is None or base <= gen:
            break
    units = len(data["cells"])
    if base is None or base == gen - 1:  # no journal, or one the snapshot already holds
        return data, gen, 0, units
    if base != gen:
        _warn(f"{journal_path(path)} extends generation {base}, not {path.name}'s {gen}: ignored")
        return data, gen, 0, units
    for op in ops:
        _apply(data, op)
    return data, gen, len(ops), units


def read_manifest(path: str | os.PathLike) -> dict | None:
    """The state of the manifest at ``path`` (snapshot and journal), None if it has neither."""
    path = Path(path)
    if not path.is_file() and not journal_path(path).is_file():
        return None
    return load_state(path)[0]


class Manifest:
    """``present``: for a run whose artifacts live at a URI, the files known to exist there (one
    listing at start, plus every file recorded since); None checks the manifest's own directory.
    Parquet files are read back only in the second case: at a URI objects are published whole
    (a single or multipart upload completes or leaves nothing), and reading every footer there
    would cost requests per unit on each resume. One process writes a manifest (the lease)."""

    def __init__(self, path: str | os.PathLike, present: set[str] | None = None):
        self.path = Path(path)
        self.journal = journal_path(self.path)
        self._lock = threading.Lock()
        self.present = present
        # _lines: the journal's changes; _units: the snapshot's units (compaction when _lines reaches it)
        self.data, self._gen, self._lines, self._units = load_state(self.path)
        self._fd: int | None = None  # the journal, opened for appending at the first change
        self.recorded: dict[str, int] = {}  # units recorded done by this process, per stage

    @staticmethod
    def remove(path: str | os.PathLike) -> None:
        """Delete the manifest at ``path``: its snapshot and its journal."""
        Path(path).unlink(missing_ok=True)
        journal_path(path).unlink(missing_ok=True)

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
                _warn(f"{c['name']}: {f} {got}{want}; redoing the unit")
                return False
        return True

    def record(self, key: str, stage: str, name: str, status: str, attempts: int = 1,
               error: str | None = None,
               files: list[str] = (), **extra) -> None:
        with self._lock:
            if self.present is not None:  # recorded only once published
                self.present.update(files)
            cell = {"stage": stage, "name": name, "status": status, "attempts": attempts, "error": error,
                    "files": list(files), **extra}
            if status == "done":
                self.recorded[stage] = self.recorded.get(stage, 0) + 1
            self._change({"op": "record", "key": key, "cell": cell})

    def record_stage(self, stage: str, seconds: float, units_run: int, machine: str,
                     overlapped: bool = False) -> None:
        """A stage's wall time in this invocation, kept only when it ran units (a resume that
        found everything done leaves the earlier timing): what orchestrator/plan/rates/measured.py measures.
        ``overlapped``: the span of a stage that ran beside others (cluster.schedule graph), which
        measures no rate."""
        if units_run < 1:
            return
        with self._lock:
            value = {"seconds": seconds, "units_run": units_run, "machine": machine}
            if overlapped:
                value["overlapped"] = True
            self._change({"op": "stage", "stage": stage, "value": value})

    def set_plan(self, stage: str, keys) -> None:
        """The unit keys ``stage`` has under this invocation's configuration. Records of an earlier
        configuration (a retrained drafter gives its cells new eval keys) stay, files and all, but
        what reads the run (the report, rates) takes only the planned units' files."""
        with self._lock:
            self._change({"op": "plan", "stage": stage, "keys": sorted(set(keys))})

    def forget_from(self, stage: str) -> int:
        """--force STAGE: drop that stage's records and every later stage's."""
        later = list(STAGES[STAGES.index(stage):])
        with self._lock:
            n = sum(c["stage"] in later for c in self.data["cells"].values())
            self._change({"op": "forget", "stages": later})
        return n

    def cells(self, stage: str | None = None) -> dict:
        return {k: c for k, c in self.data["cells"].items() if stage is None or c["stage"] == stage}

    def _change(self, op: dict) -> None:
        """Append ``op`` to the journal (fsync'd), then apply it (under the lock); compact once the
        journal is as long as the snapshot. A change that changes nothing (the same plan again) is
        not written."""
        if self._unchanged(op):
            return
        if self._fd is None:
            self._open_journal()
        line = (json.dumps(op, sort_keys=True) + "\n").encode()
        while line:  # one write for a line of any usual size (O_APPEND)
            line = line[os.write(self._fd, line):]
        os.fsync(self._fd)
        _apply(self.data, op)
        self._lines += 1
        # a snapshot's size of lines: O(1) a record, amortized
        if self._lines >= max(COMPACT_MIN, self._units):
            self._compact()

    def _unchanged(self, op: dict) -> bool:
        k = op["op"]
        if k == "record":
            return self.data["cells"].get(op["key"]) == op["cell"]
        if k == "stage":
            return self.data.get("stages", {}).get(op["stage"]) == op["value"]
        if k == "plan":
            return self.data.get("plan", {}).get(op["stage"]) == op["keys"]
        return False

    def _open_journal(self) -> None:
        """Open the journal for appending: this snapshot's journal as it is (a torn last line cut
        off), else a new one naming the snapshot's generation."""
        base, _, good = _read_journal(self.journal, warn=False)  # (said when it was loaded)
        if base == self._gen and self.journal.is_file():
            if good < self.journal.stat().st_size:
                os.truncate(self.journal, good)
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            _write_durable(self.journal, json.dumps({"base": self._gen}) + "\n")
            self._lines = 0
        self._fd = os.open(self.journal, os.O_WRONLY | os.O_APPEND)

    def compact(self) -> None:
        """Fold the journal into manifest.json (nothing to do when the journal is empty)."""
        with self._lock:
            if self._lines:
                self._compact()

    close = compact

    def _compact(self) -> None:
        """A new snapshot (generation + 1), then a new journal naming it (module docstring: a crash
        between the two leaves a journal the snapshot already holds, which readers skip)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        snapshot = {**self.data, "generation": self._gen + 1}
        _write_durable(self.path, json.dumps(snapshot, indent=1, sort_keys=True))
        self._gen, self._units = self._gen + 1, len(self.data["cells"])
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        _write_durable(self.journal, json.dumps({"base": self._gen}) + "\n")
        self._lines = 0
        self._fd = os.open(self.journal, os.O_WRONLY | os.O_APPEND)

    def __del__(self):
        if getattr(self, "_fd", None) is not None:
            os.close(self._fd)


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
        self.ref = ref
        self.ttl = ttl
        self.settle = settle
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
        held = self._read()
        note = None
        out = self.ref.removesuffix("/lease.json")
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
                self.lost = (f"the lease on {self.ref} was not renewed for {silent:.0f}s ({e}); another "
                             "driver "
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
            print(f"[lease] releasing {self.ref} failed ({e}); it expires in {self.ttl:.0f}s",
                  file=sys.stderr)
