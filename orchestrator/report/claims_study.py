"""The study's own numbers (arXiv 2603.27027, as ../shared/STUDY.md restates them), as data, and
what they say about each claim's wording before any of our traces is read.

Every claim row of the report carries the study's numbers for its own backbone, temperature and
benchmark (``evidence``), and whether those numbers agree with the claim as worded
(``study_consistent``: True, False where the study contradicts itself, None where STUDY.md gives
no number for that cell)."""
from __future__ import annotations

import polars as pl

from .routers import POSTHOC

# The study's "confidence routed" numbers are its code's post hoc router's (routers.POSTHOC).
# (backbone, temperature, method, benchmark or "average", acceptance length, source)
STUDY_NUMBERS = [
    ("hass", 0.0, "math", "gsm8k", 5.02, "Table 1"), ("hass", 0.0, "math", "math500", 5.35, "Table 1"),
    ("hass", 0.0, "math", "mt_bench", 2.90, "Table 1"), ("hass", 0.0, "chat", "gsm8k", 4.09, "Table 1"),
    ("hass", 0.0, "chat", "math500", 3.98, "Table 1"), ("hass", 0.0, "chat", "mt_bench", 3.98, "Table 1"),
    ("hass", 0.0, "mixed_full", "average", 5.18, "Table 1"),
    ("hass", 0.0, "mixed_full", "mt_bench", 4.13, "Table 1"),
    ("hass", 0.0, "mixed_half", "mt_bench", 3.92, "Table 1"),
    ("hass", 0.0, "mixed_half", "math500", 5.02, "Table 1"),
    ("hass", 0.0, "avg0.5", "average", 2.59, "Table 1"),
    ("hass", 0.0, POSTHOC, "average", 4.80, "Table 1"),
    ("hass", 0.0, POSTHOC, "mt_bench", 3.93, "Table 1"),
    ("hass", 0.0, POSTHOC, "gsm8k", 5.01, "Table 1"),
    ("hass", 0.0, "merged", "average", 5.11, "Table 1"), ("hass", 0.0, "merged", "mt_bench", 4.05, "Table 1"),
    ("eagle2", 0.0, "math", "gsm8k", 5.04, "Table 1"), ("eagle2", 0.0, "math", "math500", 5.28, "Table 1"),
    ("eagle2", 0.0, "math", "svamp", 4.81, "Table 1"), ("eagle2", 0.0, "math", "mt_bench", 2.54, "Table 1"),
    ("eagle2", 0.0, "chat", "gsm8k", 3.72, "Table 1"), ("eagle2", 0.0, "chat", "math500", 3.81, "Table 1"),
    ("eagle2", 0.0, "chat", "svamp", 3.71, "Table 1"), ("eagle2", 0.0, "chat", "mt_bench", 3.57, "Table 1"),
    ("eagle2", 0.0, "mixed_full", "average", 4.48, "Table 1"),
    ("eagle2", 0.0, "mixed_half", "average", 4.02, "Table 1"),
    ("eagle2", 0.0, "avg0.5", "average", 2.42, "Table 1"),
    ("eagle2", 0.0, POSTHOC, "average", 4.63, "Table 1"),
    ("eagle2", 0.0, "merged", "average", 5.03, "Table 1"), ("hass", 1.0, "merged", "average", 4.75, "Table 1"),
    ("eagle2", 1.0, "merged", "average", 4.57, "Table 1"),
    ("hass", 1.0, "mixed_half", "average", 4.29, "Table 1"),
    ("hass", 1.0, "mixed_full", "average", 3.69, "Table 1"),
    ("eagle2", 1.0, "mixed_half", "average", 3.81, "Table 1"),
    ("eagle2", 1.0, "mixed_full", "average", 3.26, "Table 1"),
]

