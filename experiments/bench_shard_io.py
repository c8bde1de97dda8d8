"""Benchmark: how long training ranks wait for feature shards over a throttled S3 store, with and
without read-ahead, beside orchestrator/plan/feature_io.py's prediction for the same bandwidth.

    python experiments/bench_shard_io.py [--mbps 5] [--shards 12] [--view-mb 2] [--compute 1.0 0.2]
                                         [--ranks 1] [--read-ahead 4] [--streams 4]

An EAGLE-3 cache (three aux layers, hidden 1024: EAGLE-2's view is a quarter of each shard) is put
on moto's S3 server behind a bandwidth throttle (tests/s3_server.py: every byte the server sends
shares one token bucket, as a node's link would). ``--ranks`` ranks on one node (threads, each with
its own ShardCache in one staging dir, as Ray Train's workers on a node share one) read their own
shards (drafters/train/shards.py) as EAGLE-2 does (no aux layers), each 'training' ``--compute`` seconds
per shard (a sleep), once without read-ahead and once with it. The wait is the time a rank spent
in ``ShardCache.open`` before a shard was on its disk. The prediction takes the bytes a rank
downloaded per shard (its views and their headers) and the throttle's bandwidth.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BUCKET, REGION = "bench-shard-io", "us-east-1"
HIDDEN, AUX = 1024, 3


def make_cache(root: Path, shards: int, view_mb: float) -> dict:
    """An EAGLE-3 cache of ``shards`` shards whose EAGLE-2 view is about ``view_mb`` MB each."""
    import torch

    from drafters.data.templating import TokenizedExample
    from drafters.features import FeatureExample, FeatureStore, token_bytes

    length = 250
    per_shard = max(1, round(view_mb * 1e6 / token_bytes(HIDDEN) / length))
    exs = [TokenizedExample(f"ex{i}", [3 + i % 50] * length, [0] + [1] * (length - 1))
           for i in range(shards * per_shard)]
    gen = torch.Generator().manual_seed(0)

    def compute(batch):
        return [FeatureExample(e.id, torch.tensor(e.input_ids), torch.tensor(e.loss_mask, dtype=torch.bool),
                               torch.randn(length, HIDDEN, generator=gen).half(),
                               torch.randint(0, 60, (length, 10), generator=gen).int(),
                               torch.rand(length, 10, generator=gen).half(),
                               torch.randn(length, AUX * HIDDEN, generator=gen).half()) for e in batch]

    return FeatureStore(root, "c", shard_tokens=per_shard * length).extract(exs, compute, {"aux_layers": [0,
            1, 2]})


def run_ranks(uri: str, node: Path, ranks: int, compute_s: float, read_ahead: int, streams: int,
              per_shard: int) -> list:
    """Each rank's (wait seconds, shards read, bytes read) for one epoch on a fresh node (every
    shard holds ``per_shard`` examples)."""
    from common import storage
    from drafters.features import SHARD_TENSORS, reading_tensors, reading_through
    from drafters.train.data import iter_examples
    from drafters.train.shards import rank_plan
    from workers.artifacts import localize_data
    from workers.shard_cache import ShardCache

    os.environ["TASKSPEC_STAGING"] = str(node)
    data = localize_data([[uri, "c", None]])
    plan = rank_plan(data, ranks, 1) if ranks > 1 else None
    out = [None] * ranks

    def rank(r: int) -> None:
        mine = plan.data(r) if plan is not None else data
        cache = ShardCache(1 << 40, {str(storage.node_cache(uri)): uri}, rank=r, read_ahead=read_ahead,
                           streams=streams)
        n = 0
        with reading_through(cache), reading_tensors(SHARD_TENSORS):
            for n, _ in enumerate(iter_examples(mine, None), 1):
                if n % per_shard == 0:
                    time.sleep(compute_s)  # the shard's examples are 'trained on'
        out[r] = (cache.wait_s, n // per_shard, cache.bytes_read)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def ray_data_epoch(s3fs, paths: list[str], compute_s: float) -> float:
    """One epoch read by Ray Data (``read_binary_files``, streamed: its own parallel reads and
    prefetch): seconds the consumer waited for the next shard. Ray Data reads whole files."""
    import ray.data

    it, wait = iter(ray.data.read_binary_files(paths, filesystem=s3fs).iter_rows()), 0.0
    while True:
        t = time.perf_counter()
        if next(it, None) is None:
            return wait
        wait += time.perf_counter() - t
        time.sleep(compute_s)


def compare_ray_data(uri: str, s3fs, throttle, work: Path, m: dict, a) -> list:
    """Two epochs through Ray Data and two through the shard cache (read-ahead, EAGLE-2's view, one
    node dir kept across epochs): (reader, epoch, waited, MB over the link) per epoch."""
    import ray

    rows = []
    for epoch in (1, 2):
        before = throttle.sent
        got = run_ranks(uri, work / "node-cache", 1, a.compute[0], a.read_ahead, a.streams,
                        m["shards"][0]["examples"])
        rows.append(("shard cache", epoch, got[0][0], (throttle.sent - before) / 1e6))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        paths = [f"{BUCKET}/features/c/{s['file']}" for s in m["shards"]]
        for epoch in (1, 2):
            before = throttle.sent
            rows.append(("Ray Data", epoch, ray_data_epoch(s3fs, paths, a.compute[0]),
                         (throttle.sent - before) / 1e6))
    finally:
        ray.shutdown()
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mbps", type=float, default=5.0, help="the store's bandwidth to the node (MB/s)")
    ap.add_argument("--shards", type=int, default=12, help="shards in the cache (all ranks together)")
    ap.add_argument("--view-mb", type=float, default=2.0, help="MB of a shard EAGLE-2 reads (its view)")
    ap.add_argument("--compute", type=float, nargs="+", default=[1.0, 0.2],
                    help="seconds of training per shard")
    ap.add_argument("--ranks", type=int, default=1, help="ranks on the node, sharing its bandwidth")
    ap.add_argument("--read-ahead", type=int, default=4)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--ray-data", action="store_true",
                    help="also two epochs through Ray Data (local Ray, 2 CPUs) "
                                                            "and the shard cache, at the first --compute")
    a = ap.parse_args(argv)

    from common import storage
    from orchestrator.plan import feature_io
    from tests.s3_server import CREDS, throttled_s3

    work = Path(tempfile.mkdtemp(prefix="bench-shard-io-"))
    m = make_cache(work / "features", a.shards, a.view_mb)
    whole = sum(s["bytes"] for s in m["shards"]) / len(m["shards"])
    print(f"cache: {len(m['shards'])} shards of {whole / 1e6:.1f} MB (EAGLE-3, hidden {HIDDEN}, {AUX} aux "
          "layers); "
          f"bandwidth {a.mbps} MB/s; {a.ranks} rank(s) on the node; read-ahead {a.read_ahead} on "
          f"{a.streams} streams")
    rows = []
    with throttled_s3(BUCKET, REGION, bandwidth=a.mbps * 1e6) as (endpoint, s3fs, throttle):
        os.environ.update(AWS_ENDPOINT_URL_S3=endpoint, AWS_DEFAULT_REGION=REGION, **CREDS)
        uri = f"s3://{BUCKET}/features"
        storage.sync(str(work / "features"), uri)
        for compute_s in a.compute:
            for ahead in (0, a.read_ahead):
                t0 = time.perf_counter()
                got = run_ranks(uri, work / f"node-{compute_s}-{ahead}", a.ranks, compute_s, ahead, a.streams,
                                m["shards"][0]["examples"])
                wall = time.perf_counter() - t0
                shards, nbytes = got[0][1], sum(g[2] for g in got) / sum(g[1] for g in got)
                r = feature_io.ShardReads(nbytes, shards, compute_s, a.mbps * 1e6, a.ranks, a.streams, ahead)
                predicted = feature_io.wait_with_read_ahead(r)
                measured = sum(g[0] for g in got) / len(got)
                rows.append((compute_s, ahead, shards, nbytes, measured, predicted, wall))
        ray_rows = compare_ray_data(uri, s3fs, throttle, work, m, a) if a.ray_data else []
    print("\n| training per shard | read-ahead | shards per rank | MB per shard | waited (measured) "
          "| predicted (feature_io) | measured / predicted | epoch wall |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for compute_s, ahead, shards, nbytes, measured, predicted, wall in rows:
        print(f"| {compute_s:.2f} s | {ahead} | {shards} | {nbytes / 1e6:.2f} | {measured:.2f} s | "
              f"{predicted:.2f} s "
              f"| {measured / predicted:.2f} | {wall:.1f} s |")
    if ray_rows:
        print(f"\n| reader ({a.compute[0]:.2f} s of training per shard) "
              "| epoch | waited | MB over the link |")
        print("| --- | ---: | ---: | ---: |")
        for reader, epoch, waited, mb in ray_rows:
            print(f"| {reader} | {epoch} | {waited:.2f} s | {mb:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
