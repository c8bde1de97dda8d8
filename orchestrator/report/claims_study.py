"""The study's own numbers (study_tables.csv: the paper's text as ../shared/STUDY.md restates it and
TAPS's README tables), and what they say about each claim's wording before any of our traces is read.

Every claim row of the report carries the study's numbers for its own backbone, temperature and
benchmark (``evidence``), and whether those numbers agree with the claim as worded
(``study_consistent``: True, False where the study contradicts itself, None where the study gives
no number for that cell). Where the paper's text and TAPS's README give a cell differently, the
paper's number is used here and both are in the CSV and in the comparison table."""
from __future__ import annotations

import numpy as np
import polars as pl

from . import study_tables as st
from .claims_eagle3 import CLAIM as E3_CLAIM
from .claims_eagle3 import WORDING as E3_WORDING
from .claims_hedge import CLAIMS as HEDGE_CLAIMS
from .claims_hedge import WORDING as HEDGE_WORDING
from .routers import POSTHOC
from .stats import kendall_tau_b

# The study's "confidence routed" numbers are its code's post hoc router's (routers.POSTHOC).
# (backbone, temperature, method, benchmark or "average", acceptance length, source): every τ cell
STUDY_NUMBERS = [(c.backbone, c.temperature, c.method, c.benchmark, c.value, c.source)
                 for c in st.cells() if c.quantity == "tau"]
# Numbers that are not acceptance lengths: (quantity, backbone, temperature, method, benchmark, value, source).
# matched_share: share of prompts routed to the matched specialist (math on math benchmarks, chat on MT-Bench).
STUDY_OTHER = [(c.quantity, c.backbone, c.temperature, c.method, c.benchmark, c.value, c.source)
               for c in st.cells() if c.quantity != "tau"]
TAU_CONVENTION = ("the study's τ is TAPS's compute_tau.py: total new tokens (bonus tokens included) / total "
                  "loop indices counted from 0; compare it with `tau_taps`")

# Each claim as the study words it (the report's `wording` column).
WORDING = {
    "RQ1-math": "a drafter trained on math data has the longer acceptance on math benchmarks (Table 1)",
    "RQ1-chat": "a drafter trained on chat data has the longer acceptance on MT-Bench (Table 1)",
    "RQ2": "mixed data is robust: it beats the mismatched specialist on every benchmark (Table 1)",
    "RQ2-home": "on its home domain the matched specialist often beats mixed data (Table 1)",
    "RQ2-reversal": "Mixed 70k+70k leads Mixed 35k+35k at T=0; the order reverses at T=1 (Table 1)",
    "RQ3a": "merged trees beat confidence routing (Table 1, average)",
    "RQ3b": "confidence routing beats the best single checkpoint (Table 1, average)",
    "RQ3c": "the weight-averaged checkpoint is the weakest (Table 1)",
    "RQ3c-cells": "the weight-averaged checkpoint is the worst in every cell (Table 1: each benchmark)",
    "Fig6": "no lambda of the averaging sweep recovers specialist-level acceptance (Figure 6)",
    "merged-best": "merged trees are the best method overall (Table 1, average)",
    "backbones": "the methods keep the same ordering on both backbones (Table 1, average): the same order",
    "RQ4": "confidence routing separates the domains, entropy routing does not (Table 2)",
    "entropy": "rejected draft tokens carry higher draft entropy than accepted ones (Tables 3-4)",
    "verifier-entropy": "verifier entropy shows the same direction: higher at rejected tokens (Tables 3-4)",
    "RQ5": "acceptance rate falls with depth for every variant (Tables 5-8)",
    "depth-slope": "the matched specialist declines more slowly with depth than the mismatched (Tables 5-8)",
    "depth-shallow": "the mixed drafter leads the matched specialist at shallow depth 1-2 (Tables 5-8)",
    "depth-deep": "the matched specialist beats the mixed drafter at depths 4-5 (Tables 5-8)",
    "speed": "confidence routing costs less speed than merged trees (Section 7 estimate)",
    # the study's proposed next experiments (no numbers in the study): checks of this project's strategies
    "switching": "acceptance-history switching beats confidence routing (proposed next experiment)",
    "switching-early": "early acceptance (first 3 steps) predicts whole-generation acceptance (switching's premise)",
    "switching-speed": "switching's acceptance gain survives its wall-clock cost: faster than confidence routing",
    "depth-adaptive-merged": "depth-adaptive composition beats budget-matched merged trees (proposed next experiment)",
    "depth-adaptive-routing": "depth-adaptive composition beats confidence routing at equal node budget "
                              "(proposed next experiment)",
    E3_CLAIM: E3_WORDING,  # the third backbone (claims_eagle3): not the study's
    **HEDGE_WORDING,  # the project's online router (claims_hedge): not the study's
}
NEXT = ("switching", "switching-early", "switching-speed", "depth-adaptive-merged", "depth-adaptive-routing")
STUDY_CLAIMS = tuple(c for c in WORDING if c not in (*NEXT, E3_CLAIM, *HEDGE_CLAIMS))

