"""RQ1 and RQ2, the specialists and the mixtures (Table 1), and the joint bootstrap their combined
statements use.

RQ1: a specialist drafts longer on its own domain (Table 1). Each benchmark compares the two
specialists, the matched one first (math on the math benchmarks, chat on MT-Bench), tau paired by
prompt.

RQ2: mixed data against the specialists (Table 1). As the study states it, robustness: a mixed
drafter beats the mismatched specialist on every benchmark (RQ2), while the matched specialist often
beats it on its home benchmark (RQ2-home); and the two mixes trade places between T=0 and T=1
(RQ2-reversal).

Table 1 statements of the study that the RQ claims did not check (issue 64 item 4): the size of the
mismatch penalty (RQ1-penalty: a specialist off its domain loses 19-46% of its tau), specialisation
narrowing at T=1 (RQ1-narrows), the 70k+70k mixture above both specialists on average at T=0
(RQ2-full-above), entropy routing near the specialists' mean (entropy-routing-mean) and HASS slightly
above EAGLE-2 (hass-above-eagle2). Magnitudes (the penalty's range, "near") are the study's at
Llama-3-8B with 70k examples per domain: they are exploratory here, beside the study family's
directions. Every interval is a joint bootstrap over prompts (specialisation.py).

A joint bootstrap for claims that combine more than two cells: several (backbone, temperature,
method) cells on the same prompts of each benchmark, resampled together (one draw of prompt ids per
benchmark serves every cell), a statistic of their taus, and the verdicts of a statistic with a
direction (``tested``) or a range the study states (``in_range``)."""
from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np
import polars as pl

from orchestrator.report.claims import study
from orchestrator.report.claims.claim import EXPLORATORY, STUDY, Cell, Claim, Row, weights
from orchestrator.report.labels import HEADS, MIXED, SINGLES
from orchestrator.report.stats import B_TEST, _ci, data_rng, verdict
from orchestrator.report.study_tables import tau_of
from orchestrator.report.tables import MATH_BENCH


def _home(claim: Claim, cell: Cell, math_home: bool) -> list[Row]:
    """The matched minus the mismatched specialist on each benchmark of ``math_home``'s domain."""
    if not {"math", "chat"} <= cell.methods:
        return []
    rows = []
    a, b = ("math", "chat") if math_home else ("chat", "math")
    for bn in cell.benches:
        if (bn in MATH_BENCH) != math_home:
            continue
        ev = study.pair(cell.backbone, cell.temp, a, b, bn)
        rows.append(claim.tested(cell.backbone, cell.temp, f"{a} - {b} specialist on {bn} (tau)",
                                 *cell.on_bench(a, b, bn), ev, bench=bn))
    return rows


def _n_math(grid, backbone=None) -> int:
    return sum(b in MATH_BENCH for b in grid.benchmarks)


RQ1_CLAIMS = (
    Claim("RQ1-math", "a drafter trained on math data has the longer acceptance on math benchmarks (Table 1)",
          "math and chat specialists on a math benchmark", STUDY, partial(_home, math_home=True),
          study=lambda bb, t: study.pair(bb, t, "math", "chat", "gsm8k"), slots=_n_math),
    Claim("RQ1-chat", "a drafter trained on chat data has the longer acceptance on MT-Bench (Table 1)",
          "math and chat specialists on mt_bench", STUDY, partial(_home, math_home=False),
          study=lambda bb, t: study.pair(bb, t, "chat", "math", "mt_bench"),
          slots=lambda grid, backbone=None: len(grid.benchmarks) - _n_math(grid)),
)


def _against_specialist(claim: Claim, cell: Cell, home: bool) -> list[Row]:
    """Per mixed drafter and benchmark: mixed - mismatched specialist, or (``home``) matched - mixed."""
    if not {"math", "chat"} <= cell.methods:
        return []
    rows = []
    for mixed in MIXED:
        if mixed not in cell.methods:
            continue
        for bn in cell.benches:
            matched, mismatched = ("math", "chat") if bn in MATH_BENCH else ("chat", "math")
            a, b = (matched, mixed) if home else (mixed, mismatched)
            rows.append(claim.tested(cell.backbone, cell.temp, f"{a} - {b} on {bn} (tau)", *cell.on_bench(a,
                    b, bn),
                                     study.pair(cell.backbone, cell.temp, a, b, bn), bench=bn))
    return rows