# Numbers that are not acceptance lengths: (quantity, backbone, temperature, method, benchmark, value, source).
# matched_share: share of prompts routed to the matched specialist (math on math benchmarks, chat on MT-Bench).
STUDY_OTHER = [
    ("matched_share", "eagle2", 0.0, "confidence", "gsm8k", 0.908, "Table 2"),
    ("matched_share", "eagle2", 0.0, "confidence", "math500", 0.970, "Table 2"),
    ("matched_share", "eagle2", 0.0, "confidence", "svamp", 0.930, "Table 2"),
    ("matched_share", "eagle2", 0.0, "confidence", "mt_bench", 0.812, "Table 2"),
    ("matched_share", "eagle2", 0.0, "entropy", "gsm8k", 0.546, "Table 2"),
    ("matched_share", "eagle2", 0.0, "entropy", "math500", 0.624, "Table 2"),
    ("matched_share", "eagle2", 0.0, "entropy", "svamp", 0.530, "Table 2"),
    ("matched_share", "eagle2", 0.0, "entropy", "mt_bench", 0.475, "Table 2"),
    ("draft_entropy_accepted", "eagle2", 0.0, "math", "gsm8k", 0.528, "Tables 3-4"),
    ("draft_entropy_rejected", "eagle2", 0.0, "math", "gsm8k", 1.076, "Tables 3-4"),
    ("accept_rate_d1", "eagle2", 0.0, "math", "math500", 0.979, "Tables 5-8"),
    ("accept_rate_d5", "eagle2", 0.0, "math", "math500", 0.815, "Tables 5-8"),
    ("accept_rate_d1", "eagle2", 0.0, "chat", "math500", 0.906, "Tables 5-8"),
    ("accept_rate_d5", "eagle2", 0.0, "chat", "math500", 0.655, "Tables 5-8"),
    ("accept_rate_d1", "eagle2", 0.0, "avg0.5", "math500", 0.893, "Tables 5-8"),
    ("accept_rate_d3", "eagle2", 0.0, "avg0.5", "math500", 0.301, "Tables 5-8"),
    # Section 7's coarse estimate (no wall clock): share of the best single checkpoint's speedup lost
    ("speedup_lost_min", "any", None, "confidence", "any", 0.32, "Section 7 (estimate)"),
    ("speedup_lost_max", "any", None, "confidence", "any", 0.47, "Section 7 (estimate)"),
    ("speedup_lost_min", "any", None, "merged", "any", 0.59, "Section 7 (estimate)"),
    ("speedup_lost_max", "any", None, "merged", "any", 0.78, "Section 7 (estimate)"),
]

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
    "Fig6": "no lambda of the averaging sweep recovers specialist-level acceptance (Figure 6)",
    "merged-best": "merged trees are the best method overall (Table 1, average)",
    "backbones": "the methods keep the same ordering on both backbones (Table 1, average)",
    "RQ4": "confidence routing separates the domains, entropy routing does not (Table 2)",
    "entropy": "rejected draft tokens carry higher draft entropy than accepted ones (Tables 3-4)",
    "RQ5": "acceptance falls with depth (Tables 5-8)",
    "depth-slope": "the matched specialist declines more slowly with depth than the mismatched (Tables 5-8)",
    "depth-shallow": "the mixed drafter leads the matched specialist at shallow depth 1-2 (Tables 5-8)",
    "speed": "confidence routing costs less speed than merged trees (Section 7 estimate)",
    # the study's proposed next experiments (no numbers in the study): checks of this project's strategies
    "switching": "acceptance-history switching beats confidence routing (proposed next experiment)",
    "switching-early": "early acceptance (first 3 steps) predicts whole-generation acceptance (switching's premise)",
    "switching-speed": "switching's acceptance gain survives its wall-clock cost: faster than confidence routing",
    "depth-adaptive-merged": "depth-adaptive composition beats budget-matched merged trees (proposed next experiment)",
    "depth-adaptive-routing": "depth-adaptive composition beats confidence routing at equal node budget "
                              "(proposed next experiment)",
}
NEXT = ("switching", "switching-early", "switching-speed", "depth-adaptive-merged", "depth-adaptive-routing")

NAMES = {"math": "MathInstruct 70k", "chat": "ShareGPT 70k", "mixed_half": "Mixed 35k+35k",
         "mixed_full": "Mixed 70k+70k", "avg0.5": "Averaged", POSTHOC: "Confidence routed",
         "merged": "Merged trees"}
FOUR = ("gsm8k", "math500", "mt_bench", "svamp")


def _t(temp) -> str:
    return f"T={temp:g}"


def tau_of(backbone: str, temp: float, method: str, bench: str) -> tuple[float | None, str]:
    """The study's τ for one cell; for "average" its own average, else the mean of the per-benchmark
    numbers STUDY.md gives (labelled with how many), else None."""
    hit = {b: v for bb, t, m, b, v, _ in STUDY_NUMBERS if (bb, t, m) == (backbone, temp, method)}
    if bench in hit:
        return hit[bench], f"{hit[bench]:.2f}"
    if bench == "average":
        per = [hit[b] for b in FOUR if b in hit]
        if len(per) >= 2:
            v = sum(per) / len(per)
            return v, f"{v:.2f} (mean of the {len(per)} benchmarks given)"
    return None, ""


