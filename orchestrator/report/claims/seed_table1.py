"""Table 1 statements of the study that the RQ claims did not check (issue 64 item 4): the size of the
mismatch penalty (RQ1-penalty: a specialist off its domain loses 19-46% of its tau), specialisation
narrowing at T=1 (RQ1-narrows), the 70k+70k mixture above both specialists on average at T=0
(RQ2-full-above), entropy routing near the specialists' mean (entropy-routing-mean) and HASS slightly
above EAGLE-2 (hass-above-eagle2). Magnitudes (the penalty's range, "near") are the study's at
Llama-3-8B with 70k examples per domain: they are exploratory here, beside the study family's
directions. Every interval is a joint bootstrap over prompts (joint.py)."""
from __future__ import annotations

import polars as pl

from ..labels import HEADS, SINGLES
from ..study_tables import tau_of
from ..tables import MATH_BENCH
from . import joint, study
from .claim import EXPLORATORY, STUDY, Cell, Claim, Row
from .weighting import weights

PENALTY = (0.19, 0.46)  # the study's mismatch penalty: share of the matched specialist's tau lost off-domain
NEAR = 0.10  # "near the specialists' mean": within 10% of it (the project's reading; the study has no bound)
ENTROPY_ROUTERS = (HEADS, "entropy(prompt)", "entropy(turn)", "entropy(step)")  # the study's first


def _row(claim: Claim, cell: Cell, what: str, res: tuple, v: str, n: int, ev: dict, bench=None,
         backbone: str | None = None) -> Row:
    est, lo, hi, p = res
    return claim.row(backbone or cell.backbone, cell.temp, what, est, lo, hi, v, n, p, ev, bench)


def _matched(bench: str) -> tuple[str, str]:
    return ("math", "chat") if bench in MATH_BENCH else ("chat", "math")


def _penalty_ev(backbone: str, temp: float, bench: str) -> dict:
    a, b = _matched(bench)
    (va, ta), (vb, tb) = tau_of(backbone, temp, a, bench), tau_of(backbone, temp, b, bench)
    if va is None or vb is None:
        return study.none_for(backbone, temp, bench)
    loss = 1 - vb / va
    text = (f"Table 1 ({backbone}, T={temp:g}, {bench}): {study.NAMES[b]} {tb} vs {study.NAMES[a]} {ta}: "
            f"{loss:.1%} lost off-domain")
    return study.evidence(text, PENALTY[0] <= loss <= PENALTY[1])


def _penalty(claim: Claim, cell: Cell) -> list[Row]:
    """Per benchmark: 1 - tau of the mismatched specialist / tau of the matched one, in [0.19, 0.46]."""
    if not {"math", "chat"} <= cell.methods:
        return []
    rows = []
    for bn in cell.benches:
        a, b = _matched(bn)
        ka, kb = (cell.backbone, cell.temp, a), (cell.backbone, cell.temp, b)
        g = joint.aligned(cell.prompts, [ka, kb], bn)
        point, d, n = joint.draws([g], lambda t: 1 - t[kb] / t[ka], [1.0])
        res, v = joint.in_range(point, d, *PENALTY)
        what = (f"1 - {b}/{a} specialist tau on {bn} (share lost off-domain; study: "
                f"{PENALTY[0]:.0%}-{PENALTY[1]:.0%})")
        rows.append(_row(claim, cell, what, res, v, n, _penalty_ev(cell.backbone, cell.temp, bn), bn))
    return rows


def _narrows_ev(backbone: str, bench: str) -> dict:
    a, b = _matched(bench)
    v = {(m, t): tau_of(backbone, t, m, bench)[0] for m in (a, b) for t in (0.0, 1.0)}
    if None in v.values():
        return study.none_for(backbone, 1.0, bench)
    g0, g1 = v[a, 0.0] - v[b, 0.0], v[a, 1.0] - v[b, 1.0]
    text = (f"Table 1 ({backbone}, {bench}): {study.NAMES[a]} - {study.NAMES[b]} {g0:+.2f} at T=0, "
            f"{g1:+.2f} at T=1")
    return study.evidence(text, g0 > g1)


def _narrows(claim: Claim, cell: Cell) -> list[Row]:
    """At T=1, per benchmark: (matched - mismatched specialist at T=0) - (the same at T=1), same prompts."""
    if cell.temp != 1.0 or not {"math", "chat"} <= cell.methods:
        return []
    rows = []
    for bn in cell.benches:
        a, b = _matched(bn)
        ks = [(cell.backbone, t, m) for t in (0.0, 1.0) for m in (a, b)]
        g = joint.aligned(cell.prompts, ks, bn)
        if not g:
            continue
        point, d, n = joint.draws([g], lambda t: (t[ks[0]] - t[ks[1]]) - (t[ks[2]] - t[ks[3]]), [1.0])
        res, v = joint.tested(point, d)
        rows.append(_row(claim, cell, f"({a} - {b}) at T=0 - the same at T=1 on {bn} (tau)", res, v, n,
                         _narrows_ev(cell.backbone, bn), bn))
    return rows


