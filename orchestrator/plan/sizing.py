"""What a profile needs of its nodes and its storage, estimated from the shapes (orchestrator/plan/costs.py),
not measured; torch-free. The memory one training GPU needs, per backbone, refuses a profile whose
GPUs cannot hold it (``resources.gpu_memory_gib``) before any work, with the numbers; the feature
cache's size picks the features mode (``data.feature_mode: auto`` against ``data.feature_storage_gib``).

Per GPU, for one training worker of a trial:

- drafter states (ZeRO's accounting): weights and gradients in the training precision (2 bytes in
  bf16) and the optimizer's float32 master weights and Adam m, v (12 bytes); ZeRO-1 shards the 12
  over the ranks, ZeRO-2 the gradients too. DeepSpeed's gradient bucket (reduce_bucket_size, its
  default 5e8 elements: the trainer sets none) comes on top.
- the verifier, whole, in its dtype: every training worker loads it (workers/train_worker.py), in
  online mode to compute features and in cached mode for its embedding and LM head.
- activations of the largest micro-batch (``batch_plan``'s per-worker batch x ``data.max_length``,
  every position an assistant token): per pass (HASS: ``hass_steps``; EAGLE-3: its 7 TTT steps) each
  row keeps ``ACT_PER_ROW`` bytes of layer activations and 8 bytes per head row (the float32
  log-softmax and target the loss saves: 128,256 for Llama-3's full vocabulary); EAGLE-3 also holds
  the float32 target distribution of the batch; one pass's head in flight (10 bytes per row per head
  row) on top. In online mode the verifier's own pass (``FEATURE_BATCH_TOKENS`` tokens of bf16 and
  float32 logits) runs between steps: the larger of the two counts. Attention is taken as
  memory-efficient SDPA (CUDA): no score matrix is kept.
- ``RUNTIME_BYTES``: the CUDA context, cuBLAS and NCCL workspaces and the allocator's slack.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from common.dtypes import nbytes
from drafters.train.config import weight_bytes
from orchestrator.grid import corpora
from orchestrator.plan import feature_modes
from orchestrator.plan.costs import (
    ASSUMPTIONS,
    EAGLE3_TTT_STEPS,
    GIB,
    VERIFIERS,
    drafter_params,
    feature_bytes_per_token,
    head_rows,
)
from orchestrator.profile.batch import batch_plan
from orchestrator.profile.errors import ProfileError
from orchestrator.profile.load import read_profile
from orchestrator.profile.schema import Profile

RUNTIME_BYTES = 2 * GIB  # an assumption, not measured here
BUCKET_ELEMENTS = 5e8  # DeepSpeed's reduce_bucket_size default
FEATURE_BATCH_TOKENS = 4096  # drafters.features.verifier_features' batch_tokens
# bytes of layer activations one row keeps per pass in bf16, as (x hidden, x intermediate): counted
# on the real modules by tests/test_costs.py (the tensors autograd saves, weights excluded)
ACT_PER_ROW = {"eagle2": (36, 8), "eagle3": (54, 8)}
LARGER_NODE = "A100 80GB: p4de.24xlarge"


@dataclass(frozen=True)
class TrainMemory:
    """One backbone's estimate; ``parts`` in bytes."""

    backbone: str
    micro_batch: int
    max_length: int
    params: int
    parts: dict

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    def describe(self) -> str:
        p = {k: v / GIB for k, v in self.parts.items()}
        return (f"{self.backbone} {self.total / GIB:.1f} GiB = drafter states {p['states']:.1f} "
                f"({self.params / 1e6:,.0f} M params) + verifier {p['verifier']:.1f} + activations "
                f"{p['activations']:.1f} (micro-batch {self.micro_batch} x {self.max_length:,} tokens) + "
                f"buffers {p['buffers']:.1f}")


def _states(params: int, precision: str, deepspeed: bool, zero_stage: int, ranks: int) -> tuple[float, float]:
    """(weights + gradients + optimizer state, DeepSpeed's gradient bucket) in bytes per GPU."""
    w = weight_bytes(precision, deepspeed)  # plain bf16: float32 weights under autocast
    k = 12 if deepspeed and (precision == "bf16" or zero_stage >= 1) else 8
    shard_k = ranks if deepspeed and zero_stage >= 1 else 1
    shard_g = ranks if deepspeed and zero_stage >= 2 else 1
    bucket = min(params, BUCKET_ELEMENTS) * w if deepspeed and zero_stage >= 1 else 0.0
    return params * w + params * w / shard_g + params * k / shard_k, bucket


def kept_bytes(v: dict, backbone: str, rows: int, precision: str = "bf16", draft_vocab: int | None = None,
               passes: int = 1) -> float:
    """Bytes the loss's forward keeps for the backward over ``rows`` rows and ``passes`` passes: layer
    activations (``ACT_PER_ROW``) and the float32 log-softmax and target over the head's rows."""
    a, b = ACT_PER_ROW["eagle3" if backbone == "eagle3" else "eagle2"]
    scale = nbytes(precision) // nbytes("bf16")  # ACT_PER_ROW is in bf16
    return passes * rows * (scale * (a * v["hidden"] + b * v["intermediate"]) + 8 * head_rows(v, draft_vocab))


