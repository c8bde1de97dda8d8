"""Feature shards a node downloads for its training ranks, within a byte budget on its disk.

A rank reads a cache at a URI through :class:`ShardCache` (drafters.features.reading_through):
each shard it opens is downloaded into the node cache (``storage.node_cache``: the mirror of the
URI, where the cache's manifest already is) unless it is there, and held while it is read. Only
the shards a rank opens are downloaded: its own (drafters/train/shards.py), and rank 0's held-out sets;
and of each only the tensors its backbone reads (``tensors``: EAGLE-2 and HASS skip EAGLE-3's aux
layers, workers/shard_fetch.py), kept as a smaller file beside the whole one.

**Read-ahead.** A rank announces the order in which it will open its shards this epoch
(``expect``, from drafters/train/data.py); a pool of ``streams`` threads then fetches the shard
about to be read and the ``read_ahead`` after it while the rank trains, and each ``open`` moves the
window on. A shard fetched ahead is *reserved* for its rank (a shared ``flock`` on
``<key>.ahead``) until the rank opens it. ``TASKSPEC_SHARD_READ_AHEAD`` (0: none, every download
on the critical path) and ``TASKSPEC_SHARD_STREAMS`` set them per node.

**The budget.** Before a download, least recently used shards are deleted until the new one fits,
never one being read (a shared ``flock`` on ``<key>.lock``, whose mtime is its last use). A
prefetch takes only room that is free or held by shards no one reads or reserved, and is skipped
(retried as the rank moves on; the rank downloads it itself if it gets there first) when there is
none: prefetching never takes the node over its budget. A rank's own download may also delete
shards reserved by read-ahead (then fetched again when their rank gets to them), and goes over the
budget only when the shards being read fill it (the budget must hold one shard per reader).
Downloads in flight count at their full size from the moment they start (``<key>.pending``, under
``node.lock``, which is held only while room is made); each goes to a temp file renamed when
complete, so no reader sees half a shard. Two ranks never download one shard twice (a
``<key>.fetch`` lock per shard); different shards download in parallel. A rank's share that fits
the budget stays on disk across epochs (nothing is evicted while there is room). Every rank and
trial on the node shares the cache (one ``TASKSPEC_STAGING``). Each download is a line of
``downloads.jsonl`` (rank, shard, tensors, bytes, the node's shard bytes after it, prefetched or not).

The budget: ``TASKSPEC_FEATURE_CACHE_GB`` in the node's (or the job's) environment, default
``DEFAULT_GB``. A budget that cannot hold the largest shard is refused when the first is opened.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from common import storage
from common.atomic import write_text_atomic
from workers import shard_fetch
from workers.shard_order import ShardOrder

ENV = "TASKSPEC_FEATURE_CACHE_GB"
DEFAULT_GB = 100.0
READ_AHEAD_ENV, DEFAULT_READ_AHEAD = "TASKSPEC_SHARD_READ_AHEAD", 4
STREAMS_ENV, DEFAULT_STREAMS = "TASKSPEC_SHARD_STREAMS", 4


def budget_bytes(env: dict | None = None) -> int:
    """The node's shard budget in bytes, from ``TASKSPEC_FEATURE_CACHE_GB`` (one line if malformed)."""
    raw = (os.environ if env is None else env).get(ENV)
    try:
        gb = DEFAULT_GB if raw in (None, "") else float(raw)
    except ValueError:
        raise ValueError(f"{ENV}={raw!r} is not a number of GB") from None
    if not gb > 0:
        raise ValueError(f"{ENV} must be > 0 GB, got {raw!r}")
    return int(gb * 2**30)


