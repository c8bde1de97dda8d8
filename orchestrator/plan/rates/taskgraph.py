"""A profile's grid as a task graph timed with :class:`Rates`, for ``makespan.schedule``, and the
timings derived from the same scaling rules (eval slowdown under GPU packing, optimizer step
seconds, the order trials are submitted in, the profile's own concurrency)."""
from __future__ import annotations

import math

from drafters.corpora import CORPUS_OF
from orchestrator.grid import BENCHMARK_SIZES, cell_prompts, corpora, eval_cells, merge_cells, train_cells
from orchestrator.plan import packing
from orchestrator.plan.concurrency import actors_per_gpu
from orchestrator.plan.costs import ASSUMPTIONS, VERIFIERS, train_flops_per_token
from orchestrator.plan.makespan import Task
from orchestrator.plan.rates import overheads
from orchestrator.plan.rates.record import Rates, _device, devices_per_task
from orchestrator.profile import Profile, batch_plan

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
        raise ValueError(f"the rates from {r.source} have no features rate; "
                         "use a run that extracted features")
    if not math.isfinite(r.generate_tokens_per_s or float("nan")):
        raise ValueError(f"the rates from {r.source} have no generate rate (no autoregressive or paired "
                         "cells)")


def split_parts(tokens: dict, slots: int) -> dict:
    """Parts per corpus for ``slots`` features tasks: at least one each, then each next slot to the
    corpus whose parts are the largest (the stage's span is its largest part's)."""
    parts = {c: 1 for c in tokens}
    for _ in range(max(0, slots - len(tokens))):
        c = max(tokens, key=lambda x: (tokens[x] / parts[x], x))
        parts[c] += 1
    return parts


