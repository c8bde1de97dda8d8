"""One Ray Train run across the nodes of the Ray cluster at RAY_ADDRESS, as the grid trains a drafter,
in its own process so that the test can bound it with a timeout (a hang fails, it does not wait).

    python tests/two_node_training.py OUTPUT_URI WORK_DIR

The verifier computes a feature cache here (20 training examples: 5 batches of 4, an odd count for
2 ranks) and publishes it to OUTPUT_URI; two workers train a HASS drafter in bf16 through DeepSpeed
(ZeRO-1, gloo) from the URI, with a step checkpoint after every optimizer step and a crash injected
after step 3 (epoch 2, step 1: a fresh run only), which Ray Train's FailureConfig restarts from the
step checkpoint at the URI. The last stdout line is a JSON summary for the test. (Checkpoints
trained this way decode exactly: the multi-node grid of tests/test_multinode.py trains its drafters
so, in bf16 on two ranks, and every strategy's T=0 output there equals the autoregressive one.)
"""
from __future__ import annotations

import json
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout, for Ray's workers too

import ray  # noqa: E402

from common import storage
from common.verifiers import eos_token_ids  # noqa: E402
from decoding.verifiers import load_verifier
from drafters.train.config import TrainConfig
from drafters.variants import DataSpec, ensure_features, heldout_data, variant_data
from workers.train_worker import run_training

VERIFIER = "smollm2-135m-instruct"
SPEC = DataSpec(n=20, heldout=4, max_length=96, seed=42)


def main(uri: str, work: str) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, tok = load_verifier(VERIFIER)
    eos = eos_token_ids(model, tok)
    root = f"{work}/features"
    caches = {c: ensure_features(model, tok, eos, VERIFIER, c, SPEC, root) for c in ("mathinstruct",
            "sharegpt")}
    for corpus in caches.values():  # published as the features stage does: the workers read only the URI
        for part in ("train", "heldout"):
            storage.publish(f"{root}/{corpus[part]}", storage.join(uri, "features", corpus[part]))
    feats, out_uri = storage.join(uri, "features"), storage.join(uri, "checkpoints", "hass-math")
    cfg = TrainConfig(verifier=VERIFIER, backbone="hass", variant="math", out_dir=f"{work}/unused",
                      out_uri=out_uri,
                      train_data=variant_data("math", feats, caches, SPEC.n),
                      heldout_data=heldout_data(feats, caches)[:1], epochs=2, lr=1e-3, batch_size=4,
                      hass_steps=2,
                      deepspeed=True, zero_stage=1, precision="bf16", checkpoint_every=1, keep_checkpoints=1,
                      crash_at_step=3)
    ray.init(address="auto", log_to_driver=True,
             runtime_env={"env_vars": {"TASKSPEC_TRAIN_THREADS": "1", **storage.endpoint_env()}})
    t0 = time.time()
    try:
        _, result = run_training(cfg, num_workers=2, cpus_per_worker=1, max_failures=1)
    finally:
        ray.shutdown()
    took = time.time() - t0
    final = storage.fetch(storage.join(out_uri, "final"))
    state = json.loads(storage.read_text(storage.join(out_uri, "epoch-2", "state.json")))
    return {"seconds": round(took, 1), "final": str(final), "epoch": result.metrics.get("epoch"),
            "history": state["history"], "ranks": state["ranks"], "at_uri": storage.listdir(out_uri)}


if __name__ == "__main__":
    summary = main(sys.argv[1], str(Path(sys.argv[2]).resolve()))
    print(json.dumps(summary))