NAMES = {"math": "MathInstruct 70k", "chat": "ShareGPT 70k", "mixed_half": "Mixed 35k+35k",
         "mixed_full": "Mixed 70k+70k", "avg0.5": "Averaged", POSTHOC: "Confidence routed",
         "merged": "Merged trees"}
FOUR = ("gsm8k", "math500", "mt_bench", "svamp")


def _t(temp) -> str:
    return f"T={temp:g}"


def _paper_last(rows, source_at: int):
    """Rows ordered so that a paper row comes after (and so overrides) a README row of the same cell."""
    return sorted(rows, key=lambda r: r[source_at].startswith(st.PAPER))


def tau_of(backbone: str, temp: float, method: str, bench: str) -> tuple[float | None, str]:
    """The study's τ for one cell (the paper's number where the paper and TAPS's README differ); for
    "average" its own average, else the mean of the per-benchmark numbers given (labelled), else None."""
    hit = {b: v for bb, t, m, b, v, _ in _paper_last(STUDY_NUMBERS, 5) if (bb, t, m) == (backbone, temp, method)}
    if bench in hit:
        return hit[bench], f"{hit[bench]:.2f}"
    if bench == "average":
        per = [hit[b] for b in FOUR if b in hit]
        if len(per) >= 2:
            v = sum(per) / len(per)
            return v, f"{v:.2f} (mean of the {len(per)} benchmarks given)"
    return None, ""


def other_of(quantity: str, backbone: str, temp, method: str, bench: str) -> float | None:
    hit = None
    for q, bb, t, m, b, v, _ in _paper_last(STUDY_OTHER, 6):
        if (q, bb, t, m, b) == (quantity, backbone, temp, method, bench):
            hit = v
    return hit


def evidence(claim: str, text: str = "", consistent: bool | None = None, note: str = "") -> dict:
    return {"wording": WORDING.get(claim, ""), "study": text, "study_consistent": consistent, "study_note": note}


def none_for(claim: str, backbone: str, temp, bench: str = "average") -> dict:
    where = f"{backbone}, {_t(temp) if temp is not None else 'any T'}, {bench}"
    return evidence(claim, f"the study gives no number for this cell ({where})")


def pair(claim: str, backbone: str, temp: float, a: str, b: str, bench: str, a_better: bool = True,
         note: str = "") -> dict:
    """The study's τ of a and b in this cell, and whether they order as the claim says."""
    va, ta = tau_of(backbone, temp, a, bench)
    vb, tb = tau_of(backbone, temp, b, bench)
    if va is None or vb is None:
        return none_for(claim, backbone, temp, bench) | ({"study_note": note} if note else {})
    text = f"Table 1 ({backbone}, {_t(temp)}, {bench}): {NAMES.get(a, a)} {ta} vs {NAMES.get(b, b)} {tb}"
    ok = (va > vb) if a_better else (va < vb)
    if not ok:
        note = (f"the study's own numbers contradict this wording here ({NAMES.get(a, a)} {ta}, "
                f"{NAMES.get(b, b)} {tb}). " + note).strip()
    return evidence(claim, text, ok, note)


def best_single(backbone: str, temp: float, singles=("math", "chat", "mixed_half", "mixed_full"),
                explicit: bool = False) -> tuple[str | None, float | None]:
    vals = {m: tau_of(backbone, temp, m, "average") for m in singles}
    vals = {m: v for m, (v, t) in vals.items() if v is not None and (not explicit or "mean of" not in t)}
    if not vals:
        return None, None
    m = max(vals, key=vals.get)
    return m, vals[m]