def feature_parts(p: Profile, gpus: float) -> dict:
    """Features tasks per corpus that the driver runs: on a GPU cluster one per GPU the stage's tasks
    can hold (``gpus`` in all), split between the corpora by their tokens at the stated tokens per
    example (``split_parts``, as the dry run plans them); one a corpus on CPUs, with online features
    (nothing to extract) or self-distilled data (every part would distil every example)."""
    cs, need = corpora(p), p.resources.features.num_gpus
    if not need or not gpus or p.data.feature_mode == "online" or p.data.self_distill:
        return {c: 1 for c in cs}
    tpe = {c: min(t, p.data.max_length) for c, t in ASSUMPTIONS["tokens_per_example"].items()}
    return split_parts({c: (p.data.n + p.data.heldout) * tpe[c] for c in cs}, int(gpus // need))


def _features_tasks(p: Profile, r: Rates, tpe: dict, need: float, gpus: float | None) -> list[Task]:
    """Extraction, one task per corpus, or (``gpus``: a GPU cluster's) data-parallel parts of each
    corpus over every GPU, as many per corpus as its share of the tokens (one task per GPU)."""
    if p.data.feature_mode == "online":
        return []
    tokens = {c: (p.data.n + p.data.heldout) * tpe[c] for c in corpora(p)}
    slots = int(gpus // need) if gpus and need > 0 and r.device == "gpu" else len(tokens)
    out = []
    for c, k in split_parts(tokens, slots).items():
        seconds, busy = overheads.combined(overheads.features_parts(p, r, tokens[c] / k, need))
        for i in range(k):
            out.append(Task(f"features:{c}" + (f":{i}" if k > 1 else ""), "features", seconds, need,
                            busy=busy if r.device == "gpu" else 1.0))
    return out


def tasks(p: Profile, r: Rates, gpus: float | None = None, actors: int | None = None) -> list[Task]:
    """The grid's tasks (features per corpus, or in parts over ``gpus``, a trial per drafter, merges,
    eval shards, the report), each timed with ``r``, holding the devices ``p`` gives it, and with the
    share of that time its devices compute (orchestrator/plan/rates/overheads.py). ``actors``: the eval
    actors that run at once (their verifier loads; default the profile's cap)."""
    need = devices_per_task(p)
    _check(p, r, need)
    gpu = r.device == "gpu"
    tpe = {c: min(r.tokens_per_example.get(c, t), p.data.max_length)
           for c, t in ASSUMPTIONS["tokens_per_example"].items()}
    out = _features_tasks(p, r, tpe, need["features"], gpus)
    of_corpus = {c: [t.name for t in out if t.name.split(":")[1] == c] for c in corpora(p)}
    for cell in train_cells(p):
        tokens = trial_tokens(cell.variant, p.data.n, tpe)
        seconds, busy = overheads.combined(
            overheads.train_parts(p, r, cell.backbone, cell.variant, tokens, need["train"], tpe))
        deps = tuple(n for c in CORPUS_OF[cell.variant] for n in of_corpus.get(c, ()))
        out.append(Task(f"train:{cell.name}", "train", seconds, need["train"], deps, "train", busy if gpu
                        else 1.0))
    trained = {t.name for t in out}
    for m in merge_cells(p):
        deps = tuple(d for d in (f"train:{m.backbone}-math", f"train:{m.backbone}-chat") if d in trained)
        out.append(Task(f"merge:{m.name}", "merge", overheads.merge_seconds(p, r, m.backbone), 0, deps,
                        "merge"))
    made = {t.name.split(":", 1)[1]: t.name for t in out if t.stage in ("train", "merge")}
    shards, rows = _eval_tasks(p, r, made, actors if actors is not None else caps(p)["eval"])
    out += shards
    out.append(Task("report", "report", overheads.report_seconds(r, rows), 0, tuple(t.name for t in shards)))
    return out


def _per_prompt(p: Profile, r: Rates, cell, slow, busy) -> tuple[float, float, float, float, float]:
    """(its decoding's seconds, generate's, their device-busy seconds (decoding, generate), step rows) of
    one prompt of ``cell``: its decoding (speculative steps or the project's autoregressive loop) and
    transformers' generate where the cell times it."""
    toks = TURNS.get(cell.benchmark, 1) * _tokens_per_turn(r, cell.benchmark, p.eval.max_new_tokens)
    if cell.strategy == "autoregressive":  # the project's loop, then generate on the same prompt
        step = 1 / r.eval_steps_per_s.get("autoregressive", r.generate_tokens_per_s)
        calls = toks
        with_gen = True
    else:
        step = 1 / _for(r.eval_steps_per_s, cell.strategy)
        calls, with_gen = toks / _for(r.eval_tau, cell.strategy), p.eval.paired_baseline
    own = calls * step * slow(step)
    g = 1 / r.generate_tokens_per_s
    gen = toks * g * slow(g) if with_gen else 0.0
    return own, gen, own * busy(step), gen * busy(g) if with_gen else 0.0, calls


def _eval_tasks(p: Profile, r: Rates, made: dict, actors: int) -> tuple[list[Task], float]:
    """The eval shards (each its cell's drafters' tasks first) and the step rows they write."""
    slow = eval_slowdown(p, r)
    busy = eval_busy(p, r)
    size = p.eval.shard_size
    need = devices_per_task(p)["eval"]
    cells = [(c, min(cell_prompts(p, c) or BENCHMARK_SIZES[c.benchmark], BENCHMARK_SIZES[c.benchmark]))
             for c in eval_cells(p)]
    extra = overheads.eval_shard_overhead(p, r, actors, sum(-(-k // size) for _, k in cells))
    out, rows = [], 0.0
    for cell, k in cells:
        own, gen, own_dev, gen_dev, calls = _per_prompt(p, r, cell, slow, busy)
        deps, key = tuple(made[d] for d in cell.drafters if d in made), cell.key  # (the key hashes the cell)
        for s in range(0, k, size):
            m = min(size, k - s)
            gain, share = eval_batching(p, r, m)  # (1, 1) one prompt at a time
            total = extra + m * (own / gain + gen)
            dev = m * (own_dev * share + gen_dev)
            out.append(Task(f"eval:{key}:{s}", "eval", total, need, deps, "eval",
                            dev / total if r.device == "gpu" and total > 0 else 1.0))
            rows += m * calls
    return out, rows


def eval_batching(p: Profile, r: Rates, prompts: int) -> tuple[float, float]:
    """(throughput gain, device work per prompt step) of an eval actor decoding min(verify_batch,
    ``prompts``) prompts in lock step (decoding/batch.py), against one prompt at a time. The gain: the
    rates' measured one for the largest measured B up to that (none measured: 1, planned one at a
    time). The device work: the verifier's and the drafters' weights read once for the B prompts (one
    verifier pass a step, one drafter pass a draft level: packing.device_bytes_per_step's bytes model,
    which leaves out each prompt's KV-cache reads), so 1 / B of a prompt alone. generate, the speed
    baseline, runs one prompt at a time after the batch."""
    want = min(p.resources.eval.verify_batch, prompts)
    measured = [int(b) for b in r.eval_batch_gain if int(b) <= want]
    if want <= 1 or not measured:
        return 1.0, 1.0
    b = max(measured)
    return r.eval_batch_gain[str(b)], 1.0 / b


def eval_busy(p: Profile, r: Rates):
    """t -> the share of an eval actor's held GPU-time its GPU computes, for a step of ``t`` seconds
    alone: k actors on a GPU keep it busy k x t_dev of every packed step (orchestrator/plan/packing.py)."""
    need = devices_per_task(p)["eval"]
    if r.device != "gpu" or need <= 0:
        return lambda t: 1.0
    d, k = packing_model(p, r)["t_dev_s"], max(1, actors_per_gpu(need))
    return lambda t: min(1.0, k * min(d, t) / packing.step_time(t, min(d, t), k))


def packing_model(p: Profile, r: Rates) -> dict:
    """The GPU packing model of ``r`` (orchestrator/plan/packing.py): its own (an estimate, or fitted to a
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

