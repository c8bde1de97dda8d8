"""A training run whose checkpoints go to an output URI as a Ray Train worker's do
(workers/train_worker.py: artifacts.prepare, Uploads in the background, publish_final), in process
and on one rank, for tests/test_faults.py. Run as a script it trains and kills itself mid-upload:

    python tests/upload_job.py CONFIG_JSON KILL_AT THREADS

(TrainConfig fields as JSON; KILL_AT: the checkpoint whose upload the process is SIGKILLed in, after
its first file is at the URI, as a node that dies or is preempted mid-upload; THREADS: torch's
threads, the caller's, so the weights match what the caller trains bit for bit.)
"""
from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout

from common import storage  # noqa: E402


def train_uploading(cfg, model) -> Path:
    """Train ``cfg`` (with ``out_uri``) as one Ray Train rank does; returns the local final."""
    from drafters.train.loop import train
    from workers import artifacts

    cfg = artifacts.prepare(cfg, 0)
    uploads = artifacts.Uploads.for_rank(cfg, 0, 0, 1)
    with uploads:
        final = train(cfg, model, report=lambda metrics, d: uploads.start(d), saved=uploads.start,
                      settle=uploads.settle)
    artifacts.publish_final(cfg, final, 0)
    return final


def _killed_in(name: str):
    real = storage.sync

    def sync(src, dst, exclude=(), **kw):
        if "state.json" in exclude and Path(src).name.removeprefix(".").removesuffix(".tmp") == name:
            first = sorted(p for p in Path(src).rglob("*") if p.is_file())[0]
            real(str(first), storage.join(dst, str(first.relative_to(src))))
            os.kill(os.getpid(), signal.SIGKILL)  # the rest of the checkpoint never arrives
        return real(src, dst, exclude=exclude, **kw)

    return sync


def main() -> None:
    import torch

    from decoding.verifiers import load_verifier
    from drafters.train.config import TrainConfig

    torch.set_num_threads(int(sys.argv[3]))
    cfg = TrainConfig(**json.loads(sys.argv[1]))
    storage.sync = _killed_in(sys.argv[2])
    train_uploading(cfg, load_verifier(cfg.verifier)[0])
    print("not killed", flush=True)


if __name__ == "__main__":
    main()