def rq3b(backbone: str, temp: float, routed: str) -> dict:
    """Confidence routing vs the study's best single checkpoint (by its own averages)."""
    best, _ = best_single(backbone, temp)
    if best is None or tau_of(backbone, temp, routed, "average")[0] is None:
        return none_for("RQ3b", backbone, temp)
    return pair("RQ3b", backbone, temp, routed, best, "average")


def merged_best(backbone: str, temp: float) -> dict:
    others = {m for bb, t, m, *_ in STUDY_NUMBERS if (bb, t) == (backbone, temp) and m != "merged"}
    vals = {m: tau_of(backbone, temp, m, "average")[0] for m in others}
    vals = {m: v for m, v in vals.items() if v is not None}
    if not vals or tau_of(backbone, temp, "merged", "average")[0] is None:
        return none_for("merged-best", backbone, temp)
    return pair("merged-best", backbone, temp, "merged", max(vals, key=vals.get), "average")


def rq3c(backbone: str, temp: float) -> dict:
    worst = {m: tau_of(backbone, temp, m, "average")[0] for m in ("math", "chat", "mixed_half", "mixed_full")}
    worst = {m: v for m, v in worst.items() if v is not None}
    if not worst or tau_of(backbone, temp, "avg0.5", "average")[0] is None:
        return none_for("RQ3c", backbone, temp)
    return pair("RQ3c", backbone, temp, "avg0.5", min(worst, key=worst.get), "average", a_better=False)


def fig6(backbone: str, temp: float) -> dict:
    best, _ = best_single(backbone, temp, ("math", "chat"))
    if best is None or tau_of(backbone, temp, "avg0.5", "average")[0] is None:
        return evidence("Fig6", "Figure 6: no λ of the sweep recovers (the study gives the sweep as a figure "
                                f"only; no λ=0.5 number for {backbone}, {_t(temp)})")
    ev = pair("Fig6", backbone, temp, "avg0.5", best, "average", a_better=False)
    return ev | {"study": "Figure 6: no λ of the sweep recovers; λ=0.5 in " + ev["study"]}


def reversal(backbone: str, temp: float) -> dict:
    a, b = ("mixed_full", "mixed_half") if temp == 0 else ("mixed_half", "mixed_full")
    ev = pair("RQ2-reversal", backbone, temp, a, b, "average")
    partial = "mean of" in tau_of(backbone, temp, a, "average")[1] + tau_of(backbone, temp, b, "average")[1]
    if ev["study_consistent"] is None or partial:  # HASS T=0 has no 35k+35k average: compare where both are
        shared = [bn for bn in FOUR
                  if None not in (tau_of(backbone, temp, a, bn)[0], tau_of(backbone, temp, b, bn)[0])]
        if shared:
            ev = pair("RQ2-reversal", backbone, temp, a, b, shared[0])
    return ev


def rq4(backbone: str, temp: float, granularity: str) -> dict:
    c = [other_of("matched_share", backbone, temp, "confidence", b) for b in FOUR]
    e = [other_of("matched_share", backbone, temp, "entropy", b) for b in FOUR]
    if None in c or None in e:
        return none_for("RQ4", backbone, temp, "routing shares (Table 2 is EAGLE-2 only)")
    mc, me = sum(c) / 4, sum(e) / 4
    return evidence("RQ4", f"Table 2 ({backbone}, {_t(temp)}): share routed to the matched specialist, mean of "
                           f"4 benchmarks: confidence {mc:.3f} vs entropy {me:.3f}", mc > me,
                    "" if granularity == "prompt" else "the study routes once per prompt; this row routes per "
                                                       f"{granularity}")


def entropy(backbone: str, temp: float, method: str, bench: str) -> dict:
    acc = other_of("draft_entropy_accepted", backbone, temp, method, bench)
    rej = other_of("draft_entropy_rejected", backbone, temp, method, bench)
    gap = other_of("draft_entropy_gap", backbone, temp, method, bench)
    if acc is not None and rej is not None:
        return evidence("entropy", f"Tables 3-4 ({backbone}, {_t(temp)}, {NAMES[method]} on {bench}): "
                                   f"rejected {rej:.3f} vs accepted {acc:.3f} nats", rej > acc)
    if gap is not None:
        return evidence("entropy", f"Figure 7 ({backbone}, {_t(temp)}, {NAMES[method]} on {bench}): rejected - "
                                   f"accepted draft entropy {gap:+.2f} nats (TAPS README)", gap > 0)
    return none_for("entropy", backbone, temp, f"{method} on {bench}")


