"""The training loop and the checkpoints it writes and resumes from.

The training loop, one for every backbone (EAGLE-2, HASS, EAGLE-3), run inside a Ray Train worker
or directly.

Per epoch: stream the rank's batches (drafters/train/data.py: from the feature cache, or computed
online by the verifier, each rank for its own batches only), take optimizer steps on the backbone's
loss (drafters/train/backbones.py) through a runner (drafters/train/runners.py: DeepSpeed ZeRO or
plain AdamW), evaluate top-1 agreement with the verifier at depths 1-3 on a held-out slice, the
ranks sharing its batches (drafters/train/backbones.py), and write an atomic checkpoint (drafter
format + optimizer state) that a crashed run resumes from (drafters/train/loop.py). With
``checkpoint_every`` a checkpoint is also written every N optimizer steps inside an epoch; it holds
the data position and the noise generator too, so the resumed run takes the same steps.

A training run's checkpoints under ``out_dir``: ``epoch-E`` after epoch E and ``step-E-B`` after
B micro-batches of epoch E (drafters/checkpoint.py names and orders them), each the drafter's own
checkpoint plus every rank's optimizer shard and noise generator and a ``state.json``; complete once
``state.json`` is there. A resumed run restores all of it and takes the steps the uninterrupted run
takes. ``final`` is the last one's drafter, without the resume state."""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from drafters.checkpoint import latest_checkpoint, load_any, save_any, stale_checkpoints
from drafters.features import reading_tensors
from drafters.train.backbones import (
    Backbone,
    backbone,
    clamp_grads_by_value,
    compute_loss,
    heldout_metrics,
    lr_factor,
    schedule_steps,
)
from drafters.train.config import TrainConfig
from drafters.train.data import OnlineFeatures, batches
from drafters.train.runners import all_ranks, distributed, gather, make_runner, weights_digest
from drafters.train.shards import rank_plan
from drafters.vocab import DraftHead, load_vocab

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
    runner: object  # drafters/train/runners.py
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


SUMS = ("loss", "base", "batches", "tokens", "rows", "seconds")  # an epoch's running totals (checkpointed)


class TrainingDiverged(RuntimeError):
    pass


@dataclass
class _Run:
    """What one ``train`` call works with: its config and rank, the drafter (the runner's module)
    with the verifier's embedding and head, and its position (micro-batches taken, history)."""

    cfg: TrainConfig
    rank: int
    world: int
    backbone: Backbone
    online: OnlineFeatures | None
    embed: torch.nn.Module
    head: DraftHead
    model: torch.nn.Module
    runner: object  # drafters/train/runners.py
    opt: torch.optim.Optimizer  # the AdamW the runner steps (its learning rate is set per step)
    gen: torch.Generator  # feature noise, drawn where the batch is
    ckpts: RunCheckpoints
    total_steps: int  # micro-batches the schedule spans (optimizer steps x grad_accum)
    history: list = field(default_factory=list)
    step: int = 0  # micro-batches taken, over every epoch
    resumed: bool = False
    settle: object = None  # () -> None: once no checkpoint upload is in flight (train's ``settle``)

    @property
    def tag(self) -> str:
        return f"[train {self.cfg.backbone}-{self.cfg.variant}]"


def train(cfg: TrainConfig, verifier_model, rank: int = 0, world: int = 1, report=None, tokenizer=None,
          saved=None, settle=None) -> Path:
    """Train (or resume) one drafter; returns the final checkpoint directory (out_dir/final).
    Every rank calls ``report(metrics, dir)`` after each epoch's checkpoint, ``saved(dir)`` after
    each step checkpoint and ``settle()`` before it writes a checkpoint and before the final one
    (workers/artifacts.py Uploads: it returns once no upload is in flight, or raises one's failure).
    A resume restores weights, optimizer, each rank's noise generator and the data position, so it
    takes the steps the uninterrupted run takes (same worker count)."""
    if world > 1 and not cfg.deepspeed and distributed():  # (a simulated rank without a process group: tests)
        raise ValueError(f"deepspeed: false trains without gradient synchronisation; {world} ranks would "
                         "each train their own drafter. Set deepspeed: true (ZeRO 0-2) or use one worker")
    run = _start(cfg, verifier_model, rank, world, tokenizer)
    run.settle = settle or (lambda: None)
    with reading_tensors(run.backbone.feature_tensors):  # cached shards: only what the backbone reads
        start, pos = _resume(run)
        for epoch in range(start + 1, cfg.epochs + 1):
            metrics = _epoch(run, epoch, pos, saved)
            pos = None
            run.history.append(metrics)
            d = _save(run, f"epoch-{epoch}", {"epoch": epoch})
            if report is not None:
                report(metrics, d)
            if cfg.crash_after_epoch == epoch:
                raise RuntimeError(f"injected crash after epoch {epoch}")
    run.settle()  # every upload done before the final checkpoint
    return run.ckpts.finalize()


