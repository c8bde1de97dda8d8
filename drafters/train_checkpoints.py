"""A training run's checkpoints under ``out_dir``: ``epoch-E`` after epoch E and ``step-E-B`` after
B micro-batches of epoch E (drafters/checkpoint.py names and orders them), each the drafter's own
checkpoint plus every rank's optimizer shard and noise generator and a ``state.json``; complete once
``state.json`` is there. A resumed run restores all of it and takes the steps the uninterrupted run
takes. ``final`` is the last one's drafter, without the resume state."""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from .checkpoint import latest_checkpoint, load_any, save_any, stale_checkpoints
from .collectives import gather, weights_digest
from .train_config import TrainConfig

RESUME_FILES = ("deepspeed", "optimizer.pt", "rng.pt")  # what a checkpoint holds beyond the drafter


def latest_dir(out: Path) -> Path | None:
    """The latest complete checkpoint (epoch or step) under ``out``."""
    name = latest_checkpoint(p.name for p in out.iterdir() if (p / "state.json").is_file())
    return out / name if name else None


@dataclass
class RunCheckpoints:
    """One rank's view of the run's checkpoints: what it writes and what it restores."""

    out: Path
    model: torch.nn.Module  # the runner's module
    dcfg: object  # the drafter config (DrafterConfig or Eagle3Config)
    cfg: TrainConfig
    runner: object  # drafters/runners.py
    rank: int
    world: int
    gen: torch.Generator  # the rank's feature-noise generator

    def save(self, name: str, history: list, state: dict, step: int) -> Path:
        """Checkpoint ``name``: weights, every rank's optimizer shard and noise generator, then
        state.json (``state`` + history + config + each rank's micro-batch count and weights digest);
        renamed into place whole, on rank 0, which then drops the checkpoints this one makes stale
        (none of them is being uploaded: the trainer settles every upload before it saves).
        Ranks that ran different step counts or hold different weights stop the run here."""
        out, cfg = self.out, self.cfg
        d, tmp = out / name, out / f".{name}.tmp"
        mine = {"rng": self.gen.get_state(), "micro_batches": step,
                "weights": weights_digest(self.model.state_dict())}
        every = gather(mine, self.world)  # every rank, before rank 0 touches tmp
        rngs, ranks = [e.pop("rng") for e in every], every
        if len({(r["micro_batches"], r["weights"]) for r in ranks}) > 1:
            raise RuntimeError(f"ranks diverged before checkpoint {name}: {ranks}")
        if self.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            training = {"variant": cfg.variant, "epoch": state["epoch"], "lr": cfg.lr,
                        "batch_size": cfg.batch_size, "history": history}
            save_any(self.model, tmp, dataclasses.replace(self.dcfg, training=training))
            torch.save(rngs, tmp / "rng.pt")
        self.runner.save_state(tmp)  # every rank writes its optimizer shard (ZeRO)
        if self.rank == 0:
            record = {**state, "history": history, "config": asdict(cfg), "ranks": ranks}
            (tmp / "state.json").write_text(json.dumps(record, default=str))
            shutil.rmtree(d, ignore_errors=True)
            os.replace(tmp, d)  # the checkpoint exists only once complete
            done = [p.name for p in out.iterdir() if (p / "state.json").is_file()]
            for stale in stale_checkpoints(done, cfg.keep_checkpoints):
                shutil.rmtree(out / stale, ignore_errors=True)
        return d

    def restore(self, d: Path) -> tuple[int, list, dict | None]:
        """Weights, optimizer state and (same rank count) this rank's noise generator from checkpoint
        ``d``. Returns (epochs completed, history, position inside the next epoch or None)."""
        self.model.load_state_dict(load_any(d).state_dict())
        self.runner.load_state(d)
        state = json.loads((d / "state.json").read_text())
        rngs = torch.load(d / "rng.pt") if (d / "rng.pt").is_file() else []
        if len(rngs) == self.world:  # (else, or with no rng.pt, the generator starts at the seed)
            self.gen.set_state(rngs[self.rank])
        return state["epoch"], state["history"], state.get("position")

    def finalize(self) -> Path:
        """out/final: the latest checkpoint's drafter without its resume state (written by rank 0)."""
        final = self.out / "final"
        if self.rank == 0:
            tmp = self.out / ".final.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.copytree(latest_dir(self.out), tmp, ignore=shutil.ignore_patterns(*RESUME_FILES))
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
        return final
