"""Rates where nothing on the profile's hardware was measured: the dry run's stated GPU assumptions
(:func:`estimated`, marked ``measured: false``), those with evaluation's verifier step from the
GPU check's packing file (:func:`from_packing`), and training rates for backbones a run did not
measure, scaled by training FLOPs per token (:func:`with_scaled_backbones`)."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from orchestrator.plan import packing
from orchestrator.plan.costs import ASSUMPTIONS, VERIFIERS, train_flops_per_token
from orchestrator.plan.rates.record import Rates
from orchestrator.profile import Profile

# the project's own GPU measurement of an eval actor's step (a copy of docs/gpu-check.md's figures, dated)
MEASURED_STEPS = Path(__file__).with_name("gpu_measured.json")
ENDS = ("fast", "slow")  # the two ends of its range, each a makespan of its own


def project_measurement(p: Profile) -> dict | None:
    """The project's GPU measurement of the eval step (MEASURED_STEPS) when it was taken on ``p``'s
    verifier's shape; None otherwise (the assumed step stands)."""
    data = json.loads(MEASURED_STEPS.read_text())
    return data if data["verifier"] == p.verifier else None


def _eval_steps(p: Profile, end: str) -> tuple[float, float, str, str]:
    """(speculative step s, generate token s, their two sources) at ``end`` of the project's
    measurement, or the assumed step for both where it has none for ``p``'s verifier."""
    a, m = ASSUMPTIONS, project_measurement(p)
    if m is None:
        src = (f"assumed: {a['verify_step_seconds'] * 1e3:.0f} ms per verifier step, host-bound at batch 1 "
               "(orchestrator/plan/costs.py)")
        return a["verify_step_seconds"], a["verify_step_seconds"], src, src
    step, gen = m["eval_step_s"][end], m["generate_token_s"][end]
    where = f"project measurement ({m['file']}, {m['device']}, {m['date']})"
    lo, hi = (m["eval_step_s"][e] * 1e3 for e in ENDS)
    glo, ghi = (m["generate_token_s"][e] * 1e3 for e in ENDS)
    return (step, gen,
            f"{where}: {step * 1e3:.0f} ms per speculative step, the {end} end of {lo:.0f}-{hi:.0f} ms",
            f"{where}: {gen * 1e3:.0f} ms per generate token, the {end} end of {glo:.0f}-{ghi:.0f} ms")


def estimated(p: Profile, end: str = "slow") -> Rates:
    """The GPU assumptions of the dry run (ASSUMPTIONS), as rates: an estimate, not a measurement; the
    eval step from the project's own GPU measurement at ``end`` (fast or slow) where it has one."""
    v = VERIFIERS.get(p.verifier)
    if v is None:
        raise ValueError(f"no size constants for verifier {p.verifier!r} (known: {sorted(VERIFIERS)}); "
                         "pass --rates with a run measured on it")
    a = ASSUMPTIONS
    eff = a["gpu_peak_flops"] * a["mfu"]
    online = p.data.feature_mode == "online"
    per_token = {b: train_flops_per_token(v, b, p.train.for_backbone(b).hass_steps) + (2 * v["params"]
            if online else 0)
                 for b in dict.fromkeys(("eagle2", "hass", *p.train.backbones))}
    step_s, gen_s, step_src, gen_src = _eval_steps(p, end)
    flops = f"assumed: {a['gpu_peak_flops'] / 1e12:.0f} TFLOP/s at {a['mfu']:.0%} MFU"
    return Rates(
        hardware=f"GPU at {a['gpu_peak_flops'] / 1e12:.0f} TFLOP/s peak, {a['mfu']:.0%} MFU (estimate)",
        verifier=p.verifier, device="gpu", measured=False, source="the dry run's assumptions",
        features_tokens_per_s=eff / (2 * v["params"]), features_devices=1,
        train_tokens_per_s={b: eff / f for b, f in per_token.items()}, train_devices=1, train_overhead_s=0.0,
        merge_s=0.0, eval_steps_per_s={"*": 1.0 / step_s}, eval_tau={"*": a["assumed_tau"]},
        generate_tokens_per_s=1.0 / gen_s, eval_devices=1, eval_overhead_s=0.0,
        tokens_per_example=dict(a["tokens_per_example"]), tokens_per_turn={}, max_new_tokens=None,
        sources={"features": f"{flops}, 2 x params FLOPs per token", "train": f"{flops}, FLOPs per token "
                 "of each backbone (orchestrator/plan/costs.py)", "eval steps": step_src,
                 "eval tau": f"assumed: {a['assumed_tau']}", "generate": gen_src,
                 "tokens per example": f"assumed: {a['tokens_per_example']} (orchestrator/plan/costs.py)",
                 "tokens per turn": f"assumed: {a['generated_tokens_per_turn']} generated tokens a turn"},
        packing=packing.estimate(step_s, step_src, v, packing.DTYPE_BYTES[p.verifier_dtype],
                                 p.eval.tree.depth),
        modelled_overheads=True)


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
    return replace(base,
                   hardware=f"{data.get('device', 'a GPU')} (eval steps measured; other stages estimated)",
                   measured=False, source=source, eval_steps_per_s={"*": step}, eval_tau=tau,
                   notes=base.notes + notes, sources=sources, packing=pk)


def with_scaled_backbones(p: Profile, r: Rates) -> Rates:
    """``r`` with a training rate for each backbone of ``p`` it did not measure, scaled from a
    measured one (EAGLE-2's first) by the ratio of training FLOPs per token (orchestrator/plan/costs.py),
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

