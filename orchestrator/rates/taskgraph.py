"""A profile's grid as a task graph timed with :class:`Rates`, for ``makespan.schedule``, and the
timings derived from the same scaling rules (eval slowdown under GPU packing, optimizer step
seconds, the order trials are submitted in, the profile's own concurrency)."""
from __future__ import annotations

import math

from drafters.corpora import CORPUS_OF

from .. import packing
from ..costs import ASSUMPTIONS, VERIFIERS, train_flops_per_token
from ..grid import BENCHMARK_SIZES, cell_prompts, corpora, eval_cells, merge_cells, train_cells
from ..makespan import Task
from ..plan import actors_per_gpu
from ..profile import Profile, batch_plan
from .record import Rates, _device, devices_per_task

TURNS = {"mt_bench": 2}  # turns per prompt (every other benchmark: 1)


def _for(table: dict, strategy: str) -> float:
    if strategy in table:
        return table[strategy]
    if "*" in table:
        return table["*"]
    vals = [x for k, x in table.items() if k != "autoregressive"]
    if not vals:
        raise ValueError(f"the rates have no speculative strategy measured, needed for {strategy!r}")
    return sum(vals) / len(vals)


def _tokens_per_turn(r: Rates, bench: str, max_new: int) -> float:
    if r.max_new_tokens == max_new and bench in r.tokens_per_turn:
        return r.tokens_per_turn[bench]
    return min(max_new, ASSUMPTIONS["generated_tokens_per_turn"])


def _check(p: Profile, r: Rates, need: dict) -> None:
    """Every refusal before any task is built, each one line (ValueError)."""
    if r.verifier != p.verifier:
        raise ValueError(f"the rates were measured with verifier {r.verifier!r}; "
                         f"profile {p.name!r} uses {p.verifier!r}")
    if r.device != _device(p):
        raise ValueError(f"the rates are {r.device.upper()} rates ({r.hardware}); profile {p.name!r} runs on "
                         f"{_device(p).upper()}s")
    zero = [k for k, v in need.items() if not v and (k != "features" or p.data.feature_mode != "online")]
    if zero:
        raise ValueError(f"profile {p.name!r} gives the {', '.join(zero)} stage(s) no {_device(p).upper()}: "
                         "nothing to scale the rates by")
    missing = sorted(set(p.train.backbones) - set(r.train_tokens_per_s))
    if missing:
        raise ValueError(f"the rates from {r.source} have no training rate for backbone(s) {missing}")
    if p.data.feature_mode != "online" and not r.features_tokens_per_s:
        raise ValueError(f"the rates from {r.source} have no features rate; use a run that extracted features")
    if not math.isfinite(r.generate_tokens_per_s or float("nan")):
        raise ValueError(f"the rates from {r.source} have no generate rate (no autoregressive or paired cells)")


def tasks(p: Profile, r: Rates) -> list[Task]:
    """The grid's tasks (features per corpus, a trial per drafter, merges, eval shards, the
    report), each timed with ``r`` and holding the devices ``p`` gives it."""
    need = devices_per_task(p)
    _check(p, r, need)
    out: list[Task] = []
    online = p.data.feature_mode == "online"
    tpe = {c: min(r.tokens_per_example.get(c, t), p.data.max_length)
           for c, t in ASSUMPTIONS["tokens_per_example"].items()}
    for c in [] if online else corpora(p):
        rate = r.features_tokens_per_s * need["features"] / r.features_devices
        seconds = r.features_overhead_s + (p.data.n + p.data.heldout) * tpe[c] / rate
        out.append(Task(f"features:{c}", "features", seconds, need["features"]))
    for cell in train_cells(p):
        toks = trial_tokens(cell.variant, p.data.n, tpe) * p.train.for_backbone(cell.backbone).epochs
        rate = r.train_tokens_per_s[cell.backbone] * need["train"] / r.train_devices
        deps = () if online else tuple(f"features:{c}" for c in CORPUS_OF[cell.variant])
        seconds = r.train_overhead_s + toks / rate
        out.append(Task(f"train:{cell.name}", "train", seconds, need["train"], deps, "train"))
    trained = {t.name for t in out}
    for m in merge_cells(p):
        deps = tuple(d for d in (f"train:{m.backbone}-math", f"train:{m.backbone}-chat") if d in trained)
        out.append(Task(f"merge:{m.name}", "merge", r.merge_s, 0, deps, "merge"))
    made = {t.name.split(":", 1)[1]: t.name for t in out if t.stage in ("train", "merge")}
    slow = eval_slowdown(p, r)
    size = p.eval.shard_size
    for cell in eval_cells(p):
        k = min(cell_prompts(p, cell) or BENCHMARK_SIZES[cell.benchmark], BENCHMARK_SIZES[cell.benchmark])
        toks = TURNS.get(cell.benchmark, 1) * _tokens_per_turn(r, cell.benchmark, p.eval.max_new_tokens)
        gen = toks / r.generate_tokens_per_s * slow(1 / r.generate_tokens_per_s)
        if cell.strategy == "autoregressive":  # the project's loop, then generate on the same prompt
            ar = r.eval_steps_per_s.get("autoregressive", r.generate_tokens_per_s)
            per_prompt = toks / ar * slow(1 / ar) + gen
        else:
            steps = _for(r.eval_steps_per_s, cell.strategy)
            per_prompt = toks / _for(r.eval_tau, cell.strategy) / steps * slow(1 / steps)
            per_prompt += gen if p.eval.paired_baseline else 0.0
        deps = tuple(made[d] for d in cell.drafters if d in made)
        for s in range(0, k, size):
            m = min(size, k - s)
            out.append(Task(f"eval:{cell.key}:{s}", "eval", r.eval_overhead_s + m * per_prompt,
                            need["eval"], deps, "eval"))
    out.append(Task("report", "report", r.report_s, 0, tuple(t.name for t in out if t.stage == "eval")))
    return out


