"""Throughput of each stage on one kind of hardware, and the grid's makespan from it.

A :class:`Rates` is either measured from a finished run (:func:`measure`: its manifest's stage
wall times, the feature caches' token counts, the trainers' per-epoch throughput and the eval
traces' verifier calls) or estimated from the dry run's stated GPU assumptions
(:func:`estimated`, marked ``measured: false`` until a GPU run records real ones). :func:`tasks`
turns a profile into the grid's task graph timed with those rates, for ``makespan.schedule``.

Scaling rules, stated because they are assumptions: a stage's rate grows linearly with the
devices one task holds (features task, training trial; on a CPU profile the eval actor) relative
to the measuring run's; a GPU eval actor is host-bound at batch 1, so its step follows the packing
model (orchestrator/packing.py: k actors per GPU, saturating at k* = t_step / t_dev), never a
share of the GPU's rate; eval time per prompt is turns x tokens per turn / tau / verifier steps per second, with
tau and steps/s per strategy from the measuring run (a strategy it did not run takes the
mean of the ones it did); tokens per turn are measured when the profile's max_new_tokens is the
measuring run's, else min(max_new_tokens, the assumed 400).
"""
from __future__ import annotations

import json
import math
import os
import platform
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from drafters.corpora import CORPUS_OF

from .costs import ASSUMPTIONS, VERIFIERS, train_flops_per_token
from .grid import BENCHMARK_SIZES, cell_prompts, corpora, eval_cells, merge_cells, train_cells
from . import packing
from .makespan import Task, schedule
from .plan import actors_per_gpu
from .profile import Profile, batch_plan

TURNS = {"mt_bench": 2}  # turns per prompt (every other benchmark: 1)


@dataclass(frozen=True)
class Rates:
    hardware: str  # e.g. "AMD EPYC 7B13 (2 CPUs)" or "A100 (estimate)"
    verifier: str
    device: str  # "cpu" | "gpu": which resource a task's devices are
    measured: bool
    source: str
    features_tokens_per_s: float | None  # one features task on ``features_devices``
    features_devices: float
    train_tokens_per_s: dict  # backbone -> tokens/s of one trial on ``train_devices``
    train_devices: float
    train_overhead_s: float  # per trial: workers, DeepSpeed, held-out metrics, checkpoints
    merge_s: float  # per merge
    eval_steps_per_s: dict  # strategy -> verifier calls/s of one eval actor on ``eval_devices``
    eval_tau: dict  # strategy -> tokens per verifier call
    generate_tokens_per_s: float  # transformers' generate in an eval actor (baseline and paired cells)
    eval_devices: float
    eval_overhead_s: float  # per eval unit (shard): drafter loads, prefill of the tree auto fit, records
    tokens_per_example: dict  # corpus -> training tokens per example
    tokens_per_turn: dict  # benchmark -> generated tokens per turn at ``max_new_tokens``
    max_new_tokens: int | None
    report_s: float = 0.0
    features_overhead_s: float = 0.0  # per features task: loading the verifier, the draft vocabulary
    notes: list = field(default_factory=list)
    sources: dict = field(default_factory=dict)  # what -> where its rate came from (measured, assumed)
    # GPU eval packing (orchestrator/packing.py): t_step_s, t_dev_s and their sources; None: estimated
    packing: dict | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)


GPU_RATES = "gpu_rates.json"  # a directory holding the GPU check's packing file under this name


def load(path: str | os.PathLike, p: Profile | None = None) -> Rates:
    """A rates JSON file, the GPU check's packing file (``kind: gpu-check-packing``, or a directory
    holding one as ``gpu_rates.json``: its eval steps over ``p``'s estimated rates), or a finished
    run's directory (measured on the spot)."""
    path = Path(path)
    if path.is_dir() and (path / GPU_RATES).is_file():
        path = path / GPU_RATES
    elif path.is_dir():
        return measure(path)
    if not path.is_file():
        raise FileNotFoundError(f"--rates {path}: no such file or run directory")
    try:
        data = json.loads(path.read_text())
    except ValueError as e:
        raise ValueError(f"--rates {path}: not a rates file ({e})") from None
    if isinstance(data, dict) and data.get("kind") == packing.PACKING_KIND:
        if p is None:
            raise ValueError(f"--rates {path}: a packing file times a profile's evaluation only; load it with one")
        return from_packing(p, packing.read_packing(path), str(path))
    try:
        return Rates(**data)
    except TypeError as e:
        raise ValueError(f"--rates {path}: not a rates file ({e})") from None


