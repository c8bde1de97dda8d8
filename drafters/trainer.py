"""One trainer for every backbone (EAGLE-2, HASS, EAGLE-3), run inside a Ray Train worker or directly.

Per epoch: stream batches from the feature cache (or compute them online with the verifier,
each rank for its own batches only), take optimizer steps (DeepSpeed ZeRO or plain AdamW),
evaluate top-1 agreement with the verifier at depths 1-3 on a held-out slice, and write an atomic
checkpoint (drafter format + optimizer state) that a crashed run resumes from. EAGLE-3's batches,
objective and agreement live in drafters/eagle3_train.py. With
``checkpoint_every`` a checkpoint is also written every N optimizer steps inside an epoch; it
holds the data position and the noise generator too, so the resumed run takes the same steps.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import random
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from . import eagle3_train
from .checkpoint import init_drafter, latest_checkpoint, load_any, save_any, stale_checkpoints
from .config import BACKBONES, DrafterConfig
from .data.templating import TokenizedExample
from .features import FeatureExample, FeatureStore
from .losses import MASK_MODES, aligned_passes, collate, eagle_losses, noise, step_mask
from .shards import rank_plan
from .variants import DataSpec
from .vocab import DraftHead, load_vocab

# train.precision -> the dtype the drafter computes in (DeepSpeed's bf16 engine, or autocast without it)
PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16}
ONLINE_ROOTS = ("online", "online-heldout")  # data entries whose features the verifier computes in the worker
SUMS = ("loss", "base", "batches", "tokens", "rows", "seconds")  # an epoch's running totals (checkpointed)


class TrainingDiverged(RuntimeError):
    pass


@dataclass(frozen=True)
class TrainConfig:
    verifier: str
    backbone: str
    variant: str
    out_dir: str
    train_data: list  # [[store_root, key, [example ids] or None], ...]; root "online" = [online, corpus, ids]
    heldout_data: list = field(default_factory=list)
    epochs: int = 1
    lr: float = 3e-5
    batch_size: int = 8
    grad_accum: int = 1
    warmup_steps: int = 0
    lr_schedule: str = "linear"  # linear: warm up, then decay linearly to 0 (EAGLE/HASS); constant
    grad_clip: float = 0.5
    grad_clip_mode: str = "value"  # value: clamp each gradient entry (EAGLE/HASS); norm: global norm
    seed: int = 0
    hass_steps: int = 3
    vloss_weight: float = 1.0
    ploss_weight: float = 0.1
    topk_weight: float = 1.0
    topk_from: float = 0.5  # HASS two-stage schedule: the top-K term joins after this fraction of the steps
    feature_noise: bool = True
    draft_vocab: str | None = None  # vocabulary file (drafters.vocab.save_vocab); None = full vocabulary
    bucket: bool = True  # length-bucketed batches (little padding); False = batches in stream order
    loss_mask: str = "next"  # next: token t+1 is the assistant's (decode-time positions); reference: EAGLE/HASS's
    deepspeed: bool = True
    zero_stage: int = 1
    precision: str = "fp32"  # fp32 | bf16: the drafter's weights (DeepSpeed) or compute (autocast), and its inputs
    eval_depths: int = 3
    crash_after_epoch: int | None = None  # fault-injection for tests: raise after saving this epoch
    crash_at_step: int | None = None  # fault-injection for tests: raise after this optimizer step (fresh runs)
    checkpoint_every: int | None = None  # also checkpoint every N optimizer steps inside an epoch
    keep_checkpoints: int | None = None  # epoch checkpoints kept (None: all)
    max_seconds: float | None = None  # stop the epoch early (smoke profiles); None = full epochs
    out_uri: str | None = None  # shared copy of out_dir (a URI); the Ray Train worker syncs epochs with it
    verifier_dtype: str | None = None  # the verifier's dtype in the worker (the profile's); None: its default
    online_spec: dict | None = None  # DataSpec fields for "online" entries (features computed in the worker)
    aux_layers: tuple | None = None  # eagle3: the verifier layers it fuses (None: the reference's 2, L/2, L-3)

    def __post_init__(self):
        if self.backbone not in BACKBONES:
            raise ValueError(f"backbone must be one of {list(BACKBONES)}, got {self.backbone!r}")
        if self.epochs < 1 or self.batch_size < 1 or self.grad_accum < 1:
            raise ValueError("epochs, batch_size and grad_accum must be >= 1")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.zero_stage not in (0, 1, 2):
            raise ValueError(f"zero_stage must be 0, 1 or 2, got {self.zero_stage} (ZeRO-3 is refused: held-out "
                             "evaluation and saving run on rank 0, which under ZeRO-3 holds a shard of each weight)")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {list(PRECISIONS)}, got {self.precision!r}")
        if not self.train_data:
            raise ValueError("train_data is empty")
        if self.lr_schedule not in ("linear", "constant"):
            raise ValueError(f"lr_schedule must be linear or constant, got {self.lr_schedule!r}")
        if self.grad_clip_mode not in ("value", "norm"):
            raise ValueError(f"grad_clip_mode must be value or norm, got {self.grad_clip_mode!r}")
        if self.loss_mask not in MASK_MODES:
            raise ValueError(f"loss_mask must be one of {list(MASK_MODES)}, got {self.loss_mask!r}")
        if self.backbone == "eagle3" and self.loss_mask != "next":
            raise ValueError(f"backbone eagle3 trains with loss_mask 'next' only, got {self.loss_mask!r}")
        if self.aux_layers is not None and self.backbone != "eagle3":
            raise ValueError(f"aux_layers is for backbone eagle3, not {self.backbone!r}")
        if not 0.0 <= self.topk_from <= 1.0:
            raise ValueError(f"topk_from must be in [0, 1], got {self.topk_from}")
        for k in ("checkpoint_every", "keep_checkpoints"):
            if getattr(self, k) is not None and getattr(self, k) < 1:
                raise ValueError(f"{k} must be None or >= 1, got {getattr(self, k)}")


class OnlineFeatures:
    """``online`` mode: features computed by the verifier inside the training worker, batch by
    batch, never cached (for verifiers whose full cache would be terabytes). The selection
    (tokenized examples, no verifier pass) is known up front, so batches and ranks are assigned
    before any feature is computed and each rank runs the verifier only on its own batches."""

    def __init__(self, model, tokenizer, spec: dict, aux_layers=None):
        from common.verifiers import eos_token_ids

        from .variants import DataSpec

        self.model, self.tok, self.spec, self.aux_layers = model, tokenizer, DataSpec(**spec), aux_layers
        self.eos = eos_token_ids(model, tokenizer)
        self._examples: dict[str, dict] = {}

    def examples(self, corpus: str, ids, part: str = "train") -> list[TokenizedExample]:
        """The selected examples of ``corpus`` (in selection order, as the cache stores them)."""
        from .variants import select_examples

        if corpus not in self._examples:
            train, held = select_examples(self.tok, self.eos, corpus, self.spec)
            self._examples[corpus] = {"train": train, "heldout": held}
        keep = None if ids is None else set(ids)
        return [e for e in self._examples[corpus][part] if keep is None or e.id in keep]

    def features(self, examples: list[TokenizedExample]) -> list[FeatureExample]:
        """One verifier pass over ``examples`` (the only place online mode runs the verifier)."""
        from .features import verifier_features

        return verifier_features(self.model, examples, aux_layers=self.aux_layers)

    def iter_examples(self, corpus: str, ids, part: str = "train", chunk: int = 8, features: bool = True):
        exs = self.examples(corpus, ids, part)
        if not features:
            yield from exs
            return
        for j in range(0, len(exs), chunk):
            yield from self.features(exs[j : j + chunk])


def _source(root, key, ids, online: OnlineFeatures | None, features: bool = True, file: str | None = None):
    if root in ONLINE_ROOTS:
        if online is None:
            raise ValueError("train_data has 'online' entries but no online feature source was given")
        return online.iter_examples(key, ids, "heldout" if root == "online-heldout" else "train", features=features)
    return FeatureStore(root, key).iter_examples(None if ids is None else set(ids), None if file is None else {file})


def iter_examples(data: list, seed: int | None, buffer: int = 256, online: OnlineFeatures | None = None,
                  features: bool = True):
    """Stream examples from feature stores (or the online source); shard order and a shuffle
    buffer seeded per epoch, so memory stays at about one shard plus the buffer. ``features=False``:
    online entries yield their tokenized examples (no verifier pass); the order depends only on
    the examples' count, so it is the same either way and the same as the cache's. An entry may
    name one shard of its cache (``[root, key, ids, file]``: a rank's own shard, drafters/shards.py)."""
    rng = random.Random(seed) if seed is not None else None
    sources = list(data)
    if rng:
        rng.shuffle(sources)
    buf = []
    for root, key, ids, *file in sources:
        for e in _source(root, key, ids, online, features, *file):
            if rng is None:
                yield e
                continue
            buf.append(e)
            if len(buf) >= buffer:
                yield buf.pop(rng.randrange(len(buf)))
    if rng:
        rng.shuffle(buf)
    yield from buf


def _has_targets(e) -> bool:
    m = e.loss_mask[1:]
    return bool(m.any()) if torch.is_tensor(m) else any(m)


def plan_batches(data, batch_size, seed, online: OnlineFeatures | None = None, bucket: bool = False,
                 pool: int = 16):
    """The epoch's batches as lists of examples, before any online feature is computed (online
    entries are tokenized examples here, cached ones FeatureExamples). ``bucket``: take ``pool``
    batches' worth of (already shuffled) examples, sort them by length, cut batches, and yield
    those in a seeded random order, so a batch pads to similar lengths; every example is used
    once per epoch either way. Only lengths and loss masks decide, so both modes plan alike."""
    rng = random.Random(seed)
    group = []

    def flush(exs):
        if not bucket:
            return [exs[i : i + batch_size] for i in range(0, len(exs), batch_size)]
        exs = sorted(exs, key=lambda e: len(e.input_ids))
        out = [exs[i : i + batch_size] for i in range(0, len(exs), batch_size)]
        rng.shuffle(out)
        return out

    cap = batch_size * (pool if bucket else 1)
    for e in iter_examples(data, seed, online=online, features=False):
        if not _has_targets(e):
            continue
        group.append(e)
        if len(group) == cap:
            yield from flush(group)
            group = []
    if group:
        yield from flush(group)


def batches(data, batch_size, seed, online: OnlineFeatures | None = None, bucket: bool = False, pool: int = 16,
            mask_mode: str = "next", rank: int = 0, world: int = 1, skip: int = 0, collate_fn=collate):
    """Collated batches of rank ``rank`` of ``world``: batch i of the plan goes to rank i % world
    (the same assignment in cached and online mode), and online features are computed for that
    rank's batches only. ``skip``: the rank's first ``skip`` batches are passed over unbuilt (a
    resume inside an epoch). With a plan of N batches the first N % world ranks get one more than
    the others; the training loop drops that remainder (every rank steps N // world times, see
    ``train``), since a rank that steps alone waits forever in its gradient all-reduce.
    Cached data that splits by shards (drafters/shards.py ``rank_plan``) is planned otherwise: the
    rank reads and batches only its own shards, for the step count every rank shares."""
    cached = world > 1 and not any(e[0] in ONLINE_ROOTS for e in data)
    plan = rank_plan(data, world, batch_size) if cached else None
    if plan is not None and plan.sharded:
        groups = _own_groups(plan.data(rank), plan.steps, batch_size, seed, bucket, pool)
        rank, world = 0, 1
    else:
        groups = plan_batches(data, batch_size, seed, online, bucket, pool)
    for i, group in enumerate(groups):
        if i % world != rank:
            continue
        if skip:
            skip -= 1
            continue
        need = [j for j, e in enumerate(group) if isinstance(e, TokenizedExample)]  # online: no features yet
        if need:
            computed = online.features([group[j] for j in need])
            group = list(group)
            for j, f in zip(need, computed):
                group[j] = f
        yield collate_fn(group, mask_mode=mask_mode)


def _own_groups(data, steps: int, batch_size: int, seed, bucket: bool, pool: int):
    """``steps`` batches of a rank's own shards: its plan, then (a rank with fewer batches than the
    others) its plan again in another order, for the batches it lacks."""
    made, again = 0, seed  # the first pass: the plan's own seed
    while made < steps:
        before = made
        for group in plan_batches(data, batch_size, again, bucket=bucket, pool=pool):
            if made == steps:
                return
            yield group
            made += 1
        if made == before:  # nothing with a target in these shards
            return
        again = None if again is None else again + 7919


def count_examples(data: list, online_spec: dict | None = None) -> int:
    """Examples a data list holds (from manifests, id lists or, for an online entry without ids,
    the selection size of ``online_spec``); no shard is read and no feature computed."""
    n = 0
    for root, key, ids in data:
        if ids is not None:
            n += len(ids)
        elif root in ONLINE_ROOTS:
            if online_spec is None:
                raise ValueError("an online data entry without ids needs online_spec to be counted")
            spec = DataSpec(**online_spec)  # select_examples returns exactly n (train) / heldout examples
            n += spec.heldout if root == "online-heldout" else spec.n
        else:
            n += int(FeatureStore(root, key).manifest()["examples"])
    return n


def schedule_steps(cfg: TrainConfig, world: int) -> int:
    """Micro-batches each rank's schedule spans (optimizer steps x grad_accum): epochs x
    ceil(examples / batch_size) with one rank, epochs x (that // world) with more (the remainder
    is dropped, see ``batches``). From counts alone, so warmup, linear decay and HASS's two-stage
    switch are the same in cached and online mode. Cached data split by shards: epochs x the step
    count every rank shares (drafters/shards.py)."""
    if world > 1 and not any(e[0] in ONLINE_ROOTS for e in cfg.train_data):
        return cfg.epochs * rank_plan(cfg.train_data, world, cfg.batch_size).steps
    n_batches = -(-count_examples(cfg.train_data, cfg.online_spec) // cfg.batch_size)
    return cfg.epochs * max(1, n_batches // world)


def lr_factor(step: int, total: int, warmup: int, schedule: str) -> float:
    """Linear warmup over ``warmup`` steps, then (``linear``) linear decay to 0 at ``total``."""
    if warmup and step < warmup:
        return (step + 1) / warmup
    if schedule == "constant" or total <= warmup:
        return 1.0
    return max(0.0, (total - step) / (total - warmup))


def clamp_grads_by_value(model: torch.nn.Module, clip: float) -> list:
    """EAGLE/HASS clip by value (clip_grad_value_). A hook on each parameter clamps its gradient
    as it is produced, so it works under DeepSpeed too (per micro-batch and rank, before the
    reduction; with one rank and no accumulation it equals clip_grad_value_)."""
    return [p.register_hook(lambda g: g.clamp(-clip, clip)) for p in model.parameters() if p.requires_grad]


def compute_loss(cfg: TrainConfig, model, embed, head, batch, generator, use_topk: bool = True):
    """The backbone's objective. EAGLE-2: 1.0 SmoothL1 + 0.1 soft CE. HASS: + 1.0 top-K (once
    ``use_topk``: the second stage of its schedule), summed over ``hass_steps`` alignment passes.
    EAGLE-3: the training-time test (drafters/eagle3_train.py)."""
    if cfg.backbone == "eagle3":
        return eagle3_train.compute_loss(cfg, model, embed, head, batch, PRECISIONS[cfg.precision])
    batch = batch.to(embed.weight.device, PRECISIONS[cfg.precision])  # host-built -> the drafter's device
    feats = noise(batch.features, generator, batch.lengths) if cfg.feature_noise else batch.features
    steps = cfg.hass_steps if cfg.backbone == "hass" else 1
    preds = aligned_passes(model, embed, batch, steps, input_features=feats)
    topk_on = cfg.backbone == "hass" and use_topk
    total, parts = 0.0, {}
    for j, pred in enumerate(preds, 1):
        m = step_mask(batch.mask, j)
        topk = (batch.top_ids, batch.top_probs) if topk_on else (None, None)
        v, p, t, _ = eagle_losses(pred, batch.target, head, m, *topk)
        loss = cfg.vloss_weight * v + cfg.ploss_weight * p + (cfg.topk_weight * t if topk_on else 0.0)
        total = total + loss
        parts[f"vloss_{j}"], parts[f"ploss_{j}"] = float(v.detach()), float(p.detach())
        parts["topk_total"] = parts.get("topk_total", 0.0) + (cfg.topk_weight * float(t.detach()) if topk_on else 0.0)
    return total, parts


@torch.no_grad()
def heldout_metrics(model, embed, head, cfg, online=None) -> dict:
    """Agreement on all held-out sets pooled (``top1_depth{j}``) and on each one
    (``top1_depth{j}_<corpus>``): a specialist is judged on its own domain's held-out set."""
    dtype = PRECISIONS[cfg.precision]
    ev = _evaluate_eagle3 if cfg.backbone == "eagle3" else evaluate
    out = ev(model, embed, head, cfg.heldout_data, cfg.eval_depths, online=online, dtype=dtype)
    if len(cfg.heldout_data) > 1:
        for entry in cfg.heldout_data:
            corpus = entry[1] if str(entry[0]).startswith("online") else str(entry[1]).split("-")[0]
            per = ev(model, embed, head, [entry], cfg.eval_depths, online=online, dtype=dtype)
            out.update({f"{k}_{corpus}": v for k, v in per.items()})
    return out


def evaluate(model, embed, head, data, depths: int = 3, batch_size: int = 8, online=None, dtype=None) -> dict:
    """Top-1 agreement with the verifier's next token at depth 1 (teacher-forced) and depths 2..D
    (rolled out on the drafter's own features), on assistant positions of held-out examples.
    With a reduced draft vocabulary a verifier token outside it counts as a miss. ``dtype``: the
    features' (the training precision; None: the drafter's own weights' dtype)."""
    hits, counts = [0] * depths, [0] * depths
    dtype = dtype or next(model.parameters()).dtype
    model.eval()
    for batch in batches(data, batch_size, None, online):
        batch = batch.to(embed.weight.device, dtype)
        preds = aligned_passes(model, embed, batch, depths)
        for j, pred in enumerate(preds):
            m = step_mask(batch.mask, j + 1)
            sel = m.nonzero(as_tuple=True)
            if not sel[0].numel():
                continue
            a = head.to_verifier(head(pred[sel]).argmax(-1))
            b = batch.top_ids[sel][:, 0]  # the verifier's argmax next token
            hits[j] += int((a == b).sum())
            counts[j] += int(sel[0].numel())
    model.train()
    return {f"top1_depth{j + 1}": hits[j] / counts[j] if counts[j] else float("nan") for j in range(depths)}


def _evaluate_eagle3(model, embed, head, data, depths: int = 3, batch_size: int = 8, online=None, dtype=None):
    """``evaluate`` for EAGLE-3: agreement at TTT depths 1..D (drafters/eagle3_train.py)."""
    it = batches(data, batch_size, None, online, collate_fn=eagle3_train.collate)
    return eagle3_train.agreement(model, embed, it, depths, dtype=dtype)


def _latest(out: Path) -> Path | None:
    """The latest complete checkpoint (epoch or step) under ``out``."""
    name = latest_checkpoint(p.name for p in out.iterdir() if (p / "state.json").is_file())
    return out / name if name else None


def _deepspeed_config(cfg: TrainConfig, world: int) -> dict:
    return {
        "train_micro_batch_size_per_gpu": cfg.batch_size,
        "gradient_accumulation_steps": cfg.grad_accum,
        "train_batch_size": cfg.batch_size * cfg.grad_accum * world,
        "gradient_clipping": cfg.grad_clip if cfg.grad_clip_mode == "norm" else 0.0,  # value: hooks
        "zero_optimization": {"stage": cfg.zero_stage},
        "bf16": {"enabled": cfg.precision == "bf16"},  # the engine casts the module; fp32 master weights
        "steps_per_print": 10**9,
    }


class _Plain:
    """The non-DeepSpeed path (same interface): AdamW + clipping + grad accumulation, one rank.
    bf16: float32 weights (the master copy) under autocast, so the matmuls run in bf16 as under
    DeepSpeed's bf16 engine, whose module holds bf16 weights beside float32 master ones."""

    def __init__(self, model, opt, cfg):
        self.module, self.opt, self.cfg, self.micro = model, opt, cfg, 0

    def autocast(self):
        device = next(self.module.parameters()).device.type
        return torch.autocast(device, dtype=torch.bfloat16, enabled=self.cfg.precision == "bf16")

    def backward(self, loss):
        (loss / self.cfg.grad_accum).backward()

    def step(self):
        self.micro += 1
        if self.micro % self.cfg.grad_accum == 0:
            if self.cfg.grad_clip_mode == "norm":
                torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.cfg.grad_clip)
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)

    def save_state(self, d: Path):
        d.mkdir(parents=True, exist_ok=True)  # a rank > 0 may get here before rank 0 made it
        torch.save(self.opt.state_dict(), d / "optimizer.pt")

    def load_state(self, d: Path):
        self.opt.load_state_dict(torch.load(d / "optimizer.pt"))


def _jit_build_setup() -> None:
    """Build any DeepSpeed JIT op once per Python environment (none is built by training: the CPU
    shm comm op is skipped, import_deepspeed):
    - pip's ninja, next to this Python, first on PATH: a system ninja 1.11 and pip's 1.13 hash
      commands differently, and each rebuilt the other's objects (about a minute of both cores, at
      every switch between a shell's PATH and a Ray worker's);
    - one build directory per ``sys.prefix`` as this process sees it (unless TORCH_EXTENSIONS_DIR
      is set): the build commands carry that path, so one venv reached by two paths (a worktree's
      symlink to it) or two venvs would otherwise rebuild each other's objects at every switch."""
    here = Path(sys.executable).parent
    if (here / "ninja").is_file() and os.environ.get("PATH", "").split(os.pathsep)[0] != str(here):
        os.environ["PATH"] = f"{here}{os.pathsep}{os.environ.get('PATH', '')}"
    if "TORCH_EXTENSIONS_DIR" not in os.environ:
        os.environ["TORCH_EXTENSIONS_DIR"] = str(jit_build_dir())


def jit_build_dir() -> Path:
    """~/.cache/torch_extensions/<python>-<hash of sys.prefix>: this environment's own build dir."""
    tag = hashlib.sha256(sys.prefix.encode()).hexdigest()[:10]
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "torch_extensions"
    return base / f"py{sys.version_info.major}{sys.version_info.minor}-{tag}"


def import_deepspeed():
    """DeepSpeed without the MLflow import its autotuner attempts (``try: import mlflow``): with
    mlflow installed (the tracking extra) that import is most of `import deepspeed`, 3-6 s of every
    training process, for an autotuner nothing here runs. mlflow imports normally afterwards.

    Nor with the CPU accelerator's shm comm op: DeepSpeed's torch backend JIT-compiles it at
    start-up (about a minute of both cores in every new Python environment, so in every fresh
    clone's first training), and it serves only ``inference_all_reduce`` (tensor-parallel inference
    kernels); training reduces gradients through torch.distributed (gloo on CPU) either way. Marked
    incompatible, ``build_shm_op`` returns None and the backend runs without it. (Other accelerators
    have no such op: nothing is marked there.)"""
    _jit_build_setup()
    skip = "mlflow" not in sys.modules
    if skip:
        sys.modules["mlflow"] = None  # `import mlflow` raises ImportError while this is set
    try:
        import deepspeed
    finally:
        if skip and "mlflow" in sys.modules and sys.modules["mlflow"] is None:
            del sys.modules["mlflow"]
    from deepspeed.accelerator import get_accelerator

    shm = get_accelerator().get_op_builder("ShareMemCommBuilder")  # None but on the CPU accelerator
    if shm is not None:  # (reading the table probes every op: ~50 ms here, left alone elsewhere)
        deepspeed.ops.__compatible_ops__[shm.NAME] = False
    return deepspeed


class _DeepSpeed:
    def __init__(self, model, opt, cfg, world):
        deepspeed = import_deepspeed()
        self.engine, self.opt, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=_deepspeed_config(cfg, world))
        self.module = self.engine.module

    def autocast(self):
        return contextlib.nullcontext()  # the engine's module is in the training precision already

    def backward(self, loss):
        self.engine.backward(loss)

    def step(self):
        self.engine.step()

    def save_state(self, d: Path):
        self.engine.save_checkpoint(str(d / "deepspeed"), tag="state")

    def load_state(self, d: Path):
        self.engine.load_checkpoint(str(d / "deepspeed"), tag="state", load_module_strict=True)