def _full_above(claim: Claim, cell: Cell) -> list[Row]:
    """At T=0: Mixed 70k+70k minus each specialist, average over benchmarks (the study's weighting)."""
    if cell.temp != 0.0 or not {"mixed_full", "math", "chat"} <= cell.methods:
        return []
    return [claim.tested(cell.backbone, cell.temp, f"mixed_full - {s}, average ({cell.weighting})",
                         *cell.average("mixed_full", s),
                         study.pair(cell.backbone, 0.0, "mixed_full", s, "average"))
            for s in ("math", "chat")]


def _entropy_mean(claim: Claim, cell: Cell) -> list[Row]:
    """tau of entropy routing - the mean of the two specialists' taus, average over benchmarks; "near":
    within NEAR of the specialists' mean (relative)."""
    router = next((r for r in ENTROPY_ROUTERS if r in cell.methods), None)
    if router is None or not {"math", "chat"} <= cell.methods:
        return []
    ke, km, kc = ((cell.backbone, cell.temp, m) for m in (router, "math", "chat"))
    groups = [joint.aligned(cell.prompts, [ke, km, kc], bn) for bn in cell.benches]
    point, d, n = joint.draws(groups, lambda t: t[ke] / ((t[km] + t[kc]) / 2) - 1,
                              weights(cell.benches, cell.weighting))
    res, v = joint.in_range(point, d, -NEAR, NEAR)
    ev = study.evidence("the study's text: entropy routing lands near the specialists' mean (no bound given; "
                        f"read here as within {NEAR:.0%})")
    return [_row(claim, cell, f"{router} / mean of the math and chat specialists - 1, tau, average "
                 f"({cell.weighting})", res, v, n, ev)]


def _hass_ev(temp: float) -> dict:
    diffs = {m: (tau_of("hass", temp, m, "average")[0], tau_of("eagle2", temp, m, "average")[0])
             for m in SINGLES}
    diffs = {m: h - e for m, (h, e) in diffs.items() if h is not None and e is not None}
    if not diffs:
        return study.none_for("hass+eagle2", temp)
    text = ", ".join(f"{study.NAMES[m]} {x:+.2f}" for m, x in diffs.items())
    mean = sum(diffs.values()) / len(diffs)
    return study.evidence(f"Table 1 (T={temp:g}, averages), HASS - EAGLE-2: {text} (mean {mean:+.2f})",
                          mean > 0)


def _hass_above(claim: Claim, cell: Cell) -> list[Row]:
    """Per temperature: HASS - EAGLE-2 tau, mean over the single checkpoints both trained, average over
    benchmarks, every cell on the same prompts."""
    if not {"hass", "eagle2"} <= set(cell.backbones):
        return []
    pp = cell.prompts.filter(pl.col("temperature") == cell.temp)
    have = {bb: set(pp.filter(pl.col("backbone") == bb)["method"].to_list()) for bb in ("hass", "eagle2")}
    common = [m for m in SINGLES if m in have["hass"] & have["eagle2"]]
    if not common:
        return []
    keys = [(bb, cell.temp, m) for m in common for bb in ("hass", "eagle2")]
    groups = [joint.aligned(cell.prompts, keys, bn) for bn in cell.benches]
    def gap(t: dict):  # HASS - EAGLE-2, mean over the common checkpoints
        return sum(t[keys[2 * i]] - t[keys[2 * i + 1]] for i in range(len(common))) / len(common)

    point, d, n = joint.draws(groups, gap, weights(cell.benches, cell.weighting))
    res, v = joint.tested(point, d)
    return [_row(claim, cell, f"hass - eagle2 tau, mean over {', '.join(common)}, average ({cell.weighting})",
                 res, v, n, _hass_ev(cell.temp), backbone="hass+eagle2")]


def _per_bench(grid, backbone=None) -> int:
    return len(grid.benchmarks)


CLAIMS = (
    Claim("RQ1-penalty", "a specialist off its domain loses 19-46% of its acceptance length (Table 1)",
          "math and chat specialists", EXPLORATORY, _penalty,
          study=lambda bb, t: _penalty_ev(bb, t, "mt_bench"), slots=_per_bench),
    Claim("RQ1-narrows", "specialisation narrows at T=1: the matched specialist's lead is smaller than at "
          "T=0 (Table 1)", "math and chat specialists at T=0 and T=1", STUDY, _narrows,
          study=lambda bb, t: _narrows_ev(bb, "mt_bench"), keys=lambda bbs, temps: [(bb, 1.0) for bb in bbs],
          slots=_per_bench),
    Claim("RQ2-full-above", "at T=0 Mixed 70k+70k is above both specialists on average (Table 1)",
          "mixed_full and both specialists at T=0", STUDY, _full_above,
          study=lambda bb, t: study.pair(bb, 0.0, "mixed_full", "chat", "average"),
          keys=lambda bbs, temps: [(bb, 0.0) for bb in bbs], slots=lambda grid, backbone=None: 2),
    Claim("entropy-routing-mean", "entropy routing lands near the specialists' mean (Table 1 and its text)",
          f"an entropy router ({HEADS} first) and both specialists", EXPLORATORY, _entropy_mean),
    Claim("hass-above-eagle2", "HASS is slightly above EAGLE-2 for the same training data (Table 1)",
          "both backbones' single drafters", STUDY, _hass_above, study=lambda bb, t: _hass_ev(t),
          keys=lambda backbones, temps: [("hass+eagle2", t) for t in temps], across_backbones=True),
)