def read_ahead_settings(env: dict | None = None) -> tuple[int, int]:
    """(read_ahead >= 0, streams >= 1) from ``TASKSPEC_SHARD_READ_AHEAD`` and ``TASKSPEC_SHARD_STREAMS``."""
    env = os.environ if env is None else env
    out = []
    for name, default, least in ((READ_AHEAD_ENV, DEFAULT_READ_AHEAD, 0), (STREAMS_ENV, DEFAULT_STREAMS, 1)):
        raw = env.get(name)
        if raw in (None, ""):
            out.append(default)
        elif raw.strip().isdigit() and int(raw) >= least:
            out.append(int(raw))
        else:
            raise ValueError(f"{name}={raw!r} is not a whole number >= {least}")
    return out[0], out[1]


@dataclass
class _Shard:
    """One file this cache fetches: a whole shard, or the view of one (``tensors``)."""

    key: str
    ref: str
    local: Path
    size: int
    tensors: tuple | None
    plan: shard_fetch.Plan | None  # None: read the remote header when it must be fetched


def _key(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@contextlib.contextmanager
def _flock(path: Path, mode: int) -> Iterator[None]:
    with open(path, "a") as f:
        fcntl.flock(f, mode)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _free(path: Path) -> bool:
    """True if no one holds a lock on ``path`` (tried without waiting)."""
    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(f, fcntl.LOCK_UN)
        return True


class ShardCache:
    """Opens shards of caches at URIs: ``remotes`` maps each cache root's node-local mirror
    (``storage.node_cache(uri)``) to its URI; a shard of any other root is read in place.
    ``read_ahead``/``streams``: None takes them from the environment (``read_ahead_settings``)."""

    def __init__(self, budget: int, remotes: dict[str, str], rank: int = 0, read_ahead: int | None = None,
                 streams: int | None = None):
        if budget <= 0:
            raise ValueError(f"ShardCache: the budget must be > 0 bytes, got {budget}")
        env_ahead, env_streams = read_ahead_settings()
        self.read_ahead = env_ahead if read_ahead is None else read_ahead
        self.streams = env_streams if streams is None else streams
        if self.read_ahead < 0 or self.streams < 1:
            raise ValueError(f"ShardCache: read_ahead >= 0 and streams >= 1, got {read_ahead}, {streams}")
        self.budget, self.rank = budget, rank
        self.remotes = {str(Path(k)): v for k, v in remotes.items()}
        self.dir = storage.node_dir("feature-shards")
        self.downloaded: list[str] = []  # the shards this process downloaded
        self.bytes_read = 0  # bytes this process read from the store (headers included)
        self.wait_s = 0.0  # seconds its reads waited in ``open`` for a shard to be on disk
        self._sizes: dict[str, dict] = {}
        self._shards: dict[tuple, _Shard] = {}
        self._lock = threading.Lock()
        self._plan: list[tuple] = []
        self._pos = -1  # the index in the plan of the shard being read
        self._jobs: dict[tuple, object] = {}  # plan item -> Future of its prefetch
        self._held: dict[str, object] = {}  # key -> open .ahead file (the reservation) of a prefetched shard
        self._pool: ThreadPoolExecutor | None = None
        self._order = ShardOrder()

    # ------------------------------------------------------------ which file a shard is
    def _remote(self, store_dir: Path) -> str | None:
        uri = self.remotes.get(str(store_dir.parent))
        return None if uri is None else storage.join(uri, store_dir.name)

    def _size(self, ref_dir: str, file: str, nbytes: int | None) -> int:
        if nbytes is None:  # a cache whose index has no bytes: one listing per cache
            if ref_dir not in self._sizes:
                self._sizes[ref_dir] = storage.file_sizes(ref_dir)
            nbytes = self._sizes[ref_dir].get(file)
            if nbytes is None:
                raise FileNotFoundError(f"feature shard {storage.join(ref_dir, file)} is missing")
        return nbytes

    def _check_fits(self, s: _Shard) -> None:
        if s.size > self.budget:
            name = s.ref.rsplit("/", 1)[1]
            raise ValueError(f"feature shard {name} ({s.size / 2**20:.1f} MiB) does not fit the node's shard "
                             f"cache ({self.budget / 2**20:.1f} MiB, {ENV}): raise it")

    def _resolve(self, item: tuple) -> _Shard | None:
        """The file ``item`` = (store dir, shard file, bytes, tensors) is on this node; None: in place."""
        store_dir, file, nbytes, tensors = item
        ref_dir = self._remote(Path(store_dir))
        if ref_dir is None:
            return None
        with self._lock:
            if item in self._shards:
                return self._shards[item]
        ref = storage.join(ref_dir, file)
        s = None if tensors is None else self._view(ref, Path(store_dir), file, tensors)
        if s is None:
            s = _Shard(_key(ref), ref, Path(store_dir) / file, self._size(ref_dir, file, nbytes), None, None)
            s.plan = shard_fetch.whole(s.size)
        self._check_fits(s)
        self.dir.mkdir(parents=True, exist_ok=True)
        if not (self.dir / f"{s.key}.ref").is_file():
            entry = {"ref": s.ref, "local": str(s.local), "bytes": s.size, "tensors": s.tensors}
            write_text_atomic(self.dir / f"{s.key}.ref", json.dumps(entry))
        with self._lock:
            self._shards[item] = s
        return s

    def _view(self, ref: str, store_dir: Path, file: str, tensors: tuple) -> _Shard | None:
        """The shard's ``tensors`` only (a node that fetched them before knows the file's size);
        None when the shard holds no other tensor (read it whole)."""
        key = _key(f"{ref}#{','.join(tensors)}")
        local = store_dir / ".tensors" / _key(",".join(tensors))[:8] / file
        with contextlib.suppress(FileNotFoundError, ValueError, KeyError):
            known = json.loads((self.dir / f"{key}.ref").read_text())
            if known["tensors"] == list(tensors):
                return _Shard(key, ref, local, int(known["bytes"]), tensors, None)
        plan, nread = shard_fetch.plan_for(ref, tensors)
        with self._lock:
            self.bytes_read += nread
        return None if plan is None else _Shard(key, ref, local, plan.size, tensors, plan)

    # ------------------------------------------------------------ reading
    @contextlib.contextmanager
    def open(self, store_dir: Path, file: str, nbytes: int | None = None, tensors=None) -> Iterator[Path]:
        """The local path of shard ``file`` of the cache at ``store_dir`` (only its ``tensors`` when
        given), downloaded if missing; no prune deletes it inside the block."""
        t0 = time.perf_counter()
        item = (str(store_dir), file, nbytes, None if tensors is None else tuple(sorted(tensors)))
        s = self._resolve(item)
        if s is None:
            yield Path(store_dir) / file
            return
        job, index = self._advance(item)
        with open(self.dir / f"{s.key}.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_SH)  # held while read: a prune skips it
            try:
                if job is not None:
                    job.result()  # its prefetch (which never raises: a failed one is fetched here)
                self._fetch(s, prefetch=False, index=index)
                self._release(s.key)
                os.utime(lock.name)  # the last use, for least-recently-used order
                with self._lock:
                    self.wait_s += time.perf_counter() - t0
                yield s.local
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _fetch(self, s: _Shard, prefetch: bool, index: int | None = None, round_: int = 0) -> bool:
        """Download ``s`` unless the node has it (``index``: its place in the rank's plan, which
        orders the prefetches' reservations). A prefetch that finds no room returns False."""
        if prefetch and not shard_fetch.complete(s.local, s.size) and not self._order.wait(index, round_):
            return False  # (waits for its turn holding no lock)
        with _flock(self.dir / f"{s.key}.fetch", fcntl.LOCK_EX):  # one download of a shard at a time
            if shard_fetch.complete(s.local, s.size):
                self._order.decide(index)
                return True
            if not self._reserve(s, prefetch):
                self._order.fail(round_)
                return False
            self._order.decide(index)
            pending = self.dir / f"{s.key}.pending"
            try:
                plan = s.plan
                if plan is None:  # a view this node fetched before: its ranges from the header again
                    plan, nread = shard_fetch.plan_for(s.ref, s.tensors)
                    with self._lock:
                        self.bytes_read += nread
                got = shard_fetch.download(s.ref, s.local, plan)
            finally:
                pending.unlink(missing_ok=True)
            self._log(s, got, prefetch)
        return True

    def _reserve(self, s: _Shard, prefetch: bool) -> bool:
        """Make room for ``s`` and count its bytes as in flight (``<key>.pending``). A prefetch
        without room returns False; a rank's own download waits for the downloads in flight to land
        (they become deletable) and goes over the budget only when the shards being read fill it."""
        while True:
            with self._node_lock():
                fits, in_flight = self._make_room(s.size, take_reserved=not prefetch)
                if fits or (not prefetch and not in_flight):
                    entry = {"bytes": s.size, "local": str(s.local)}
                    write_text_atomic(self.dir / f"{s.key}.pending", json.dumps(entry))
                    return True
                if prefetch:
                    return False
            time.sleep(0.02)

    @contextlib.contextmanager
    def _node_lock(self) -> Iterator[None]:
        with _flock(self.dir / "node.lock", fcntl.LOCK_EX):
            yield

    def entries(self) -> list[tuple[float, str, Path, int]]:
        """(last use, key, local file, bytes) of every shard the node holds, oldest first."""
        out = []
        for ref_file in self.dir.glob("*.ref"):
            try:
                info = json.loads(ref_file.read_text())
            except (FileNotFoundError, ValueError):
                continue
            try:
                used = (self.dir / f"{ref_file.stem}.lock").stat().st_mtime
            except FileNotFoundError:
                used = 0.0  # fetched ahead and never read yet
            local = Path(info["local"])
            with contextlib.suppress(FileNotFoundError):
                out.append((used, ref_file.stem, local, local.stat().st_size))
        return sorted(out)

    def nbytes(self) -> int:
        """Bytes of the shards on the node's disk (downloads in flight not counted)."""
        return sum(e[3] for e in self.entries())

    def _reserved(self) -> int:
        """Bytes of the downloads in flight on the node; a reservation whose download died is cleared."""
        total = 0
        for p in self.dir.glob("*.pending"):
            try:
                info = json.loads(p.read_text())
            except (FileNotFoundError, ValueError):
                continue
            if _free(self.dir / f"{p.stem}.fetch"):  # its process is gone: its bytes and temp file too
                p.unlink(missing_ok=True)
                local = Path(info["local"])
                for tmp in local.parent.glob(f".{local.name}.*.tmp"):
                    tmp.unlink(missing_ok=True)
                continue
            total += int(info["bytes"])
        return total

    def _make_room(self, size: int, take_reserved: bool) -> tuple[bool, int]:
        """Delete least recently used shards no one reads (and, with ``take_reserved``, those
        reserved by read-ahead, after the others) until ``size`` more bytes fit; (whether they do,
        bytes of the downloads in flight) (node lock held)."""
        in_flight = self._reserved()  # first: a download that lands meanwhile is counted twice, never missed
        entries = self.entries()
        total = sum(e[3] for e in entries) + in_flight
        for reserved_too in (False, True) if take_reserved else (False,):
            for _, key, local, nbytes in entries:
                if total + size <= self.budget:
                    return True, in_flight
                if not local.is_file() or (not reserved_too and not _free(self.dir / f"{key}.ahead")):
                    continue
                with open(self.dir / f"{key}.lock", "a") as lock:
                    try:
                        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:  # being read: it stays
                        continue
                    local.unlink(missing_ok=True)
                    fcntl.flock(lock, fcntl.LOCK_UN)
                total -= nbytes
        return total + size <= self.budget, in_flight

    def _log(self, s: _Shard, got: int, prefetch: bool) -> None:
        with self._lock:
            self.downloaded.append(s.ref)
            self.bytes_read += got
        # counted under the node lock, where every deletion happens: counted outside it, a shard deleted
        # after its size was read and another landed before the count ended could be summed together
        # (a figure the disk never held; under load, over the budget)
        with self._node_lock():
            held = self.nbytes()
        line = json.dumps({"rank": self.rank, "ref": s.ref, "tensors": s.tensors, "bytes": s.size,
                           "read": got,
                           "prefetch": prefetch, "held_bytes": held, "budget": self.budget,
                           "t": time.time()})
        with open(self.dir / "downloads.jsonl", "a") as f:
            f.write(line + "\n")

    # ------------------------------------------------------------ read-ahead
    def expect(self, shards: list) -> None:
        """This rank opens ``shards`` [(store dir, file, bytes, tensors), ...] next, in this order
        (its epoch): fetch the first and the ``read_ahead`` after it in the background."""
        if not self.read_ahead:
            return
        plan = [(str(d), f, n, None if t is None else tuple(sorted(t))) for d, f, n, t in shards]
        window = plan[: self.read_ahead + 1]
        with self._lock:
            self._plan, self._pos = plan, -1
            self._order.restart()  # waiting prefetches of the old order give up
            for k in [k for k in self._jobs if k not in window]:
                self._jobs.pop(k).cancel()
            keep = {self._shards[k].key for k in window if k in self._shards}
        for key in [k for k in list(self._held) if k not in keep]:  # reservations the new order does not need
            self._release(key)
        self._schedule()

    def _advance(self, item: tuple) -> tuple:
        """``item`` is being opened: the window moves to it. Returns (its prefetch or None, its index
        in the plan or None)."""
        with self._lock:
            index = None
            if item in self._plan[self._pos + 1 :]:
                index = self._pos = self._plan.index(item, self._pos + 1)
                self._order.passed(index)
            job = self._jobs.pop(item, None)
        self._schedule()
        return job, index

    def _schedule(self) -> None:
        """Prefetch every shard of the window not fetched or being fetched (a skipped one again)."""
        if not self.read_ahead:
            return
        with self._lock:
            last = max(self._pos, 0) + self.read_ahead
            for index in range(self._pos + 1, min(last + 1, len(self._plan))):
                item = self._plan[index]
                job = self._jobs.get(item)
                if job is not None and not (job.done() and job.result() is False):
                    continue
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(self.streams,
                                                    thread_name_prefix=f"shards-rank{self.rank}")
                self._jobs[item] = self._pool.submit(self._prefetch, item, index, self._order.round)

    def _prefetch(self, item: tuple, index: int, round_: int) -> bool:
        """Reserve and fetch one shard of the window, taking room after the shards before it in the
        plan; False (never an error) when it could not: the rank then fetches it itself."""
        try:
            s = self._resolve(item)
        except Exception:  # noqa: BLE001 - the rank sees the error when it opens the shard
            s = False
        if s is None or s is False:
            self._order.decide(index) if s is None else self._order.fail(round_)
            return s is None
        hold = open(self.dir / f"{s.key}.ahead", "a")
        try:
            fcntl.flock(hold, fcntl.LOCK_SH)  # reserved before it exists: no prefetch deletes it once there
            ok = self._fetch(s, prefetch=True, index=index, round_=round_)
        except Exception:  # noqa: BLE001 - as above
            self._order.fail(round_)
            ok = False
        with self._lock:
            if ok and s.key not in self._held:
                self._held[s.key] = hold
                return True
        hold.close()
        return ok

    def _release(self, key: str) -> None:
        with self._lock:
            hold = self._held.pop(key, None)
        if hold is not None:
            hold.close()

    def close(self) -> None:
        """Stop fetching ahead and drop every reservation (the shards stay on disk)."""
        self._order.close()
        with self._lock:
            jobs = list(self._jobs.values())
            self._jobs = {}
            self._plan = []
            pool = self._pool
            self._pool = None
        for job in jobs:
            job.cancel()
        if pool is not None:
            pool.shutdown(wait=True)
        for key in list(self._held):
            self._release(key)