def verifier_entropy(backbone: str, temp: float) -> dict:
    return evidence("verifier-entropy", "Tables 3-4: 'verifier entropy shows the same direction' (the study's "
                                        f"text; no verifier-entropy number for {backbone}, {_t(temp)} in the data)")


def rq3c_cell(backbone: str, temp: float, bench: str, rivals) -> dict:
    """The averaged checkpoint against the lowest other Table 1 row of this cell."""
    mine = tau_of(backbone, temp, "avg0.5", bench)[0]
    vals = {m: tau_of(backbone, temp, m, bench)[0] for m in rivals}
    vals = {m: v for m, v in vals.items() if v is not None}
    if mine is None or not vals:
        return none_for("RQ3c-cells", backbone, temp, bench)
    return pair("RQ3c-cells", backbone, temp, "avg0.5", min(vals, key=vals.get), bench, a_better=False)


def rq3c_all(backbone: str, temp: float) -> dict:
    """The averaged checkpoint against every other Table 1 row, each benchmark of the study."""
    rivals = [m for m in NAMES if m != "avg0.5"]
    evs = [rq3c_cell(backbone, temp, bn, rivals) for bn in FOUR]
    known = [e for e in evs if e["study_consistent"] is not None]
    if not known:
        return none_for("RQ3c-cells", backbone, temp, "every benchmark")
    bad = [e for e in known if e["study_consistent"] is False]
    if bad:
        return evidence("RQ3c-cells", "; ".join(e["study"] for e in bad), False, bad[0]["study_note"])
    return evidence("RQ3c-cells", f"Table 1 ({backbone}, {_t(temp)}): Averaged is the lowest row on all "
                                  f"{len(known)} benchmarks", True)


def depth(claim: str, backbone: str, temp: float, method: str | None = None) -> dict:
    """Tables 5-8 numbers (EAGLE-2 T=0 MATH-500) for the depth claims; ``method``: RQ5's variant."""
    r = {(m, d): other_of(f"accept_rate_d{d}", backbone, temp, m, "math500") for m in ("math", "chat", "avg0.5")
         for d in (1, 3, 5)}
    if method is not None and claim == "RQ5":
        deep = max((d for d in (3, 5) if r[method, d] is not None), default=None) if (method, 1) in r else None
        if deep is None or r[method, 1] is None:
            return none_for(claim, backbone, temp, f"acceptance by depth of {method}")
        return evidence(claim, f"Tables 5-8 ({backbone}, {_t(temp)}, math500): {NAMES.get(method, method)} "
                               f"{r[method, 1]:.1%} at depth 1 -> {r[method, deep]:.1%} at {deep}",
                        r[method, 1] > r[method, deep])
    if None in (r["math", 1], r["math", 5], r["chat", 1], r["chat", 5]):
        return none_for(claim, backbone, temp, "acceptance by depth")
    text = (f"Tables 5-8 ({backbone}, {_t(temp)}, math500): MathInstruct {r['math', 1]:.1%} at depth 1 -> "
            f"{r['math', 5]:.1%} at 5; ShareGPT {r['chat', 1]:.1%} -> {r['chat', 5]:.1%}")
    if claim == "RQ5":
        return evidence(claim, text, r["math", 1] > r["math", 5] and r["chat", 1] > r["chat", 5])
    if claim == "depth-slope":
        fall_m, fall_c = r["math", 1] - r["math", 5], r["chat", 1] - r["chat", 5]
        return evidence(claim, text, fall_m < fall_c)
    if claim == "depth-deep":
        return evidence(claim, text + "; no number for the mixed drafters by depth (Figure 8 only)", None,
                        "the study's text: 'the matched specialist dominates at depths 4-5'")
    return evidence(claim, text + "; no number for the mixed drafters by depth", None,
                    "the study's text says 'competitive at depths 1-2', weaker than 'leads'")