def train(cfg: TrainConfig, verifier_model, rank: int = 0, world: int = 1, report=None, tokenizer=None,
          saved=None) -> Path:
    """Train (or resume) one drafter; returns the final checkpoint directory (out_dir/final).
    Every rank calls ``report(metrics, dir)`` after each epoch's checkpoint and ``saved(dir)``
    after each step checkpoint. A resume restores weights, optimizer, each rank's noise generator
    and the data position, so it takes the steps the uninterrupted run takes (same worker count)."""
    if world > 1 and not cfg.deepspeed and _distributed():  # (a simulated rank without a process group: tests)
        raise ValueError(f"deepspeed: false trains without gradient synchronisation; {world} ranks would each "
                         "train their own drafter. Set deepspeed: true (ZeRO 0-2) or use one worker")
    ids = load_vocab(cfg.draft_vocab) if cfg.draft_vocab else None
    eagle3 = cfg.backbone == "eagle3"
    if eagle3:  # its config (the aux layers) and its caches, checked before any work
        dcfg = eagle3_train.drafter_config(cfg, verifier_model, ids)
        eagle3_train.check_data(cfg.train_data + cfg.heldout_data, dcfg)
    else:
        dcfg = DrafterConfig.for_verifier(verifier_model, cfg.verifier, cfg.backbone, seed=cfg.seed,
                                          draft_vocab_size=None if ids is None else int(ids.shape[0]))
    online = OnlineFeatures(verifier_model, tokenizer, cfg.online_spec, dcfg.aux_layers if eagle3 else None) \
        if cfg.online_spec else None
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    embed = verifier_model.get_input_embeddings()
    head = DraftHead(verifier_model.lm_head, ids)
    device = embed.weight.device  # the rank's device: the verifier's
    # every variant of a backbone starts from the same init (merging)
    model = (eagle3_train.init_drafter(dcfg, verifier_model, ids) if eagle3 else init_drafter(dcfg, ids)).to(device)
    if cfg.grad_clip_mode == "value":
        clamp_grads_by_value(model, cfg.grad_clip)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95))
    total_steps = schedule_steps(cfg, world)  # optimizer steps x grad_accum, cached and online alike
    if rank == 0 and world > 1 and not cfg.online_spec:
        print(f"[train {cfg.backbone}-{cfg.variant}] data: "
              f"{rank_plan(cfg.train_data, world, cfg.batch_size).describe()}", flush=True)
    t_init = time.perf_counter()
    runner = _DeepSpeed(model, opt, cfg, world) if cfg.deepspeed else _Plain(model, opt, cfg)
    if rank == 0 and cfg.deepspeed:
        took = time.perf_counter() - t_init
        print(f"[train {cfg.backbone}-{cfg.variant}] DeepSpeed imported and its engine ready in {took:.1f}s",
              flush=True)
    model = runner.module
    gen = torch.Generator(device=device).manual_seed(cfg.seed)  # feature noise, drawn where the batch is
    start, history, pos = 0, [], None
    latest = _latest(out)
    if latest is not None:  # resume after a crash from the latest epoch or step checkpoint
        model.load_state_dict(load_any(latest).state_dict())
        runner.load_state(latest)
        state = json.loads((latest / "state.json").read_text())
        start, history, pos = state["epoch"], state["history"], state.get("position")
        rngs = torch.load(latest / "rng.pt") if (latest / "rng.pt").is_file() else []
        if len(rngs) == world:  # (else, or from a checkpoint without it, the generator starts at the seed)
            gen.set_state(rngs[rank])
    step = sum(h["steps"] for h in history) + (pos["sums"]["batches"] if pos else 0)  # micro-batches
    if latest is None and rank == 0:
        with runner.autocast():
            history.append({"epoch": 0, "steps": 0, **heldout_metrics(model, embed, head, cfg, online)})
    every = (cfg.checkpoint_every or 0) * cfg.grad_accum  # micro-batches between step checkpoints
    save = functools.partial(_save, out, model, dcfg, cfg, runner, rank, world, gen)  # (name, history, state, step)
    for epoch in range(start + 1, cfg.epochs + 1):
        sums = dict(pos["sums"]) if pos else dict.fromkeys(SUMS, 0)  # this epoch so far
        pos, t0, ran = None, time.perf_counter() - sums["seconds"], 0
        it = batches(cfg.train_data, cfg.batch_size, cfg.seed * 1000 + epoch, online, cfg.bucket,
                     mask_mode=cfg.loss_mask, rank=rank, world=world, skip=sums["batches"],
                     collate_fn=eagle3_train.collate if eagle3 else collate)
        while True:
            batch = next(it, None)
            # one decision for all ranks: stop when any rank is out of batches (the plan's remainder
            # is dropped) or when rank 0's clock passes max_seconds (after at least one step)
            late = bool(cfg.max_seconds) and ran > 0 and time.perf_counter() - t0 > cfg.max_seconds
            if not _all_ranks(batch is not None and not (rank == 0 and late), world):
                if batch is not None and not late:
                    print(f"[train {cfg.backbone}-{cfg.variant}] rank {rank}: the epoch's last batch dropped "
                          f"(the plan's batch count is not a multiple of {world} ranks)", flush=True)
                break
            for g in opt.param_groups:
                g["lr"] = cfg.lr * lr_factor(step // cfg.grad_accum, total_steps // cfg.grad_accum,
                                             cfg.warmup_steps, cfg.lr_schedule)
            use_topk = step >= cfg.topk_from * total_steps
            with runner.autocast():
                loss, parts = compute_loss(cfg, model, embed, head, batch, gen, use_topk=use_topk)
            if not torch.isfinite(loss):
                raise TrainingDiverged(f"non-finite loss {float(loss.detach())} at epoch {epoch} step "
                                       f"{sums['batches']}; last good checkpoint kept in {out}")
            runner.backward(loss)
            runner.step()
            # train_loss: what was optimised; train_base_loss: without HASS's top-K term, which joins
            # mid-run (two-stage schedule), so it compares across the stages
            sums["loss"] += float(loss.detach())
            sums["base"] += float(loss.detach()) - parts["topk_total"]
            sums["tokens"] += int(batch.mask.sum())
            sums["rows"] += int(batch.mask.numel())
            sums["batches"] += 1
            step, ran = step + 1, ran + 1
            if every and step % every == 0:
                sums["seconds"] = time.perf_counter() - t0
                state = {"epoch": epoch - 1, "position": {"sums": sums}}
                d = save(f"step-{epoch}-{sums['batches']}", history, state, step)
                if saved is not None:
                    saved(d)
            if cfg.crash_at_step and latest is None and step == cfg.crash_at_step * cfg.grad_accum:
                raise RuntimeError(f"injected crash after optimizer step {cfg.crash_at_step}")
        wall, n = time.perf_counter() - t0, max(sums["batches"], 1)
        metrics = {"epoch": epoch, "steps": sums["batches"], "train_loss": sums["loss"] / n,
                   "train_base_loss": sums["base"] / n, "epoch_seconds": wall,
                   "train_tokens_per_s": sums["tokens"] / wall if wall else 0.0,
                   "loss_token_fraction": sums["tokens"] / max(sums["rows"], 1)}  # loss / padded positions
        if rank == 0:
            with runner.autocast():
                metrics.update(heldout_metrics(model, embed, head, cfg, online))
        history.append(metrics)
        d = save(f"epoch-{epoch}", history, {"epoch": epoch}, step)
        if report is not None:
            report(metrics, d)
        if cfg.crash_after_epoch == epoch:
            raise RuntimeError(f"injected crash after epoch {epoch}")
    final = out / "final"
    if rank == 0:
        tmp = out / ".final.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        state_files = shutil.ignore_patterns("deepspeed", "optimizer.pt", "rng.pt")
        shutil.copytree(_latest(out), tmp, ignore=state_files)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
    return final