def _activations(v: dict, backbone: str, micro_batch: int, max_length: int, precision: str, online: bool,
                 draft_vocab: int | None, hass_steps: int, ttt_steps: int) -> float:
    rows, n = micro_batch * (max_length - 1), head_rows(v, draft_vocab)
    passes = ttt_steps if backbone == "eagle3" else hass_steps if backbone == "hass" else 1
    kept = kept_bytes(v, backbone, rows, precision, draft_vocab, passes)
    targets = 4 * micro_batch * max_length * n if backbone == "eagle3" else 0
    step = kept + targets + 10 * rows * n
    verifier_pass = 10 * FEATURE_BATCH_TOKENS * v["vocab"] if online else 0
    return max(step, verifier_pass)


def train_memory(v: dict, backbone: str, *, micro_batch: int, max_length: int, precision: str = "bf16",
                 deepspeed: bool = True, zero_stage: int = 2, ranks: int = 1,
                 verifier_dtype: str = "bfloat16",
                 online: bool = True, draft_vocab: int | None = None, hass_steps: int = 3,
                 ttt_steps: int = EAGLE3_TTT_STEPS) -> TrainMemory:
    """Memory per GPU of one training worker of ``backbone`` for verifier ``v`` (module docstring)."""
    params = drafter_params(v, backbone, draft_vocab)
    states, bucket = _states(params, precision, deepspeed, zero_stage, ranks)
    acts = _activations(v, backbone, micro_batch, max_length, precision, online, draft_vocab, hass_steps,
                        ttt_steps)
    parts = {"states": states, "verifier": v["params"] * nbytes(verifier_dtype), "activations": acts,
             "buffers": bucket + RUNTIME_BYTES}
    return TrainMemory(backbone, micro_batch, max_length, params, {k: float(x) for k, x in parts.items()})


def _for(p: Profile, backbone: str, v: dict, batch_size: int | None = None) -> TrainMemory:
    t = p.train.for_backbone(backbone)
    if batch_size is not None:
        t = dataclasses.replace(t, batch_size=batch_size)
    return train_memory(
        v, backbone, micro_batch=batch_plan(p, t).per_worker, max_length=p.data.max_length,
        precision=t.precision, deepspeed=t.deepspeed, zero_stage=t.zero_stage,
        ranks=p.resources.train.num_workers,
        verifier_dtype=p.verifier_dtype or "bfloat16", online=p.data.feature_mode == "online",
        draft_vocab=t.draft_vocab, hass_steps=t.hass_steps)


def profile_memory(p: Profile) -> dict[str, TrainMemory]:
    """Per trained backbone of ``p``; empty when training is not on GPUs or the verifier's shape is
    unknown (a local directory or hub id: nothing invented for it)."""
    v = VERIFIERS.get(p.verifier)
    if v is None or not p.resources.train.use_gpu:
        return {}
    return {b: _for(p, b, v) for b in p.train.backbones}


def _smaller(p: Profile, m: TrainMemory, cap: float) -> TrainMemory | None:
    """The same backbone at the largest smaller micro-batch that fits ``cap`` bytes, if any."""
    v = VERIFIERS[p.verifier]
    for b in range(m.micro_batch - 1, 0, -1):
        try:
            smaller = _for(p, m.backbone, v, batch_size=b)
        except ProfileError:  # a per-worker batch the global batch cannot be split into
            continue
        if smaller.total <= cap:
            return smaller
    return None


def memory_problem(p: Profile) -> str | None:
    """One line when a trained backbone needs more than ``resources.gpu_memory_gib`` per GPU: each
    backbone's figures, the micro-batch that would fit (gradient accumulation keeps the global
    batch) and the GPU memory that would hold it as configured. None when it fits or is unchecked."""
    cap = p.resources.gpu_memory_gib
    mem = profile_memory(p)
    if cap is None or not mem:
        return None
    over = [m for m in mem.values() if m.total > cap * GIB]
    if not over:
        return None
    fixes = []
    for m in over:
        s = _smaller(p, m, cap * GIB)
        if s is not None:
            fixes.append(f"train.per_backbone.{m.backbone}.batch_size={s.micro_batch} ({s.total / GIB:.1f} "
                         "GiB)")
    need = math.ceil(max(m.total for m in over) / GIB)
    fix = (f"set {' and '.join(fixes)}, or " if fixes
           else "") + f"use GPUs with >= {need} GiB ({LARGER_NODE})"
    return (f"resources.gpu_memory_gib {cap:g}: training needs more per GPU (estimate): "
            + "; ".join(m.describe() for m in over) + f"; {fix}")