def speed() -> dict:
    v = {(m, q): other_of(q, "any", None, m, "any") for m in ("confidence", "merged")
         for q in ("speedup_lost_min", "speedup_lost_max")}
    text = (f"Section 7 (coarse estimate, no wall clock): confidence routing loses "
            f"{v['confidence', 'speedup_lost_min']:.2f}x-{v['confidence', 'speedup_lost_max']:.2f}x "
            f"of the best single checkpoint's speedup, merged trees "
            f"{v['merged', 'speedup_lost_min']:.2f}x-{v['merged', 'speedup_lost_max']:.2f}x")
    return evidence("speed", text, v["confidence", "speedup_lost_max"] < v["merged", "speedup_lost_min"],
                    "the study estimated, never measured, speed")


def proposed(claim: str) -> dict:
    """The study proposes these experiments and gives no numbers for them."""
    return evidence(claim, "no numbers: the study proposes this experiment (STUDY.md, 'What the paper left open')")


def backbones(temp: float, methods=None) -> dict:
    """Whether the study's own averages order the methods identically on both backbones (its claim),
    with Kendall τ_b as the supporting number; over ``methods`` when given (the methods the run
    compares), so the study's side and the run's side order the same set."""
    avg = {bb: {m: tau_of(bb, temp, m, "average")[0] for m in NAMES} for bb in ("hass", "eagle2")}
    common = sorted(m for m in NAMES if avg["hass"][m] is not None and avg["eagle2"][m] is not None
                    and (methods is None or m in methods))
    if len(common) < 3:
        return none_for("backbones", "hass+eagle2", temp)

    def order(bb):
        return [m for m in sorted(common, key=lambda m: -avg[bb][m])]

    k = float(kendall_tau_b(np.array([[avg["hass"][m] for m in common]]),
                            np.array([[avg["eagle2"][m] for m in common]]))[0])
    same = order("hass") == order("eagle2")
    text = (f"Table 1 ({_t(temp)}, averages): hass {' > '.join(NAMES[m] for m in order('hass'))}; eagle2 "
            f"{' > '.join(NAMES[m] for m in order('eagle2'))} ({'the same' if same else 'a different'} order; "
            f"Kendall τ_b {k:.2f})")
    return evidence("backbones", text, same,
                    "" if same else "the study's own averages order the methods differently on the backbones")


def comparison_note(t1: pl.DataFrame, column: str = "tau_taps") -> str:
    """One line for the report: which of our columns is compared with the study's numbers."""
    if column in t1.columns:
        return (f"`{column}` is ours in the study's convention ({TAU_CONVENTION}); `diff` = `{column}` - "
                "`study_tau`.")
    return (f"this run's Table 1 has no `{column}` column, so the study's numbers (TAPS's compute_tau.py "
            "convention) are beside `our_tau` only, which counts passes differently: no `diff` is given.")


def study_comparison(t1: pl.DataFrame, column: str = "tau_taps") -> pl.DataFrame:
    """Every τ cell of the study (study_tables.csv, one row per cell and source) next to ours (same
    backbone, temperature, method, benchmark; "average" = the mean over our benchmarks), in our
    convention (``our_tau``) and in the study's (``our_<column>``, from Table 1's ``column``, default
    ``tau_taps``); without that column its values stay empty and comparison_note says so."""
    rows = []
    has = column in t1.columns
    for bb, temp, method, bench, value, source in STUDY_NUMBERS:
        t = t1.filter((pl.col("backbone") == bb) & (pl.col("temperature") == temp) & (pl.col("method") == method))
        if bench != "average":
            t = t.filter(pl.col("benchmark") == bench)
        ours = float(t["tau"].mean()) if t.height else None
        conv = float(t[column].mean()) if t.height and has and t[column].is_not_null().any() else None
        rows.append({"backbone": bb, "temperature": temp, "method": method, "benchmark": bench, "study_tau": value,
                     "source": source, "our_tau": ours, f"our_{column}": conv,
                     "diff": None if conv is None else conv - value, "our_benchmarks": t.height})
    return pl.DataFrame(rows, schema_overrides={f"our_{column}": pl.Float64, "diff": pl.Float64,
                                                "our_tau": pl.Float64})