def _distributed() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def _all_ranks(go: bool, world: int) -> bool:
    """True iff ``go`` on every rank (one all-reduce of a flag; with one rank, ``go``)."""
    import torch.distributed as dist

    if world == 1 or not _distributed():
        return go
    flag = torch.tensor([int(go)], device="cuda" if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def _gather(obj, world: int) -> list:
    """``obj`` of every rank, in rank order (a collective when torch.distributed is up)."""
    import torch.distributed as dist

    if world == 1 or not (dist.is_available() and dist.is_initialized()):
        return [obj]
    out = [None] * world
    dist.all_gather_object(out, obj)
    return out


def weights_digest(state: dict) -> str:
    """A short SHA-256 of a state dict's names, dtypes and bytes (what two ranks must agree on)."""
    h = hashlib.sha256()
    for k in sorted(state):
        v = state[k].detach().to("cpu").contiguous()
        h.update(f"{k}:{v.dtype}:{tuple(v.shape)}".encode())
        h.update(v.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def _save(out, model, dcfg, cfg, runner, rank, world, gen, name: str, history: list, state: dict,
          step: int) -> Path:
    """Checkpoint ``name``: weights, every rank's optimizer shard and noise generator, then
    state.json (``state`` + history + config + each rank's micro-batch count and weights digest);
    renamed into place whole, on rank 0, which then drops the checkpoints this one makes stale.
    Ranks that ran different step counts or hold different weights stop the run here."""
    d, tmp = out / name, out / f".{name}.tmp"
    mine = {"rng": gen.get_state(), "micro_batches": step, "weights": weights_digest(model.state_dict())}
    every = _gather(mine, world)  # every rank, before rank 0 touches tmp
    rngs, ranks = [e.pop("rng") for e in every], every
    if len({(r["micro_batches"], r["weights"]) for r in ranks}) > 1:
        raise RuntimeError(f"ranks diverged before checkpoint {name}: {ranks}")
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        training = {"variant": cfg.variant, "epoch": state["epoch"], "lr": cfg.lr,
                    "batch_size": cfg.batch_size, "history": history}
        save_any(model, tmp, dataclasses.replace(dcfg, training=training))
        torch.save(rngs, tmp / "rng.pt")
    runner.save_state(tmp)  # every rank writes its optimizer shard (ZeRO)
    if rank == 0:
        text = json.dumps({**state, "history": history, "config": asdict(cfg), "ranks": ranks}, default=str)
        (tmp / "state.json").write_text(text)
        shutil.rmtree(d, ignore_errors=True)
        os.replace(tmp, d)  # the checkpoint exists only once complete
        done = [p.name for p in out.iterdir() if (p / "state.json").is_file()]
        for stale in stale_checkpoints(done, cfg.keep_checkpoints):
            shutil.rmtree(out / stale, ignore_errors=True)
    return d
