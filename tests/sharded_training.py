"""Features extracted once and streamed to OUTPUT_URI, then read by two ranks, each its own shards.

    python tests/sharded_training.py OUTPUT_URI

Run by tests/test_multinode.py against the Ray cluster at RAY_ADDRESS (a head and two 1-CPU worker
nodes, each its own staging dir), in its own process so that the test bounds it with a timeout. The
grid's features task (workers.tasks.features_task, as Ray tasks) extracts MathInstruct with the real
verifier into many small shards (TASKSPEC_FEATURE_SHARD_TOKENS), each uploaded as it is finished, in
two data-parallel parts (one task a node, each its half of the shards, as the driver runs one part a
GPU), and workers.tasks.features_finish_task writes the indexes; then one Ray Train run with a worker
on each node trains a HASS drafter for two epochs (DeepSpeed ZeRO-1, gloo) from the URI, every rank
through its node's shard cache bounded by TASKSPEC_FEATURE_CACHE_GB (smaller than a rank's share:
shards are evicted and fetched again). The last stdout line is a JSON summary (phase times, the
training's state).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout, for Ray's workers too

import ray  # noqa: E402

from common import storage  # noqa: E402
from drafters.train.config import TrainConfig  # noqa: E402
from drafters.variants import DataSpec, heldout_data, variant_data  # noqa: E402
from workers.tasks import features_finish_task  # noqa: E402
from workers.tasks import features_task as _features_task
from workers.train_worker import run_training  # noqa: E402

VERIFIER = "smollm2-135m-instruct"
SPEC = DataSpec(n=96, heldout=4, max_length=96, seed=42)
SHARD_TOKENS = 250  # ~0.3 MB shards of SmolLM2-135M's features: ~30 for the 96 examples
CACHE_BYTES = 1 << 20  # each node's shard cache: a few shards, under a rank's share


def main(uri: str) -> dict:
    env = {"TASKSPEC_TRAIN_THREADS": "1", "TASKSPEC_FEATURE_SHARD_TOKENS": str(SHARD_TOKENS),
           "TASKSPEC_FEATURE_CACHE_GB": repr(CACHE_BYTES / 2**30), **storage.endpoint_env()}
    ray.init(address="auto", log_to_driver=True, runtime_env={"env_vars": env})
    feats, out_uri = storage.join(uri, "features"), storage.join(uri, "checkpoints", "hass-math")
    times = {"extract_start": time.time()}
    try:
        task = ray.remote(num_cpus=1, max_retries=0)(_features_task)
        parts = ray.get([task.remote(VERIFIER, None, "mathinstruct", SPEC, feats, shards=(i, 2))
                         for i in range(2)])
        finish = ray.remote(num_cpus=1, max_retries=0)(features_finish_task)
        caches = {"mathinstruct": ray.get(finish.remote(feats, parts[0], 2))}
        times["extract_end"] = times["train_start"] = time.time()
        cfg = TrainConfig(verifier=VERIFIER, backbone="hass", variant="math", out_dir="unused",
                          out_uri=out_uri,
                          train_data=variant_data("math", feats, caches, SPEC.n),
                          heldout_data=heldout_data(feats, caches), epochs=2, lr=1e-3, batch_size=4,
                          hass_steps=2,
                          deepspeed=True, zero_stage=1)
        run_training(cfg, num_workers=2, cpus_per_worker=1, max_failures=0)
        times["train_end"] = time.time()
    finally:
        ray.shutdown()
    state = json.loads(storage.read_text(storage.join(out_uri, "epoch-2", "state.json")))
    return {"times": times, "caches": caches, "cache_bytes": CACHE_BYTES, "features": feats,
            "history": state["history"], "ranks": state["ranks"]}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