def _save(run: _Run, name: str, state: dict) -> Path:
    """Checkpoint ``name``, once no upload of an earlier one is in flight (rank 0 drops stale ones)."""
    run.settle()
    return run.ckpts.save(name, run.history, state, run.step)


def _start(cfg: TrainConfig, verifier_model, rank: int, world: int, tokenizer) -> _Run:
    """1. The backbone's drafter config (its cached data checked before any work), the online
    feature source, and the seeded drafter on the verifier's device with its optimizer and runner."""
    bb = backbone(cfg.backbone)
    ids = load_vocab(cfg.draft_vocab) if cfg.draft_vocab else None
    dcfg = bb.drafter_config(cfg, verifier_model, ids)
    bb.check_data(cfg.train_data + cfg.heldout_data, dcfg)
    online = OnlineFeatures(verifier_model, tokenizer, cfg.online_spec, bb.feature_layers(dcfg)) \
        if cfg.online_spec else None
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.init_seed)
    embed = verifier_model.get_input_embeddings()
    head = DraftHead(verifier_model.lm_head, ids)
    device = embed.weight.device  # the rank's device: the verifier's
    model = bb.init(dcfg, verifier_model, ids).to(device)  # every variant of a backbone starts here (merging)
    if cfg.grad_clip_mode == "value":
        clamp_grads_by_value(model, cfg.grad_clip)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95))
    total_steps = schedule_steps(cfg, world)  # cached and online alike
    if rank == 0 and world > 1 and not cfg.online_spec:
        print(f"[train {cfg.backbone}-{cfg.variant}] data: "
              f"{rank_plan(cfg.train_data, world, cfg.batch_size).describe()}", flush=True)
    runner = _make_runner(model, opt, cfg, rank, world)
    gen = torch.Generator(device=device).manual_seed(cfg.init_seed)
    ckpts = RunCheckpoints(out, runner.module, dcfg, cfg, runner, rank, world, gen)
    return _Run(cfg, rank, world, bb, online, embed, head, runner.module, runner, opt, gen, ckpts,
                total_steps)


def _make_runner(model, opt, cfg: TrainConfig, rank: int, world: int):
    """The runner, with the time DeepSpeed's import and engine took on rank 0's log."""
    t_init = time.perf_counter()
    runner = make_runner(model, opt, cfg, world)
    if rank == 0 and cfg.deepspeed:
        took = time.perf_counter() - t_init
        print(f"[train {cfg.backbone}-{cfg.variant}] DeepSpeed imported and its engine ready in {took:.1f}s",
              flush=True)
    return runner


def _resume(run: _Run) -> tuple[int, dict | None]:
    """2. Restore the latest epoch or step checkpoint, if any (a crashed run), or evaluate the
    initial drafter (history's epoch 0). Returns (epochs completed, position inside the next)."""
    latest = latest_dir(run.ckpts.out)
    start, pos = 0, None
    if latest is not None:
        start, run.history, pos = run.ckpts.restore(latest)
        run.resumed = True
    run.step = sum(h["steps"] for h in run.history) + (pos["sums"]["batches"] if pos else 0)
    if latest is None:  # every rank: each evaluates its share of the held-out batches
        with run.runner.autocast():
            run.history.append({"epoch": 0, "steps": 0, **_heldout(run)})
    return start, pos


def _heldout(run: _Run) -> dict:
    return heldout_metrics(run.model, run.embed, run.head, run.cfg, run.online, run.rank, run.world)


