"""Rates measured on a finished local run (:func:`measure`): its manifest's stage wall times, the
feature caches' token counts and seconds, the trainers' per-epoch throughput and the eval traces'
verifier calls; the per-task overheads fitted so that the scheduler gives back each stage's wall
time."""
from __future__ import annotations

import json
import math
import os
from dataclasses import replace
from pathlib import Path

from drafters.corpora import CORPUS_OF
from orchestrator.plan.costs import ASSUMPTIONS
from orchestrator.plan.makespan import schedule
from orchestrator.plan.rates.record import Rates, _device, devices_per_task
from orchestrator.plan.rates.taskgraph import caps, profile_devices, tasks, trial_tokens
from orchestrator.profile import Profile


def _stage(manifest: dict, stage: str, units: int) -> dict | None:
    """A stage's record (seconds, units_run, machine), when the invocation that timed it ran all
    of its ``units`` alone (not overlapped with other stages: cluster.schedule graph)."""
    s = manifest.get("stages", {}).get(stage)
    return s if s and not s.get("overlapped") and s.get("units_run", 0) >= units > 0 else None


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
    from orchestrator.report.build import recorded_traces
    from orchestrator.report.tables import scan

    lf = scan(run, "prompts", recorded_traces(run))
    if lf is None:
        raise ValueError(f"--rates {run}: the run has no eval traces to measure")
    return lf.collect()


def _done(manifest: dict, stage: str) -> int:
    """Cells of ``stage`` the manifest records as done."""
    return sum(c["stage"] == stage and c["status"] == "done" for c in manifest["cells"].values())


def _feature_rates(run: Path, man: dict, p: Profile, notes: list) -> tuple[dict, float | None, bool]:
    """Training tokens per example of each corpus, the extraction rate (tokens/s), and whether any
    cache recorded its seconds: from the caches this run extracted (their manifests record them)."""
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
    return tpe, feat_rate, bool(timed)


def _train_rates(run: Path, p: Profile, tpe: dict) -> dict:
    """Backbone -> training tokens/s: every token of each trial's epochs over its loop seconds
    (rank 0's clock)."""
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
    return {b: t / s for b, (t, s) in per_bb.items() if s}


def _eval_rates(rows, notes: list) -> tuple[dict, dict, float, dict]:
    """From the eval traces' prompt rows: verifier steps/s and tau per strategy, generate's
    tokens/s, and generated tokens per turn of each benchmark."""
    import polars as pl

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
    per_turn = {b: float(v) for b,
                v in rows.group_by("benchmark").agg(pl.col("new_tokens").mean()).iter_rows()}
    return steps, tau, gen_tps, per_turn


def _with_overheads(p: Profile, r: Rates, man: dict, feats_timed: bool) -> Rates:
    """``r`` with the per-task overheads fitted to each stage an invocation ran whole, the seconds
    per merge and the report's seconds (a stage not measured is named in ``r.notes``)."""
    fits = {}
    for stage, name, units in (("features", "features_overhead_s", 1),
                               ("train", "train_overhead_s", _done(man, "train")),
                               ("eval", "eval_overhead_s", _done(man, "eval"))):
        st = _stage(man, stage, units)
        if st is None:
            why = ("it ran beside other stages: cluster.schedule graph"
                   if man.get("stages", {}).get(stage, {}).get("overlapped")
                   else f"no invocation ran the whole {stage} stage")
            r.notes.append(f"{stage} overhead not measured ({why})")
        elif stage != "features" or feats_timed:  # (a features rate from the stage time has it already)
            fits[name] = _fit_overhead(p, r, stage, st["seconds"], name)
            if fits[name] == 0.0:
                r.notes.append(f"{stage}: the modelled work alone exceeds the stage's {st['seconds']:.0f} s "
                               "(a strategy mix or lengths unlike the profile's cells): no overhead")
    merges, rep = _stage(man, "merge", _done(man, "merge")), _stage(man, "report", 1)
    return replace(r, **fits, merge_s=merges["seconds"] / _done(man, "merge") if merges else 0.0,
                   report_s=rep["seconds"] if rep else 0.0)


def measure(run: str | os.PathLike) -> Rates:
    """Rates of a finished local run: stage wall times (manifest ``stages``, recorded by the
    driver for each stage an invocation ran), feature-cache tokens and extraction seconds, the
    trainers' per-epoch loop seconds, and the eval traces' verifier calls and wall times. The
    per-task overheads are fitted so that the scheduler gives back each stage's wall time."""
    from orchestrator.manifest import read_manifest
    from orchestrator.plan.sizing import load_profile

    run = Path(run)
    has_manifest = (run / "manifest.json").is_file() or (run / "manifest.jsonl").is_file()
    if not has_manifest or not (run / "profile.json").is_file():
        raise FileNotFoundError(f"--rates {run}: not a run directory (needs manifest.json or its journal "
                                "manifest.jsonl, and profile.json)")
    man = read_manifest(run / "manifest.json")  # (its journal too: a run that stopped before compacting)
    p = load_profile(str(run / "profile.json"))
    notes: list[str] = []
    tpe, feat_rate, feats_timed = _feature_rates(run, man, p, notes)
    train_rates = _train_rates(run, p, tpe)
    steps, tau, gen_tps, per_turn = _eval_rates(_trace_rows(run), notes)
    stages = man.get("stages", {})
    machine = next((s["machine"] for s in stages.values() if s.get("machine")), "unknown machine")
    need = devices_per_task(p)
    r = Rates(
        hardware=machine, verifier=p.verifier, device=_device(p), measured=True,
        source=f"{run} (profile {p.name})", features_tokens_per_s=feat_rate,
        features_devices=need["features"],
        train_tokens_per_s=train_rates, train_devices=need["train"],
        train_overhead_s=0.0, merge_s=0.0, eval_steps_per_s=steps, eval_tau=tau,
        generate_tokens_per_s=gen_tps,
        eval_devices=need["eval"], eval_overhead_s=0.0, tokens_per_example=tpe, tokens_per_turn=per_turn,
        max_new_tokens=p.eval.max_new_tokens, notes=notes)
    return _with_overheads(p, r, man, feats_timed)
