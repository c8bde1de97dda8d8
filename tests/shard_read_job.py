"""Two ranks, one on each worker node, read their own shards of an EAGLE-3 cache at s3:// as EAGLE-2
does (no aux layers), 'training' COMPUTE_S seconds per shard, once per read-ahead depth given.

    python tests/shard_read_job.py URI COMPUTE_S AHEAD [AHEAD ...]

Run by tests/test_multinode.py against the Ray cluster at RAY_ADDRESS (two 1-CPU worker nodes, each
its own staging dir) with the store behind a bandwidth throttle: the cache for depth AHEAD is at
URI/c<AHEAD> (one copy per depth, so no node starts with the other run's shards on its disk). Each
rank is a Ray task pinned to its node (not Ray Train: the reads are what is measured). The last
stdout line is JSON: per depth, per rank, the seconds it waited for shards, the bytes it read, the
files it downloaded and its node.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout, for Ray's workers too

import ray  # noqa: E402
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: E402

from common import storage  # noqa: E402

BUDGET = 64 << 20  # each node's shard cache: a rank's share fits


def read_rank(uri: str, key: str, rank: int, compute_s: float, read_ahead: int) -> dict:
    """Rank ``rank`` of 2: its own shards (drafters/train/shards.py) through its node's shard cache."""
    from drafters.features import SHARD_TENSORS, reading_tensors, reading_through
    from drafters.train.data import iter_examples
    from drafters.train.shards import rank_plan
    from workers.artifacts import localize_data
    from workers.shard_cache import ShardCache

    data = localize_data([[uri, key, None]])
    plan = rank_plan(data, 2, 1)
    cache = ShardCache(BUDGET, {str(storage.node_cache(uri)): uri}, rank=rank, read_ahead=read_ahead,
                       streams=2)
    mine = plan.mine(rank)
    per_shard = {u.file: u.examples for u in mine}
    with reading_through(cache), reading_tensors(SHARD_TENSORS):
        n, ends = 0, set()
        for u in mine:  # the example counts at which each shard ends, in the order they are read
            n += per_shard[u.file]
            ends.add(n)
        for i, _ in enumerate(iter_examples(plan.data(rank), None), 1):
            if i in ends:
                time.sleep(compute_s)
    return {"rank": rank, "wait_s": cache.wait_s, "bytes_read": cache.bytes_read, "shards": len(mine),
            "files": sorted(r.rsplit("/", 1)[1] for r in cache.downloaded),
            "own": sorted(u.file for u in mine), "node": ray.get_runtime_context().get_node_id()}


def main(uri: str, compute_s: float, depths: list[int]) -> dict:
    ray.init(address="auto", log_to_driver=True, runtime_env={"env_vars": storage.endpoint_env()})
    try:
        nodes = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU",
                0) >= 1)[:2]
        task = ray.remote(num_cpus=1, max_retries=0)(read_rank)
        out = {}
        for ahead in depths:
            refs = [task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(
                uri, f"c{ahead}", rank, compute_s, ahead) for rank, node in enumerate(nodes)]
            out[str(ahead)] = ray.get(refs)
        return out
    finally:
        ray.shutdown()


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], float(sys.argv[2]), [int(x) for x in sys.argv[3:]])))