def _epoch(run: _Run, epoch: int, pos: dict | None, saved) -> dict:
    """3. One epoch (from ``pos`` when resuming inside it): the rank's batches, a step on each,
    step checkpoints; returns the epoch's metrics."""
    cfg = run.cfg
    sums = dict(pos["sums"]) if pos else dict.fromkeys(SUMS, 0)  # this epoch so far
    t0, ran = time.perf_counter() - sums["seconds"], 0
    it = batches(cfg.train_data, cfg.batch_size, cfg.init_seed * 1000 + epoch, run.online, cfg.bucket,
                 mask_mode=cfg.loss_mask, rank=run.rank, world=run.world, skip=sums["batches"],
                 collate_fn=run.backbone.collate)
    while True:
        batch = next(it, None)
        if not _all_go_on(run, batch, ran, t0):
            break
        _step(run, batch, epoch, sums)
        ran += 1
        _after_step(run, epoch, sums, t0, saved)
    return _epoch_metrics(run, epoch, sums, t0)


def _all_go_on(run: _Run, batch, ran: int, t0: float) -> bool:
    """One decision for all ranks: stop when any rank is out of batches (the plan's remainder is
    dropped) or when rank 0's clock passes max_seconds (after at least one step)."""
    cfg = run.cfg
    late = bool(cfg.max_seconds) and ran > 0 and time.perf_counter() - t0 > cfg.max_seconds
    if all_ranks(batch is not None and not (run.rank == 0 and late), run.world):
        return True
    if batch is not None and not late:
        print(f"{run.tag} rank {run.rank}: the epoch's last batch dropped "
              f"(the plan's batch count is not a multiple of {run.world} ranks)", flush=True)
    return False


def _step(run: _Run, batch, epoch: int, sums: dict) -> None:
    """One micro-batch: the scheduled learning rate, the loss (HASS's top-K term from ``topk_from``
    of the schedule on), backward and the runner's step; the epoch's sums updated."""
    cfg = run.cfg
    for g in run.opt.param_groups:
        g["lr"] = cfg.lr * lr_factor(run.step // cfg.grad_accum, run.total_steps // cfg.grad_accum,
                                     cfg.warmup_steps, cfg.lr_schedule)
    use_topk = run.step >= cfg.topk_from * run.total_steps
    with run.runner.autocast():
        loss, parts = compute_loss(cfg, run.model, run.embed, run.head, batch, run.gen, use_topk=use_topk)
    if not torch.isfinite(loss):
        raise TrainingDiverged(f"non-finite loss {float(loss.detach())} at epoch {epoch} step "
                               f"{sums['batches']}; last good checkpoint kept in {run.ckpts.out}")
    run.runner.backward(loss)
    run.runner.step()
    # train_loss: what was optimised; train_base_loss: without HASS's top-K term, which joins
    # mid-run (two-stage schedule), so it compares across the stages
    sums["loss"] += float(loss.detach())
    sums["base"] += float(loss.detach()) - parts["topk_total"]
    sums["tokens"] += int(batch.mask.sum())
    sums["rows"] += int(batch.mask.numel())
    sums["batches"] += 1
    run.step += 1


def _after_step(run: _Run, epoch: int, sums: dict, t0: float, saved) -> None:
    """A step checkpoint every ``checkpoint_every`` optimizer steps (with the epoch's position),
    and the injected crash of fault tests."""
    cfg = run.cfg
    every = (cfg.checkpoint_every or 0) * cfg.grad_accum  # micro-batches between step checkpoints
    if every and run.step % every == 0:
        sums["seconds"] = time.perf_counter() - t0
        state = {"epoch": epoch - 1, "position": {"sums": sums}}
        d = _save(run, f"step-{epoch}-{sums['batches']}", state)
        if saved is not None:
            saved(d)
    if cfg.crash_at_step and not run.resumed and run.step == cfg.crash_at_step * cfg.grad_accum:
        raise RuntimeError(f"injected crash after optimizer step {cfg.crash_at_step}")


def _epoch_metrics(run: _Run, epoch: int, sums: dict, t0: float) -> dict:
    """The epoch's training figures and its held-out agreement (every rank its share of it)."""
    wall, n = time.perf_counter() - t0, max(sums["batches"], 1)
    metrics = {"epoch": epoch, "steps": sums["batches"], "train_loss": sums["loss"] / n,
               "train_base_loss": sums["base"] / n, "epoch_seconds": wall,
               "train_tokens_per_s": sums["tokens"] / wall if wall else 0.0,
               "loss_token_fraction": sums["tokens"] / max(sums["rows"], 1)}  # loss / padded positions
    with run.runner.autocast():
        metrics.update(_heldout(run))
    return metrics
