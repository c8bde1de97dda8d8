"""The study's own numbers for each claim's cell (study_tables.csv, through study_tables' lookups), and
whether they agree with the claim as worded, before any of our traces is read.

Every claim row of the report carries the study's numbers for its own backbone, temperature and
benchmark (``study``), and whether those numbers agree with the claim's wording
(``study_consistent``: True, False where the study contradicts itself, None where the study gives
no number for that cell). Where the paper's text and TAPS's README give a cell differently, the
paper's number is used here and both are in the CSV and in the comparison table. Each function
here returns those columns (``evidence``) for one cell."""
from __future__ import annotations

import numpy as np

from orchestrator.report.labels import POSTHOC
from orchestrator.report.stats import kendall_tau_b
from orchestrator.report.study_tables import FOUR, STUDY_NUMBERS, other_of, tau_of

NAMES = {"math": "MathInstruct 70k", "chat": "ShareGPT 70k", "mixed_half": "Mixed 35k+35k",
         "mixed_full": "Mixed 70k+70k", "avg0.5": "Averaged", POSTHOC: "Confidence routed",
         "merged": "Merged trees"}


def _t(temp) -> str:
    return f"T={temp:g}"


def evidence(text: str = "", consistent: bool | None = None, note: str = "") -> dict:
    """A row's study columns: the study's numbers for its cell (``study``), whether they agree with the
    claim's wording (``study_consistent``; None: no number) and a note."""
    return {"study": text, "study_consistent": consistent, "study_note": note}


def none_for(backbone: str, temp, bench: str = "average") -> dict:
    where = f"{backbone}, {_t(temp) if temp is not None else 'any T'}, {bench}"
    return evidence(f"the study gives no number for this cell ({where})")


def pair(backbone: str, temp: float, a: str, b: str, bench: str, a_better: bool = True,
         note: str = "") -> dict:
    """The study's τ of a and b in this cell, and whether they order as the claim says."""
    va, ta = tau_of(backbone, temp, a, bench)
    vb, tb = tau_of(backbone, temp, b, bench)
    if va is None or vb is None:
        return none_for(backbone, temp, bench) | ({"study_note": note} if note else {})
    text = f"Table 1 ({backbone}, {_t(temp)}, {bench}): {NAMES.get(a, a)} {ta} vs {NAMES.get(b, b)} {tb}"
    ok = (va > vb) if a_better else (va < vb)
    if not ok:
        note = (f"the study's own numbers contradict this wording here ({NAMES.get(a, a)} {ta}, "
                f"{NAMES.get(b, b)} {tb}). " + note).strip()
    return evidence(text, ok, note)


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
        return none_for(backbone, temp)
    return pair(backbone, temp, routed, best, "average")


def merged_best(backbone: str, temp: float) -> dict:
    others = {m for bb, t, m, *_ in STUDY_NUMBERS if (bb, t) == (backbone, temp) and m != "merged"}
    vals = {m: tau_of(backbone, temp, m, "average")[0] for m in others}
    vals = {m: v for m, v in vals.items() if v is not None}
    if not vals or tau_of(backbone, temp, "merged", "average")[0] is None:
        return none_for(backbone, temp)
    return pair(backbone, temp, "merged", max(vals, key=vals.get), "average")


def rq3c(backbone: str, temp: float) -> dict:
    worst = {m: tau_of(backbone, temp, m, "average")[0] for m in ("math", "chat", "mixed_half", "mixed_full")}
    worst = {m: v for m, v in worst.items() if v is not None}
    if not worst or tau_of(backbone, temp, "avg0.5", "average")[0] is None:
        return none_for(backbone, temp)
    return pair(backbone, temp, "avg0.5", min(worst, key=worst.get), "average", a_better=False)


def fig6(backbone: str, temp: float) -> dict:
    best, _ = best_single(backbone, temp, ("math", "chat"))
    if best is None or tau_of(backbone, temp, "avg0.5", "average")[0] is None:
        return evidence("Figure 6: no λ of the sweep recovers (the study gives the sweep as a figure "
                        f"only; no λ=0.5 number for {backbone}, {_t(temp)})")
    ev = pair(backbone, temp, "avg0.5", best, "average", a_better=False)
    return ev | {"study": "Figure 6: no λ of the sweep recovers; λ=0.5 in " + ev["study"]}


