"""Feature shards read from a store at a URI (workers/shard_cache.py, workers/shard_fetch.py): only
the tensors a backbone reads, fetched ahead of the rank in parallel, within the node's budget.

Fast and single-process: synthetic shards at a file:// URI, and for the timing a moto S3 server
behind a bandwidth throttle (tests/s3_server.py). Timings on 2 noisy cores are asserted only where
they cannot flake: read-ahead strictly reduces the wait. experiments/bench_shard_io.py prints the
measured waits beside orchestrator/plan/feature_io.py's prediction; tests/test_multinode.py runs the
same on two Ray nodes (``full``)."""
from __future__ import annotations

import json
import struct
import threading
import time
from pathlib import Path

import pytest
import torch

from common import storage
from drafters.data.templating import TokenizedExample
from drafters.features import (
    AUX,
    SHARD_TENSORS,
    FeatureExample,
    FeatureStore,
    expect_shards,
    open_shard,
    reading_tensors,
    reading_through,
)
from drafters.train.data import batches, iter_examples
from drafters.train.shards import rank_plan
from tests.s3_server import CREDS, throttled_s3
from workers import shard_fetch
from workers.artifacts import localize_data
from workers.shard_cache import ShardCache, read_ahead_settings


def make_cache(root, key: str, shards: int, per_shard: int = 4, length: int = 20, hidden: int = 64,
               n_aux: int = 0) -> dict:
    """A cache of ``shards`` shards of ``per_shard`` examples of ``length`` tokens, hidden size
    ``hidden`` (EAGLE-3's ``n_aux`` layers with it); returns its manifest."""
    exs = [TokenizedExample(f"ex{i}", [3 + (i * 7 + j) % 50 for j in range(length)], [0,
            0] + [1] * (length - 2))
           for i in range(shards * per_shard)]

    def compute(batch):
        out = []
        for e in batch:
            g = torch.Generator().manual_seed(int(e.id[2:]))
            L = len(e.input_ids)
            out.append(FeatureExample(
                e.id, torch.tensor(e.input_ids), torch.tensor(e.loss_mask, dtype=torch.bool),
                torch.randn(L, hidden, generator=g).half(), torch.randint(0, 60, (L, 10), generator=g).int(),
                torch.rand(L, 10, generator=g).half(),
                torch.randn(L, n_aux * hidden, generator=g).half() if n_aux else None))
        return out

    meta = {"aux_layers": list(range(n_aux))} if n_aux else {}
    return FeatureStore(root, key, shard_tokens=per_shard * length).extract(exs, compute, meta)


def _header(path: Path) -> tuple[dict, int]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + n]), 8 + n


def _at_uri(tmp_path, monkeypatch, shards=6, n_aux=3, hidden=256):
    """An EAGLE-3 cache at a file:// URI (shards of 8 examples, ~340 KB); this 'node' with its own
    staging dir."""
    local = tmp_path / "features"
    m = make_cache(local, "c", shards, per_shard=8, hidden=hidden, n_aux=n_aux)
    uri = (tmp_path / "bucket" / "features").as_uri()
    storage.sync(str(local), uri)
    monkeypatch.setenv("TASKSPEC_STAGING", str(tmp_path / "node"))
    return uri, local, m