def hardware() -> str:
    """This machine in one line: the CPU model and count, and the GPU if torch sees one. (Imports
    torch: the driver's call, never the dry run's.)"""
    import torch

    from decoding.cpu.kernel import cpuinfo

    out = f"{cpuinfo('model name') or platform.processor() or platform.machine()} ({os.cpu_count()} CPUs)"
    if torch.cuda.is_available():
        out += f", {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
    return out


def _device(p: Profile) -> str:
    r = p.resources
    return "gpu" if r.train.use_gpu or r.eval.num_gpus or r.features.num_gpus else "cpu"


def devices_per_task(p: Profile) -> dict:
    """Devices one features task, training trial and eval actor hold (GPUs, or CPUs on a CPU profile)."""
    r = p.resources
    if _device(p) == "gpu":
        return {"features": r.features.num_gpus, "train": r.train.num_workers, "eval": r.eval.num_gpus}
    return {"features": r.features.num_cpus, "train": r.train.num_workers * r.train.cpus_per_worker,
            "eval": r.eval.num_cpus}


def estimated(p: Profile) -> Rates:
    """The GPU assumptions of the dry run (ASSUMPTIONS), as rates: an estimate, not a measurement."""
    v = VERIFIERS.get(p.verifier)
    if v is None:
        raise ValueError(f"no size constants for verifier {p.verifier!r} (known: {sorted(VERIFIERS)}); "
                         "pass --rates with a run measured on it")
    a = ASSUMPTIONS
    eff = a["gpu_peak_flops"] * a["mfu"]
    online = p.data.feature_mode == "online"
    per_token = {b: train_flops_per_token(v, b, p.train.for_backbone(b).hass_steps) + (2 * v["params"] if online else 0)
                 for b in dict.fromkeys(("eagle2", "hass", *p.train.backbones))}
    step = 1.0 / a["verify_step_seconds"]
    flops = f"assumed: {a['gpu_peak_flops'] / 1e12:.0f} TFLOP/s at {a['mfu']:.0%} MFU"
    step_src = (f"assumed: {a['verify_step_seconds'] * 1e3:.0f} ms per verifier step, host-bound at batch 1 "
                "(orchestrator/costs.py)")
    return Rates(
        hardware=f"GPU at {a['gpu_peak_flops'] / 1e12:.0f} TFLOP/s peak, {a['mfu']:.0%} MFU (estimate)",
        verifier=p.verifier, device="gpu", measured=False, source="the dry run's assumptions",
        features_tokens_per_s=eff / (2 * v["params"]), features_devices=1,
        train_tokens_per_s={b: eff / f for b, f in per_token.items()}, train_devices=1, train_overhead_s=0.0,
        merge_s=0.0, eval_steps_per_s={"*": step}, eval_tau={"*": a["assumed_tau"]}, generate_tokens_per_s=step,
        eval_devices=1, eval_overhead_s=0.0, tokens_per_example=dict(a["tokens_per_example"]),
        tokens_per_turn={}, max_new_tokens=None,
        sources={"features": f"{flops}, 2 x params FLOPs per token", "train": f"{flops}, FLOPs per token "
                 "of each backbone (orchestrator/costs.py)", "eval steps": step_src,
                 "eval tau": f"assumed: {a['assumed_tau']}", "generate": step_src},
        packing=packing.estimate(a["verify_step_seconds"], step_src, v, packing.DTYPE_BYTES[p.verifier_dtype],
                                 p.eval.tree.depth))