def reversal(backbone: str, temp: float) -> dict:
    a, b = ("mixed_full", "mixed_half") if temp == 0 else ("mixed_half", "mixed_full")
    ev = pair(backbone, temp, a, b, "average")
    partial = "mean of" in tau_of(backbone, temp, a, "average")[1] + tau_of(backbone, temp, b, "average")[1]
    if ev["study_consistent"] is None or partial:  # HASS T=0 has no 35k+35k average: compare where both are
        shared = [bn for bn in FOUR
                  if None not in (tau_of(backbone, temp, a, bn)[0], tau_of(backbone, temp, b, bn)[0])]
        if shared:
            ev = pair(backbone, temp, a, b, shared[0])
    return ev


def rq4(backbone: str, temp: float, granularity: str) -> dict:
    c = [other_of("matched_share", backbone, temp, "confidence", b) for b in FOUR]
    e = [other_of("matched_share", backbone, temp, "entropy", b) for b in FOUR]
    if None in c or None in e:
        return none_for(backbone, temp, "routing shares (Table 2 is EAGLE-2 only)")
    mc, me = sum(c) / 4, sum(e) / 4
    return evidence(f"Table 2 ({backbone}, {_t(temp)}): share routed to the matched specialist, mean of "
                    f"4 benchmarks: confidence {mc:.3f} vs entropy {me:.3f}", mc > me,
                    "" if granularity == "prompt"
                    else "the study routes once per prompt; this row routes per "
                                                       f"{granularity}")


def entropy(backbone: str, temp: float, method: str, bench: str) -> dict:
    acc = other_of("draft_entropy_accepted", backbone, temp, method, bench)
    rej = other_of("draft_entropy_rejected", backbone, temp, method, bench)
    gap = other_of("draft_entropy_gap", backbone, temp, method, bench)
    if acc is not None and rej is not None:
        return evidence(f"Tables 3-4 ({backbone}, {_t(temp)}, {NAMES[method]} on {bench}): "
                        f"rejected {rej:.3f} vs accepted {acc:.3f} nats", rej > acc)
    if gap is not None:
        return evidence(f"Figure 7 ({backbone}, {_t(temp)}, {NAMES[method]} on {bench}): rejected - "
                        f"accepted draft entropy {gap:+.2f} nats (TAPS README)", gap > 0)
    return none_for(backbone, temp, f"{method} on {bench}")


def verifier_entropy(backbone: str, temp: float) -> dict:
    return evidence("Tables 3-4: 'verifier entropy shows the same direction' (the study's "
                    f"text; no verifier-entropy number for {backbone}, {_t(temp)} in the data)")


def rq3c_cell(backbone: str, temp: float, bench: str, rivals) -> dict:
    """The averaged checkpoint against the lowest other Table 1 row of this cell."""
    mine = tau_of(backbone, temp, "avg0.5", bench)[0]
    vals = {m: tau_of(backbone, temp, m, bench)[0] for m in rivals}
    vals = {m: v for m, v in vals.items() if v is not None}
    if mine is None or not vals:
        return none_for(backbone, temp, bench)
    return pair(backbone, temp, "avg0.5", min(vals, key=vals.get), bench, a_better=False)


def rq3c_all(backbone: str, temp: float) -> dict:
    """The averaged checkpoint against every other Table 1 row, each benchmark of the study."""
    rivals = [m for m in NAMES if m != "avg0.5"]
    evs = [rq3c_cell(backbone, temp, bn, rivals) for bn in FOUR]
    known = [e for e in evs if e["study_consistent"] is not None]
    if not known:
        return none_for(backbone, temp, "every benchmark")
    bad = [e for e in known if e["study_consistent"] is False]
    if bad:
        return evidence("; ".join(e["study"] for e in bad), False, bad[0]["study_note"])
    return evidence(f"Table 1 ({backbone}, {_t(temp)}): Averaged is the lowest row on all "
                    f"{len(known)} benchmarks", True)


def _depth_rates(backbone: str, temp: float) -> dict:
    """Tables 5-8 numbers (EAGLE-2 T=0 MATH-500): (drafter, depth) -> acceptance rate or None."""
    return {(m, d): other_of(f"accept_rate_d{d}", backbone, temp, m, "math500") for m in ("math", "chat",
            "avg0.5")
            for d in (1, 3, 5)}


def _specialists_text(r: dict, backbone: str, temp: float) -> str | None:
    """Both specialists from depth 1 to 5, or None where the study gives no such numbers."""
    if None in (r["math", 1], r["math", 5], r["chat", 1], r["chat", 5]):
        return None
    return (f"Tables 5-8 ({backbone}, {_t(temp)}, math500): MathInstruct {r['math', 1]:.1%} at depth 1 -> "
            f"{r['math', 5]:.1%} at 5; ShareGPT {r['chat', 1]:.1%} -> {r['chat', 5]:.1%}")