# ---------------------------------------------------------------- the feature cache and the features mode
def feature_cache_bytes(p: Profile) -> dict | None:
    """The cached features of ``p``'s corpora (n + heldout examples at ASSUMPTIONS' tokens per
    example, capped by max_length): {"hidden": the LM head's input and top-10, "aux": EAGLE-3's three
    aux layers (one cache per corpus serves every backbone), "total"} in bytes; None for a verifier
    of unknown shape."""
    v = VERIFIERS.get(p.verifier)
    if v is None:
        return None
    tpe = ASSUMPTIONS["tokens_per_example"]
    tokens = sum((p.data.n + p.data.heldout) * min(tpe[c], p.data.max_length) for c in corpora(p))
    hidden = tokens * feature_bytes_per_token(v, False)
    total = tokens * feature_bytes_per_token(v, "eagle3" in p.train.backbones)
    return {"tokens": tokens, "hidden": hidden, "aux": total - hidden, "total": total}


def _tib(b: float) -> str:
    return f"{b / (1 << 40):.2f} TiB"


def _size(c: dict) -> str:
    return (f"a cache would take {_tib(c['total'])} (hidden states and top-10 {_tib(c['hidden'])}"
            + (f" + EAGLE-3's three aux layers {_tib(c['aux'])}" if c["aux"] else "") + ")")


def feature_mode_reason(p: Profile, mode: str | None = None) -> str:
    """Why ``p`` computes features the way it does (``mode``: the one asked, default the profile's):
    the cache estimate against ``data.feature_storage_gib``."""
    mode = mode or p.data.feature_mode
    c, budget = feature_cache_bytes(p), p.data.feature_storage_gib
    if c is None:
        return f"{mode} (data.feature_mode; no size constants for verifier {p.verifier!r})"
    size = _size(c)
    if budget is None:
        return f"{mode} (data.feature_mode; {size}; no data.feature_storage_gib budget set)"
    fits = c["total"] <= budget * GIB
    rel = f"{'within' if fits else 'over'} data.feature_storage_gib {budget:,.0f} GiB"
    cost = _by_cost(p)
    if mode == "cached":
        return f"cached: {size}, {rel}; features computed once, not in every epoch of every trial{cost}"
    if fits:  # an explicit online, or auto's choice by cost
        return f"online: {size}, {rel}{cost}: data.feature_mode auto would pick {_cost_choice(p)}"
    return f"online: {size}, {rel}; features recomputed inside training"


def _costed(p: Profile) -> bool:
    """The features mode's cost is modelled (orchestrator/plan/feature_modes.py): GPU training, known
    shapes."""
    return p.resources.train.use_gpu and p.verifier in VERIFIERS


def _cost_choice(p: Profile) -> str:
    """The cheaper mode by the cost model, or cached (the cache fits) where it is not modelled."""
    return feature_modes.choose(p) if _costed(p) else "cached"


def _by_cost(p: Profile) -> str:
    if not _costed(p):
        return ""
    t = feature_modes.totals(p)
    return (f"; by cost (GPU-h of compute and shard reads, orchestrator/plan/feature_modes.py): cached "
            f"{t['cached']:,.1f} (extraction included), online {t['online']:,.1f}")


def resolve_feature_mode(p: Profile) -> Profile:
    """``data.feature_mode: auto`` made cached or online: online when the cache estimate is over
    ``data.feature_storage_gib``, else the cheaper of the two by the cost model (a GPU profile of known
    shape, orchestrator/plan/feature_modes.py), else cached; an explicit cached over the budget is refused
    (ProfileError)."""
    d = p.data
    if d.feature_mode != "auto" and (d.feature_mode != "cached" or d.feature_storage_gib is None):
        return p
    c = feature_cache_bytes(p)
    if d.feature_mode == "auto" and (c is None or d.feature_storage_gib is None):
        raise ProfileError("data.feature_mode auto needs data.feature_storage_gib and a verifier of known "
                           "shape "
                           f"({sorted(VERIFIERS)}); got budget {d.feature_storage_gib!r}, verifier "
                           f"{p.verifier!r}",
                           "data.feature_mode")
    if c is None:
        return p
    fits = c["total"] <= d.feature_storage_gib * GIB
    if d.feature_mode == "cached" and not fits:
        raise ProfileError(f"data.feature_mode cached: {_size(c)}, over data.feature_storage_gib "
                           f"{d.feature_storage_gib:,.0f} GiB; raise the budget or use online (or auto)",
                           "data.feature_storage_gib")
    if d.feature_mode == "cached":  # explicit, within the budget: kept whatever the cost says
        return p
    # self_distill: cached only
    mode = ("cached" if d.self_distill else _cost_choice(p)) if fits else "online"
    if mode == "online" and d.self_distill:
        raise ProfileError("data.self_distill needs cached features, but data.feature_mode auto picks "
                           "online: "
                           f"{feature_mode_reason(p, mode)}", "data.feature_storage_gib")
    return dataclasses.replace(p, data=dataclasses.replace(d, feature_mode=mode))


def load_profile(name_or_path: str, overrides: list[str] = ()) -> Profile:
    """A profile read and checked (orchestrator/profile/), its ``data.feature_mode: auto`` made cached or
    online by the cache estimate (:func:`resolve_feature_mode`): the profile every run and dry run uses."""
    return read_profile(name_or_path, overrides, finish=resolve_feature_mode)