def from_packing(p: Profile, data: dict, source: str) -> Rates:
    """``p``'s estimated rates with evaluation's verifier step from the GPU check's packing file
    (``packing.read_packing``): its one-process step for every strategy, and the packing model
    fitted to its rows. Its tau counts where its verifier is the profile's (the check's own
    random-weight model accepts nothing real). Every other rate stays the stated assumption."""
    base = estimated(p)
    v = VERIFIERS.get(p.verifier)
    pk = packing.fit(data, source, v, p.eval.tree.depth)
    step = 1.0 / pk["t_step_s"]
    one = next(r for r in data["packing"] if r["processes"] == 1)
    sources = dict(base.sources, **{"eval steps": pk["step_source"]})
    notes = [f"eval: verifier steps measured with strategy {data.get('strategy', '?')!r}, tree "
             f"{data.get('tree', '?')}, {data.get('dtype', '?')}, verifier {data.get('verifier', '?')!r} on "
             f"{data.get('device', '?')} ({data.get('date', 'undated')}); every strategy takes that step "
             f"(the profile's tree: {p.eval.tree.top_k}/{p.eval.tree.depth}/{p.eval.tree.total_tokens})"]
    tau = dict(base.eval_tau)
    if data.get("verifier") == p.verifier and isinstance(one.get("tau"), (int, float)) and one["tau"] > 0:
        tau = {"*": float(one["tau"])}
        sources["eval tau"] = f"measured: {source}"
    else:
        notes.append(f"eval tau: the packing file's ({one.get('tau')}) comes from verifier "
                     f"{data.get('verifier')!r}, not {p.verifier!r}: the assumed {base.eval_tau['*']} stands")
    return replace(base, hardware=f"{data.get('device', 'a GPU')} (eval steps measured; other stages estimated)",
                   measured=False, source=source, eval_steps_per_s={"*": step}, eval_tau=tau,
                   notes=base.notes + notes, sources=sources, packing=pk)


def with_scaled_backbones(p: Profile, r: Rates) -> Rates:
    """``r`` with a training rate for each backbone of ``p`` it did not measure, scaled from a
    measured one (EAGLE-2's first) by the ratio of training FLOPs per token (orchestrator/costs.py),
    each named in the notes as an estimate. Unchanged when nothing is missing or when the verifier
    has no size constants (``_check`` then refuses the missing backbone)."""
    missing = [b for b in p.train.backbones if b not in r.train_tokens_per_s]
    v = VERIFIERS.get(p.verifier)
    if not missing or v is None or not r.train_tokens_per_s:
        return r
    ref = "eagle2" if "eagle2" in r.train_tokens_per_s else sorted(r.train_tokens_per_s)[0]
    flops = {b: train_flops_per_token(v, b, p.train.for_backbone(b).hass_steps) for b in [ref, *missing]}
    rates, notes = dict(r.train_tokens_per_s), list(r.notes)
    for b in missing:
        rates[b] = r.train_tokens_per_s[ref] * flops[ref] / flops[b]
        notes.append(f"{b}: training rate not measured in this run; {ref}'s scaled by FLOPs per token "
                     f"(x{flops[ref] / flops[b]:.2f}): an estimate")
    return replace(r, train_tokens_per_s=rates, notes=notes)


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


def _stage(manifest: dict, stage: str, units: int) -> dict | None:
    """A stage's record (seconds, units_run, machine), when the invocation that timed it ran all
    of its ``units``."""
    s = manifest.get("stages", {}).get(stage)
    return s if s and s.get("units_run", 0) >= units > 0 else None