def test_eagle2_and_hass_download_only_their_tensors_of_an_eagle3_cache(tmp_path, monkeypatch):
    uri, local, m = _at_uri(tmp_path, monkeypatch)
    data = localize_data([[uri, "c", None]])
    cache = ShardCache(1 << 30, {str(storage.node_cache(uri)): uri}, read_ahead=0)
    with reading_through(cache), reading_tensors(SHARD_TENSORS):
        got = list(FeatureStore(data[0][0], "c").iter_examples())
    want = list(FeatureStore(local, "c").iter_examples())
    assert [e.id for e in got] == [e.id for e in want] and all(e.aux is None for e in got)
    for a, b in zip(got, want):  # bit for bit what reading the whole file gives, less the aux layers
        for name in ("input_ids", "loss_mask", "features", "top_ids", "top_probs"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name
    # the bytes read: each shard's header (one read) and its tensors but the aux layers'
    expected = 0
    for s in m["shards"]:
        header, start = _header(local / "c" / s["file"])
        aux = header[AUX]["data_offsets"]
        assert aux[1] - aux[0] > 0.7 * s["bytes"]  # (hidden 256: the aux layers are 73% of a shard)
        expected += min(shard_fetch.HEADER_GUESS, s["bytes"]) + (s["bytes"] - start) - (aux[1] - aux[0])
    assert cache.bytes_read == expected < 0.4 * sum(s["bytes"] for s in m["shards"])
    logged = [json.loads(x) for x in (cache.dir / "downloads.jsonl").read_text().splitlines()]
    assert {tuple(x["tensors"]) for x in logged} == {tuple(sorted(SHARD_TENSORS))}
    assert not [p for p in (storage.node_cache(uri) / "c").iterdir() if p.name.startswith("shard-")]
    # EAGLE-3 reads every tensor: the whole files, the same bytes as at the store
    whole = ShardCache(1 << 30, {str(storage.node_cache(uri)): uri}, read_ahead=0)
    with reading_through(whole):
        three = list(FeatureStore(data[0][0], "c").iter_examples())
    assert all(torch.equal(a.aux, b.aux) for a, b in zip(three, want))
    assert whole.bytes_read == sum(s["bytes"] for s in m["shards"])
    for s in m["shards"]:
        cached = (storage.node_cache(uri) / "c" / s["file"]).read_bytes()
        assert cached == (local / "c" / s["file"]).read_bytes()


def test_the_trainer_gets_the_same_batches_whatever_the_node_downloads(tmp_path, monkeypatch):
    """EAGLE-2/HASS batches from an EAGLE-3 cache at a URI, read through views fetched ahead, are
    the batches of the cache read whole in place (the same examples, in the same order)."""
    import dataclasses

    uri, local, m = _at_uri(tmp_path, monkeypatch, shards=8)
    data = localize_data([[uri, "c", None]])
    cache = ShardCache(1 << 30, {str(storage.node_cache(uri)): uri}, rank=1, read_ahead=2, streams=2)
    for epoch in (1, 2):
        ref = list(batches([[str(local), "c", None]], 3, epoch, bucket=True, rank=1, world=2))
        with reading_through(cache), reading_tensors(SHARD_TENSORS):
            got = list(batches(data, 3, epoch, bucket=True, rank=1, world=2))
        assert len(got) == len(ref) > 0
        for a, b in zip(got, ref):
            for f in dataclasses.fields(a):
                assert torch.equal(getattr(a, f.name), getattr(b, f.name)), f.name
    assert cache.downloaded and all(x["tensors"] for x in map(json.loads,
                                                              (cache.dir / "downloads.jsonl").open()))


def test_a_cache_without_aux_layers_is_read_whole_as_before(tmp_path, monkeypatch):
    uri, local, m = _at_uri(tmp_path, monkeypatch, n_aux=0)
    data = localize_data([[uri, "c", None]])
    cache = ShardCache(1 << 30, {str(storage.node_cache(uri)): uri}, read_ahead=0)
    with reading_through(cache), reading_tensors(SHARD_TENSORS):
        assert len(list(FeatureStore(data[0][0], "c").iter_examples())) == 48
    assert cache.bytes_read == sum(s["bytes"] for s in m["shards"])  # no header read, no view


def test_a_shard_is_never_half_read_and_a_failed_fetch_leaves_nothing(tmp_path, monkeypatch):
    uri, local, m = _at_uri(tmp_path, monkeypatch, shards=2)
    s = m["shards"][0]
    ref = storage.join(uri, "c", s["file"])
    plan, _ = shard_fetch.plan_for(ref, SHARD_TENSORS)
    dest = tmp_path / "out" / s["file"]

    class Broken:  # the store drops the connection half-way
        def __init__(self, f):
            self.f, self.n = f, 0

        def __enter__(self):
            return self

        def __exit__(self, *a):
            self.f.close()

        def read_at(self, n, offset):
            self.n += 1
            if self.n == 2:
                raise OSError("injected: connection reset")
            return self.f.read_at(n, offset)

    real = shard_fetch._open
    monkeypatch.setattr(shard_fetch, "_open", lambda r: Broken(real(r)))
    with pytest.raises(OSError, match="injected"):
        shard_fetch.download(ref, dest, plan)
    assert not list(dest.parent.iterdir())  # neither the file nor its temp
    monkeypatch.setattr(shard_fetch, "_open", real)
    assert shard_fetch.download(ref, dest, plan) == sum(n for _, n in plan.ranges)
    assert dest.stat().st_size == plan.size


def _disk_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and p.suffix != ".json"
               and "shard-" in p.name)