def other_of(quantity: str, backbone: str, temp, method: str, bench: str) -> float | None:
    for q, bb, t, m, b, v, _ in STUDY_OTHER:
        if (q, bb, t, m, b) == (quantity, backbone, temp, method, bench):
            return v
    return None


def evidence(claim: str, text: str = "", consistent: bool | None = None, note: str = "") -> dict:
    return {"wording": WORDING.get(claim, ""), "study": text, "study_consistent": consistent, "study_note": note}


def none_for(claim: str, backbone: str, temp, bench: str = "average") -> dict:
    where = f"{backbone}, {_t(temp) if temp is not None else 'any T'}, {bench}"
    return evidence(claim, f"STUDY.md gives no number for this cell ({where})")


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
        return evidence("Fig6", "Figure 6: no λ of the sweep recovers (STUDY.md gives the sweep as a figure "
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
    if acc is None or rej is None:
        return none_for("entropy", backbone, temp, f"{method} on {bench}")
    return evidence("entropy", f"Tables 3-4 ({backbone}, {_t(temp)}, {NAMES[method]} on {bench}): "
                               f"rejected {rej:.3f} vs accepted {acc:.3f} nats", rej > acc)


def depth(claim: str, backbone: str, temp: float) -> dict:
    """Tables 5-8 numbers (EAGLE-2 T=0 MATH-500) for the depth claims."""
    r = {(m, d): other_of(f"accept_rate_d{d}", backbone, temp, m, "math500") for m in ("math", "chat")
         for d in (1, 5)}
    if None in r.values():
        return none_for(claim, backbone, temp, "acceptance by depth")
    text = (f"Tables 5-8 ({backbone}, {_t(temp)}, math500): MathInstruct {r['math', 1]:.1%} at depth 1 -> "
            f"{r['math', 5]:.1%} at 5; ShareGPT {r['chat', 1]:.1%} -> {r['chat', 5]:.1%}")
    if claim == "RQ5":
        return evidence(claim, text, r["math", 1] > r["math", 5] and r["chat", 1] > r["chat", 5])
    if claim == "depth-slope":
        fall_m, fall_c = r["math", 1] - r["math", 5], r["chat", 1] - r["chat", 5]
        return evidence(claim, text, fall_m < fall_c)
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


def backbones(temp: float) -> dict:
    """Kendall τ_b between the two backbones' orderings of the methods whose average both report."""
    from .stats import kendall_tau_b

    avg = {bb: {m: v for b2, t, m, bn, v, _ in STUDY_NUMBERS if (b2, t, bn) == (bb, temp, "average")}
           for bb in ("hass", "eagle2")}
    common = sorted(set(avg["hass"]) & set(avg["eagle2"]))
    if len(common) < 3:
        return none_for("backbones", "hass+eagle2", temp)

    def order(bb):
        return " > ".join(NAMES.get(m, m) for m in sorted(common, key=lambda m: -avg[bb][m]))

    import numpy as np

    k = float(kendall_tau_b(np.array([[avg["hass"][m] for m in common]]),
                            np.array([[avg["eagle2"][m] for m in common]]))[0])
    return evidence("backbones", f"Table 1 ({_t(temp)}, averages given for both): hass {order('hass')}; "
                                 f"eagle2 {order('eagle2')} (Kendall τ_b {k:.2f})", k == 1.0,
                    "" if k == 1.0 else "the study's own averages order the methods differently on the backbones")


def study_comparison(t1: pl.DataFrame) -> pl.DataFrame:
    """The study's numbers next to ours (same backbone, temperature, method, benchmark/average), in
    our convention (``our_tau``) and in the study's text's (``our_tau_study``, see tables.table1)."""
    rows = []
    has_study = "tau_study" in t1.columns
    for bb, temp, method, bench, value, source in STUDY_NUMBERS:
        t = t1.filter((pl.col("backbone") == bb) & (pl.col("temperature") == temp) & (pl.col("method") == method))
        if bench != "average":
            t = t.filter(pl.col("benchmark") == bench)
        ours = float(t["tau"].mean()) if t.height else None
        ours_s = float(t["tau_study"].mean()) if t.height and has_study else None
        rows.append({"backbone": bb, "temperature": temp, "method": method, "benchmark": bench, "study_tau": value,
                     "source": source, "our_tau": ours, "our_tau_study": ours_s, "our_benchmarks": t.height})
    return pl.DataFrame(rows)