def _fit_overhead(p: Profile, r: Rates, stage: str, seconds: float, name: str) -> float:
    """The per-task overhead (field ``name``) for which the scheduler reproduces ``seconds``, the
    stage's measured wall time, with its tasks alone at the profile's concurrency (bisection:
    the span grows with the overhead). Idle slots are the schedule's, not the overhead's."""
    gen = r.generate_tokens_per_s if math.isfinite(r.generate_tokens_per_s) else 1.0  # (not this stage's)
    ready = replace(r, features_tokens_per_s=r.features_tokens_per_s or 1.0, generate_tokens_per_s=gen)

    def span(x: float) -> float:
        ts = [replace(t, deps=()) for t in tasks(p, replace(ready, **{name: x})) if t.stage == stage]
        return schedule(ts, profile_devices(p), caps(p), barriers=False)["makespan"] if ts else 0.0

    lo, hi = 0.0, seconds
    if span(lo) >= seconds:
        return 0.0
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if span(mid) < seconds else (lo, mid)
    return (lo + hi) / 2


def _trace_rows(run: Path):
    """The run's prompt rows (the report's reader: recorded files only, old schemas aligned)."""
    from .report.build import recorded_traces
    from .report.tables import scan

    lf = scan(run, "prompts", recorded_traces(run))
    if lf is None:
        raise ValueError(f"--rates {run}: the run has no eval traces to measure")
    return lf.collect()