def _reversal(claim: Claim, cell: Cell) -> list[Row]:
    """Mixed 70k+70k - Mixed 35k+35k at T=0, the other way round at T=1, average over benchmarks."""
    if not set(MIXED) <= cell.methods or cell.temp not in (0.0, 1.0):
        return []
    a, b = ("mixed_full", "mixed_half") if cell.temp == 0 else ("mixed_half", "mixed_full")
    return [claim.tested(cell.backbone, cell.temp, f"{a} - {b}, average over benchmarks", *cell.average(a, b),
                         study.reversal(cell.backbone, cell.temp))]


def _both_temperatures(backbones: list[str], temps: list[float]) -> list[tuple[str, float]]:
    """The reversal is a claim about T=0 and T=1: both are checked (reported missing) whatever the grid."""
    return [(bb, t) for bb in backbones for t in sorted(set(temps) | {0.0, 1.0})]


def _per_mixed_bench(grid, backbone=None) -> int:
    return len(MIXED) * len(grid.benchmarks)


RQ2_CLAIMS = (
    Claim("RQ2", "mixed data is robust: it beats the mismatched specialist on every benchmark (Table 1)",
          "a mixed drafter and both specialists", STUDY, partial(_against_specialist, home=False),
          study=lambda bb, t: study.pair(bb, t, "mixed_full", "math", "mt_bench"), slots=_per_mixed_bench),
    Claim("RQ2-home", "on its home domain the matched specialist often beats mixed data (Table 1)",
          "a mixed drafter and both specialists", STUDY, partial(_against_specialist, home=True),
          study=lambda bb, t: study.pair(bb, t, "chat", "mixed_full", "mt_bench"), slots=_per_mixed_bench),
    Claim("RQ2-reversal", "Mixed 70k+70k leads Mixed 35k+35k at T=0; the order reverses at T=1 (Table 1)",
          "mixed_half and mixed_full at this temperature (T=0 and T=1 for the reversal)", STUDY, _reversal,
          study=study.reversal, keys=_both_temperatures),
)


Key = tuple  # (backbone, temperature, method)


def aligned(pp: pl.DataFrame, keys: list[Key], bench: str) -> dict[Key, tuple[np.ndarray, np.ndarray]]:
    """{key: (new tokens, verifier calls)} per prompt of ``bench`` that every key's cell has, in
    prompt_id order; {} where a cell has no rows."""
    frames = []
    for i, (bb, t, m) in enumerate(keys):
        g = pp.filter((pl.col("backbone") == bb) & (pl.col("temperature") == t) & (pl.col("method") == m)
                      & (pl.col("benchmark") == bench))
        if g.is_empty():
            return {}
        frames.append(g.select("prompt_id", pl.col("new_tokens").alias(f"n{i}"),
                               pl.col("verifier_calls").alias(f"d{i}")))
    j = frames[0]
    for f in frames[1:]:
        j = j.join(f, on="prompt_id")
    j = j.sort("prompt_id")
    return {k: (j[f"n{i}"].to_numpy().astype(float), j[f"d{i}"].to_numpy().astype(float))
            for i, k in enumerate(keys)} if j.height else {}


Stat = Callable[[dict], np.ndarray]  # {key: tau, each (R,) or scalar} -> statistic (R,)