def packing_model(p: Profile, r: Rates) -> dict:
    """The GPU packing model of ``r`` (orchestrator/packing.py): its own (an estimate, or fitted to a
    GPU check's packing rows), else estimated from the step it measured and the bytes a step reads
    at its hardware's bandwidth."""
    if r.packing:
        return r.packing
    t = 1.0 / _for(r.eval_steps_per_s, "single")
    return packing.estimate(t, f"measured: {r.source}" if r.measured else r.source, VERIFIERS.get(p.verifier),
                            packing.DTYPE_BYTES[p.verifier_dtype], p.eval.tree.depth, r.hardware)


def eval_slowdown(p: Profile, r: Rates):
    """t -> how many times longer an eval actor's step of ``t`` seconds (at the rates' own eval
    devices) takes at ``p``'s: on a CPU profile the ratio of CPUs (linear); on a GPU profile the
    packing model's step at ``p``'s actors per GPU over the measuring run's (an actor holding a
    whole GPU or more decodes at batch 1 on one device: no faster)."""
    need = devices_per_task(p)["eval"]
    if r.device != "gpu":
        return lambda t: r.eval_devices / need
    d = packing_model(p, r)["t_dev_s"]
    k_p, k_m = max(1, actors_per_gpu(need)), max(1, actors_per_gpu(r.eval_devices))
    return lambda t: packing.step_time(t, min(d, t), k_p) / packing.step_time(t, min(d, t), k_m)


def eval_hold_factor(p: Profile, r: Rates) -> float:
    """GPU-seconds an eval actor of ``p`` holds per second of one unpacked actor's step: its GPU
    share x its packed step's slowdown (1 for an unpacked one-GPU actor), at ``r``'s step."""
    g = p.resources.eval.num_gpus
    return g * eval_slowdown(p, r)(1.0 / _for(r.eval_steps_per_s, "single")) if g else 0.0


def optimizer_step_seconds(p: Profile, r: Rates) -> dict:
    """Seconds one optimizer step of a training trial takes at ``r``, per (backbone, corpus): the
    global batch's tokens (tokens per example of the corpus, capped by data.max_length) over the
    trial's rate, scaled to its devices as :func:`tasks` scales it. What ``train.checkpoint_every``
    is sized by (a lost node costs the steps since the last checkpoint)."""
    need = devices_per_task(p)
    examples = {b: batch_plan(p, p.train.for_backbone(b)).global_batch for b in p.train.backbones}
    tpe = {c: min(r.tokens_per_example.get(c, t), p.data.max_length)
           for c, t in ASSUMPTIONS["tokens_per_example"].items()}
    return {(b, c): examples[b] * tpe[c] / (r.train_tokens_per_s[b] * need["train"] / r.train_devices)
            for b in p.train.backbones for c in tpe}


def trial_tokens(variant: str, n: int, tpe: dict) -> float:
    """Tokens one epoch of a drafter variant reads (mixed_half: n/2 examples of each corpus)."""
    per = n // 2 if variant == "mixed_half" else n
    return sum(per * tpe[c] for c in CORPUS_OF[variant])


def trial_order(p: Profile, names: list[str]) -> list[str]:
    """Training cells ``names`` ("<backbone>-<variant>") longest first: by tokens x epochs x
    training FLOPs per token (the verifier's forward too in online mode), the sizes of the profile's
    verifier or, unknown, SmolLM2's. The driver submits trials in this order, so that a long one
    does not start last (the dry run's scheduler starts the longest first too)."""
    v = VERIFIERS.get(p.verifier) or VERIFIERS["smollm2-135m-instruct"]
    tpe = {c: min(t, p.data.max_length) for c, t in ASSUMPTIONS["tokens_per_example"].items()}
    online = 2 * v["params"] if p.data.feature_mode == "online" else 0

    def cost(name: str) -> float:
        backbone, variant = name.split("-", 1)
        t = p.train.for_backbone(backbone)
        return trial_tokens(variant, p.data.n, tpe) * t.epochs * (
            train_flops_per_token(v, backbone, t.hass_steps) + online)

    return sorted(names, key=lambda n: (-cost(n), n))


def caps(p: Profile) -> dict:
    """The profile's own concurrency: its caps, as if the cluster held them all."""
    r = p.resources
    return {"train": r.train.max_concurrent_trials, "eval": r.eval_actors, "merge": 1}


def profile_devices(p: Profile) -> int:
    """Devices the profile uses at its own concurrency (its widest stage)."""
    need = devices_per_task(p)
    r = p.resources
    return int(math.ceil(max(need["features"], need["train"] * r.train.max_concurrent_trials,
                             need["eval"] * r.eval_actors)))