class _DiskWatch(threading.Thread):
    """The largest bytes of shard files (temp files included) under ``root``, sampled."""

    def __init__(self, root: Path):
        super().__init__(daemon=True)
        self.root, self.peak, self.stop = root, 0, threading.Event()

    def run(self):
        while not self.stop.is_set():
            try:
                self.peak = max(self.peak, _disk_bytes(self.root))
            except FileNotFoundError:
                pass
            time.sleep(0.001)


def test_read_ahead_keeps_the_node_under_its_budget_and_a_share_that_fits_on_disk(tmp_path, monkeypatch):
    uri, local, m = _at_uri(tmp_path, monkeypatch, shards=12, n_aux=0)
    data = localize_data([[uri, "c", None]])
    sizes = sorted(s["bytes"] for s in m["shards"])
    plan = rank_plan(data, 2, 2)
    mine = {u.file for u in plan.mine(1)}
    share = sum(s["bytes"] for s in m["shards"] if s["file"] in mine)
    remotes = {str(storage.node_cache(uri)): uri}
    # a budget of three shards, read-ahead of four: prefetches wait for room, never take it
    small = ShardCache(3 * sizes[-1], remotes, rank=1, read_ahead=4, streams=3)
    watch = _DiskWatch(storage.node_cache(uri))
    watch.start()
    with reading_through(small):
        for epoch in (1, 2):
            list(batches(data, 2, epoch, rank=1, world=2))
    watch.stop.set()
    watch.join()
    logged = [json.loads(x) for x in (small.dir / "downloads.jsonl").read_text().splitlines()]
    assert {x["ref"].rsplit("/", 1)[1] for x in logged} == mine  # its own shards only
    assert max(x["held_bytes"] for x in logged) <= small.budget and 0 < watch.peak <= small.budget
    assert any(x["prefetch"] for x in logged) and len(logged) > len(mine)  # fetched ahead; evicted and again
    # a budget that holds the share: the second and third epochs download nothing
    monkeypatch.setenv("TASKSPEC_STAGING", str(tmp_path / "node2"))
    data = localize_data([[uri, "c", None]])
    fits = ShardCache(share + 2 * sizes[-1], {str(storage.node_cache(uri)): uri}, rank=1, read_ahead=2,
                      streams=2)
    with reading_through(fits):
        for epoch in (1, 2, 3):
            before = len(fits.downloaded)
            got = list(batches(data, 2, epoch, rank=1, world=2))
            assert len(got) == plan.steps
            if epoch > 1:
                assert len(fits.downloaded) == before
    assert sorted(r.rsplit("/", 1)[1] for r in fits.downloaded) == sorted(mine)