def draws(groups: list[dict], stat: Stat, weights: list[float], seed: int = 0,
          b: int = B_TEST) -> tuple[float, np.ndarray | None, int]:
    """(point, draws, fewest prompts) of the weighted mean over benchmarks of ``stat`` of the cells'
    taus; each benchmark's prompts resampled jointly for all its cells; draws None below 2 prompts."""
    keep = [(g, w) for g, w in zip(groups, weights) if g and all(d.sum() > 0 for _, d in g.values())]
    if not keep:
        return float("nan"), None, 0
    wsum = sum(w for _, w in keep)
    n = min(len(next(iter(g.values()))[0]) for g, _ in keep)
    point = sum(w * float(stat({k: nu.sum() / de.sum() for k, (nu, de) in g.items()})) for g, w in keep)
    point /= wsum
    if n < 2:
        return point, None, n
    rng = data_rng(seed, *(np.stack([x for nd in g.values() for x in nd]) for g, _ in keep))
    acc = np.zeros(b)
    for g, w in keep:
        m = len(next(iter(g.values()))[0])
        idx = rng.integers(0, m, size=(b, m))
        taus = {k: nu[idx].sum(1) / np.maximum(de[idx].sum(1), 1e-12) for k, (nu, de) in g.items()}
        acc += w * stat(taus)
    return point, acc / wsum, n


def tested(point: float, d: np.ndarray | None, expected_positive: bool = True) -> tuple[tuple, str]:
    """((estimate, lo, hi, p), verdict) of a statistic claimed above 0 (below 0: not expected_positive)."""
    if d is None or not np.isfinite(point):
        return (point, np.nan, np.nan, np.nan), "inconclusive"
    est, lo, hi, p = _ci(point, d, True)
    return (est, lo, hi, p), verdict(lo, hi, expected_positive)


def in_range(point: float, d: np.ndarray | None, low: float, high: float) -> tuple[tuple, str]:
    """((estimate, lo, hi, p), verdict) of a statistic the study puts in [low, high]: holds when the 95%
    interval lies inside it (p: the larger one-sided share of draws beyond a bound, doubled: two
    one-sided tests), does not hold when the interval misses it (p: the share of draws on the range's
    side of its nearer bound, doubled), else inconclusive (p of whichever is smaller)."""
    if d is None or not np.isfinite(point):
        return (point, np.nan, np.nan, np.nan), "inconclusive"
    lo, hi = np.percentile(d, [2.5, 97.5])
    floor = 1 / (len(d) + 1)
    p_in = max(floor, min(1.0, 2 * max((d <= low).mean(), (d >= high).mean())))
    p_out = max(floor, min(1.0, 2 * min((d >= low).mean(), (d <= high).mean())))
    v = "holds" if low <= lo and hi <= high else "does not hold" if hi < low or lo > high else "inconclusive"
    p = p_in if v == "holds" else p_out if v == "does not hold" else min(p_in, p_out)
    return (float(point), float(lo), float(hi), float(p)), v


__all__ = ["aligned", "draws", "in_range", "tested"]


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
        g = aligned(cell.prompts, [ka, kb], bn)
        point, d, n = draws([g], lambda t, ka=ka, kb=kb: 1 - t[kb] / t[ka], [1.0])
        res, v = in_range(point, d, *PENALTY)
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
        g = aligned(cell.prompts, ks, bn)
        if not g:
            continue
        point, d, n = draws([g], lambda t, ks=ks: (t[ks[0]] - t[ks[1]]) - (t[ks[2]] - t[ks[3]]), [1.0])
        res, v = tested(point, d)
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
    groups = [aligned(cell.prompts, [ke, km, kc], bn) for bn in cell.benches]
    point, d, n = draws(groups, lambda t: t[ke] / ((t[km] + t[kc]) / 2) - 1,
                              weights(cell.benches, cell.weighting))
    res, v = in_range(point, d, -NEAR, NEAR)
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
    groups = [aligned(cell.prompts, keys, bn) for bn in cell.benches]
    def gap(t: dict):  # HASS - EAGLE-2, mean over the common checkpoints
        return sum(t[keys[2 * i]] - t[keys[2 * i + 1]] for i in range(len(common))) / len(common)

    point, d, n = draws(groups, gap, weights(cell.benches, cell.weighting))
    res, v = tested(point, d)
    return [_row(claim, cell, f"hass - eagle2 tau, mean over {', '.join(common)}, average ({cell.weighting})",
                 res, v, n, _hass_ev(cell.temp), backbone="hass+eagle2")]


def _per_bench(grid, backbone=None) -> int:
    return len(grid.benchmarks)


SEED_TABLE1_CLAIMS = (
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