def rq5(backbone: str, temp: float, method: str | None = None) -> dict:
    """Acceptance falls with depth: ``method``'s numbers (RQ5's row of that variant), else both
    specialists'."""
    r = _depth_rates(backbone, temp)
    if method is not None:
        deep = max((d for d in (3, 5) if r[method, d] is not None), default=None) if (method,
                1) in r else None
        if deep is None or r[method, 1] is None:
            return none_for(backbone, temp, f"acceptance by depth of {method}")
        return evidence(f"Tables 5-8 ({backbone}, {_t(temp)}, math500): {NAMES.get(method, method)} "
                        f"{r[method, 1]:.1%} at depth 1 -> {r[method, deep]:.1%} at {deep}",
                        r[method, 1] > r[method, deep])
    text = _specialists_text(r, backbone, temp)
    if text is None:
        return none_for(backbone, temp, "acceptance by depth")
    return evidence(text, r["math", 1] > r["math", 5] and r["chat", 1] > r["chat", 5])


def depth_slope(backbone: str, temp: float) -> dict:
    """The math specialist's fall from depth 1 to 5 against the chat specialist's (MATH-500: math matched)."""
    r = _depth_rates(backbone, temp)
    text = _specialists_text(r, backbone, temp)
    if text is None:
        return none_for(backbone, temp, "acceptance by depth")
    fall_m, fall_c = r["math", 1] - r["math", 5], r["chat", 1] - r["chat", 5]
    return evidence(text, fall_m < fall_c)


def _mixed_by_depth(backbone: str, temp: float, missing: str, wording: str) -> dict:
    """The specialists' rates by depth as evidence; the study gives none for the mixed drafters."""
    text = _specialists_text(_depth_rates(backbone, temp), backbone, temp)
    if text is None:
        return none_for(backbone, temp, "acceptance by depth")
    return evidence(f"{text}; no number for the mixed drafters by depth{missing}", None, wording)


def depth_shallow(backbone: str, temp: float) -> dict:
    return _mixed_by_depth(backbone, temp, "",
                           "the study's text says 'competitive at depths 1-2', weaker than 'leads'")


def depth_deep(backbone: str, temp: float) -> dict:
    return _mixed_by_depth(backbone, temp, " (Figure 8 only)",
                           "the study's text: 'the matched specialist dominates at depths 4-5'")


def speed() -> dict:
    v = {(m, q): other_of(q, "any", None, m, "any") for m in ("confidence", "merged")
         for q in ("speedup_lost_min", "speedup_lost_max")}
    text = (f"Section 7 (coarse estimate, no wall clock): confidence routing loses "
            f"{v['confidence', 'speedup_lost_min']:.2f}x-{v['confidence', 'speedup_lost_max']:.2f}x "
            f"of the best single checkpoint's speedup, merged trees "
            f"{v['merged', 'speedup_lost_min']:.2f}x-{v['merged', 'speedup_lost_max']:.2f}x")
    return evidence(text, v["confidence", "speedup_lost_max"] < v["merged", "speedup_lost_min"],
                    "the study estimated, never measured, speed")


def proposed(backbone: str | None = None, temp: float | None = None) -> dict:
    """The study proposes these experiments and gives no numbers for them (any backbone and temperature)."""
    return evidence("no numbers: the study proposes this experiment (STUDY.md, 'What the paper left open')")


def backbones(temp: float, methods=None) -> dict:
    """Whether the study's own averages order the methods identically on both backbones (its claim),
    with Kendall τ_b as the supporting number; over ``methods`` when given (the methods the run
    compares), so the study's side and the run's side order the same set."""
    avg = {bb: {m: tau_of(bb, temp, m, "average")[0] for m in NAMES} for bb in ("hass", "eagle2")}
    common = sorted(m for m in NAMES if avg["hass"][m] is not None and avg["eagle2"][m] is not None
                    and (methods is None or m in methods))
    if len(common) < 3:
        return none_for("hass+eagle2", temp)

    def order(bb):
        return [m for m in sorted(common, key=lambda m: -avg[bb][m])]

    k = float(kendall_tau_b(np.array([[avg["hass"][m] for m in common]]),
                            np.array([[avg["eagle2"][m] for m in common]]))[0])
    same = order("hass") == order("eagle2")
    text = (f"Table 1 ({_t(temp)}, averages): hass {' > '.join(NAMES[m] for m in order('hass'))}; eagle2 "
            f"{' > '.join(NAMES[m] for m in order('eagle2'))} ({'the same' if same else 'a different'} "
            "order; "
            f"Kendall τ_b {k:.2f})")
    return evidence(text, same,
                    "" if same else "the study's own averages order the methods differently on the backbones")