def test_two_ranks_on_a_node_fetching_ahead_share_its_budget(tmp_path, monkeypatch):
    uri, local, m = _at_uri(tmp_path, monkeypatch, shards=12, n_aux=3)
    data = localize_data([[uri, "c", None]])
    remotes = {str(storage.node_cache(uri)): uri}
    budget = 4 * max(s["bytes"] for s in m["shards"]) // 3  # about five EAGLE-2 views
    want = {e.id: e for e in FeatureStore(local, "c").iter_examples()}
    caches = [ShardCache(budget, remotes, rank=r, read_ahead=3, streams=2) for r in range(2)]
    errors, seen = [], {0: [], 1: []}

    def rank(r):
        try:
            with reading_through(caches[r]), reading_tensors(SHARD_TENSORS):
                for epoch in (1, 2):
                    for e in iter_examples(rank_plan(data, 2, 2).data(r), epoch):
                        assert torch.equal(e.features, want[e.id].features)
                        seen[r].append(e.id)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    watch = _DiskWatch(storage.node_cache(uri))
    watch.start()
    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    watch.stop.set()
    watch.join()
    assert not errors, errors
    assert sorted(seen[0] + seen[1]) == sorted(2 * list(want))
    assert 0 < watch.peak <= budget
    for r in range(2):  # each its own shards, their views only
        own = {u.file for u in rank_plan(data, 2, 2).mine(r)}
        assert {x.rsplit("/", 1)[1] for x in caches[r].downloaded} <= own


def test_read_ahead_settings_from_the_environment():
    assert read_ahead_settings({}) == (4, 4)
    assert read_ahead_settings({"TASKSPEC_SHARD_READ_AHEAD": "0", "TASKSPEC_SHARD_STREAMS": "8"}) == (0, 8)
    for bad in ({"TASKSPEC_SHARD_READ_AHEAD": "-1"}, {"TASKSPEC_SHARD_STREAMS": "0"},
                {"TASKSPEC_SHARD_STREAMS": "x"}):
        with pytest.raises(ValueError, match="TASKSPEC_SHARD_"):
            read_ahead_settings(bad)


# ------------------------------------------------------------------ over a throttled S3 server

BUCKET, REGION = "shard-reads", "us-east-1"


def read_epoch(data, cache, compute_s: float, per_shard: int) -> float:
    """One rank's epoch through ``cache``: every example, ``compute_s`` of 'training' per shard;
    returns the seconds ``open`` waited for shards."""
    with reading_through(cache), reading_tensors(SHARD_TENSORS):
        for i, _ in enumerate(iter_examples(data, None)):
            if i % per_shard == per_shard - 1:
                time.sleep(compute_s)
    return cache.wait_s


def test_read_ahead_strictly_reduces_the_wait_on_a_throttled_store(tmp_path, monkeypatch):
    local = tmp_path / "features"
    m = make_cache(local, "c", 6, hidden=256, n_aux=3)  # EAGLE-2's view: ~45 KB a shard
    with throttled_s3(BUCKET, REGION, bandwidth=1e6) as (endpoint, _, throttle):
        for k, v in {"AWS_ENDPOINT_URL_S3": endpoint, "AWS_DEFAULT_REGION": REGION, **CREDS}.items():
            monkeypatch.setenv(k, v)
        uri = f"s3://{BUCKET}/features"
        storage.sync(str(local), uri)
        waits, sent = {}, {}
        for ahead in (0, 2):
            monkeypatch.setenv("TASKSPEC_STAGING", str(tmp_path / f"node-{ahead}"))
            data = localize_data([[uri, "c", None]])
            cache = ShardCache(1 << 30, {str(storage.node_cache(uri)): uri}, read_ahead=ahead, streams=2)
            before = throttle.sent
            waits[ahead] = read_epoch(data, cache, compute_s=0.08, per_shard=4)
            sent[ahead] = throttle.sent - before
            assert cache.bytes_read < 0.4 * sum(s["bytes"] for s in m["shards"])  # the views only
    print(f"waits for 6 shards at 1 MB/s, 0.08 s of training each: {waits[0]:.2f}s without read-ahead, "
          f"{waits[2]:.2f}s with 2 ahead on 2 streams; bytes sent {sent}")
    assert waits[2] < waits[0]


def test_expect_without_an_opener_that_reads_ahead_is_a_no_op(tmp_path):
    m = make_cache(tmp_path, "c", 2)
    expect_shards(FeatureStore(tmp_path, "c").reads())  # no opener
    with open_shard(tmp_path / "c", m["shards"][0]["file"]) as p:
        assert p.is_file()