def measure(run: str | os.PathLike) -> Rates:
    """Rates of a finished local run: stage wall times (manifest ``stages``, recorded by the
    driver for each stage an invocation ran), feature-cache tokens and extraction seconds, the
    trainers' per-epoch loop seconds, and the eval traces' verifier calls and wall times. The
    per-task overheads are fitted so that the scheduler gives back each stage's wall time."""
    import polars as pl

    from .manifest import read_manifest
    from .profile import load_profile

    run = Path(run)
    has_manifest = (run / "manifest.json").is_file() or (run / "manifest.jsonl").is_file()
    if not has_manifest or not (run / "profile.json").is_file():
        raise FileNotFoundError(f"--rates {run}: not a run directory (needs manifest.json or its journal "
                                "manifest.jsonl, and profile.json)")
    man = read_manifest(run / "manifest.json")  # (its journal too: a run that stopped before compacting)
    p = load_profile(str(run / "profile.json"))
    notes = []
    done = lambda st: sum(c["stage"] == st and c["status"] == "done" for c in man["cells"].values())  # noqa: E731
    # features: tokens and seconds of each cache this run extracted (its manifest records them)
    feats = [json.loads(f.read_text()) for f in sorted(run.glob("features/*/manifest.json"))]
    timed = [f for f in feats if f.get("seconds")]
    tpe = {}
    for c in ("mathinstruct", "sharegpt"):
        tr = [f for f in feats if f.get("corpus") == c and f.get("part") == "train"]
        if tr:
            tpe[c] = sum(f["tokens"] for f in tr) / sum(f["examples"] for f in tr)
    if not tpe:
        notes.append("no feature caches (online mode?): tokens per example are the stated assumption")
        tpe = {c: min(t, p.data.max_length) for c, t in ASSUMPTIONS["tokens_per_example"].items()}
    feat_rate = sum(f["tokens"] for f in timed) / sum(f["seconds"] for f in timed) if timed else None
    feat_stage = _stage(man, "features", 1)
    if feat_rate is None and feat_stage and feats:  # caches written before they recorded seconds
        feat_rate = sum(f["tokens"] for f in feats) / feat_stage["seconds"]
        notes.append("features rate from the features stage's wall time (the caches do not record seconds)")
    # training: every token of each trial's epochs over its loop seconds (rank 0's clock)
    per_bb: dict[str, list[float]] = {}
    for d in sorted(run.glob("checkpoints/*/final/config.json")):
        cfg = json.loads(d.read_text())
        tr = cfg.get("training") or {}
        hist = [h for h in tr.get("history", []) if h.get("epoch_seconds")]
        if not hist or tr.get("variant") not in CORPUS_OF:
            continue
        acc = per_bb.setdefault(cfg.get("backbone") or d.parent.parent.name.split("-")[0], [0.0, 0.0])
        acc[0] += trial_tokens(tr["variant"], p.data.n, tpe) * len(hist)
        acc[1] += sum(h["epoch_seconds"] for h in hist)
    # evaluation: verifier calls and decode seconds per strategy; generate's own timings
    rows = _trace_rows(run)
    spec = rows.filter(pl.col("strategy") != "autoregressive").group_by("strategy").agg(
        pl.col("verifier_calls").sum().alias("calls"), pl.col("new_tokens").sum().alias("tokens"),
        pl.col("wall_time_s").sum().alias("s"))
    steps = {x["strategy"]: x["calls"] / x["s"] for x in spec.iter_rows(named=True) if x["s"]}
    tau = {x["strategy"]: x["tokens"] / x["calls"] for x in spec.iter_rows(named=True) if x["calls"]}
    ar = rows.filter(pl.col("strategy") == "autoregressive")
    if ar.height and ar["wall_time_s"].sum():
        steps["autoregressive"] = float(ar["new_tokens"].sum() / ar["wall_time_s"].sum())
    gen_tps, gen_s = float("nan"), 0.0
    if {"generate_tokens", "generate_wall_time_s"} <= set(rows.columns):
        g = rows.filter(pl.col("generate_wall_time_s").fill_null(0) > 0)
        if g.height:
            gen_s = float(g["generate_wall_time_s"].sum())
            gen_tps = float(g["generate_tokens"].sum()) / gen_s
    if not math.isfinite(gen_tps) and "autoregressive" in steps:
        gen_tps = steps["autoregressive"]
        notes.append("generate not timed in this run: its rate is the project's autoregressive loop's")
    per_turn = {b: float(v) for b, v in rows.group_by("benchmark").agg(pl.col("new_tokens").mean()).iter_rows()}
    stages = man.get("stages", {})
    machine = next((s["machine"] for s in stages.values() if s.get("machine")), "unknown machine")
    need = devices_per_task(p)
    r = Rates(
        hardware=machine, verifier=p.verifier, device=_device(p), measured=True,
        source=f"{run} (profile {p.name})", features_tokens_per_s=feat_rate, features_devices=need["features"],
        train_tokens_per_s={b: t / s for b, (t, s) in per_bb.items() if s}, train_devices=need["train"],
        train_overhead_s=0.0, merge_s=0.0, eval_steps_per_s=steps, eval_tau=tau, generate_tokens_per_s=gen_tps,
        eval_devices=need["eval"], eval_overhead_s=0.0, tokens_per_example=tpe, tokens_per_turn=per_turn,
        max_new_tokens=p.eval.max_new_tokens, notes=notes)
    fits = {}
    for stage, name, units in (("features", "features_overhead_s", 1),
                               ("train", "train_overhead_s", done("train")),
                               ("eval", "eval_overhead_s", done("eval"))):
        st = _stage(man, stage, units)
        if st is None:
            notes.append(f"{stage} overhead not measured (no invocation ran the whole {stage} stage)")
        elif stage != "features" or timed:  # (a features rate from the stage time has it already)
            fits[name] = _fit_overhead(p, r, stage, st["seconds"], name)
            if fits[name] == 0.0:
                notes.append(f"{stage}: the modelled work alone exceeds the stage's {st['seconds']:.0f} s "
                             "(a strategy mix or lengths unlike the profile's cells): no overhead")
    merges, rep = _stage(man, "merge", done("merge")), _stage(man, "report", 1)
    return replace(r, **fits, merge_s=merges["seconds"] / done("merge") if merges else 0.0,
                   report_s=rep["seconds"] if rep else 0.0)


def main(argv=None) -> int:
    """python -m orchestrator.rates RUN_DIR [--out FILE]: a finished run's rates as JSON."""
    import argparse
    import sys

    from common.atomic import write_text_atomic

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("run")
    ap.add_argument("--out", default=None, help="write the JSON here (default: print it)")
    args = ap.parse_args(argv)
    try:
        r = measure(args.run)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.out:
        write_text_atomic(Path(args.out), r.to_json() + "\n")
    else:
        print(r.to_json())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
