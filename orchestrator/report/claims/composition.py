"""RQ3 and RQ4, composing two specialists and routing between them, the ordering of the methods across
backbones, and the speed estimate.

RQ3: composing two specialists (Table 1, Figure 6). Merged trees against the study's confidence
routing (RQ3a), that routing against the best single drafter (RQ3b), the weight-averaged drafter
the weakest (RQ3c) and the worst in every cell (RQ3c-cells), no λ of the averaging sweep recovering
the better specialist (Fig6), merged trees the best method overall (merged-best). The routing rows
use ``ROUTED``, the router behind the study's Table 1 numbers (labels.py).

RQ4: confidence routing separates the domains, entropy routing does not (Table 2). Domain
separation is the share of prompts routed to the matched specialist (math on the math benchmarks,
chat on MT-Bench); confidence minus entropy routing, paired over prompts.

The methods keep the same ordering on both backbones (Table 1, average): Kendall tau_b between the
two backbones' orderings of the methods both ran (mean tau over benchmarks, weighted as the study's
average: claim.py), with a bootstrap over prompts, the same resampled prompts for every cell of a
benchmark. The study's pair is HASS and EAGLE-2; a run without it compares EAGLE-3 with EAGLE-2 (or any
two backbones), exploratory.

The study's cost estimate, measured: confidence routing costs less speed than merged trees. Tokens
per second of the deployable per-prompt router (``SPEED_ROUTED``: the post hoc router has no
deployable wall clock) minus merged trees, a ratio of sums over the same prompts, mean over
benchmarks, where the traces carry wall-clock times; cells timed in different grid invocations are
not compared."""
from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import polars as pl

from orchestrator.report.claims import study
from orchestrator.report.claims.claim import (
    EXPLORATORY,
    NAN,
    STUDY,
    STUDY_W,
    TIMED_APART,
    Cell,
    Claim,
    Row,
    mean_tau,
    named,
    picks,
    weights,
)
from orchestrator.report.labels import HEADS, HEADS_LAST, ORACLE, ROUTED, SINGLES, SPEED_ROUTED
from orchestrator.report.routers import chosen_name, last_turn_rows, matched_expr
from orchestrator.report.stats import B_TEST, data_rng, kendall_tau_b, mean_diff_ci

ROUTING_NOTE = (f"this row's routing is {ROUTED}, the study's code's router behind its Table 1 numbers; "
                "not deployable (sees both whole generations)")


def _mean_tau(cell: Cell, m: str, benches) -> float:
    """``m``'s tau (ratio of sums) per benchmark of ``benches``, averaged as the cell weights them
    (claim.py); -inf where it has none."""
    return mean_tau(cell.prompts, cell.backbone, cell.temp, m, list(benches), cell.weighting)


def _pick(cell: Cell, methods: list[str], best: bool = True) -> tuple[str, str]:
    """(the best or worst of ``methods`` under the cell's weighting, its name with the other
    weighting's pick where that differs: weighting.named)."""
    choice = picks(cell.prompts, cell.backbone, cell.temp, methods, cell.benches, best)
    return choice[cell.weighting], named(choice, "best" if best else "worst", cell.weighting)


def _singles(cell: Cell) -> list[str]:
    return [m for m in SINGLES if m in cell.methods]


def _rq3a(claim: Claim, cell: Cell) -> list[Row]:
    if not {"merged", ROUTED} <= cell.methods:
        return []
    ev = study.pair(cell.backbone, cell.temp, "merged", ROUTED, "average", note=ROUTING_NOTE)
    return [claim.tested(cell.backbone, cell.temp, f"merged - {ROUTED}, average", *cell.average("merged",
            ROUTED),
                         ev)]


def _rq3b(claim: Claim, cell: Cell) -> list[Row]:
    singles = _singles(cell)
    if ROUTED not in cell.methods or not singles:
        return []
    best, text = _pick(cell, singles)
    ev = study.rq3b(cell.backbone, cell.temp, ROUTED)
    ev["study_note"] = "; ".join(x for x in (ev["study_note"], ROUTING_NOTE) if x)
    what = f"{ROUTED} - best single ({text}), average ({cell.weighting})"
    return [claim.tested(cell.backbone, cell.temp, what, *cell.average(ROUTED, best), ev)]


def _rq3c(claim: Claim, cell: Cell) -> list[Row]:
    singles = _singles(cell)
    if "avg0.5" not in cell.methods or not singles:
        return []
    worst, text = _pick(cell, singles, best=False)
    what = f"averaged - worst specialist ({text}), average ({cell.weighting})"
    return [claim.tested(cell.backbone, cell.temp, what, *cell.average("avg0.5", worst),
                         study.rq3c(cell.backbone, cell.temp), False)]


def _rq3c_cells(claim: Claim, cell: Cell) -> list[Row]:
    """"Worst in every cell": on each benchmark, the averaged drafter against its lowest rival there."""
    rivals = [m for m in (*SINGLES, ROUTED, "merged") if m in cell.methods and m != "avg0.5"]
    if "avg0.5" not in cell.methods or not rivals:
        return []
    rows = []
    for bn in cell.benches:
        worst = min(rivals, key=lambda m: _mean_tau(cell, m, [bn]))
        rows.append(claim.tested(cell.backbone, cell.temp,
                                 f"averaged - lowest other variant ({worst}) on {bn} (tau)",
                                 *cell.on_bench("avg0.5", worst, bn),
                                 study.rq3c_cell(cell.backbone, cell.temp, bn, rivals), False, bn))
    return rows


def _fig6(claim: Claim, cell: Cell) -> list[Row]:
    """Each λ strictly between the specialists against the better specialist (a sweep: >= 2 of them)."""
    lams = sorted((float(m[3:]), m) for m in cell.methods if re.fullmatch(r"avg[0-9.]+", m)
                  and 0 < float(m[3:]) < 1)
    if len(lams) < 2 or not {"math", "chat"} <= cell.methods:
        return []
    spec, text = _pick(cell, ["math", "chat"])
    tail = f"best specialist ({text}), average ({cell.weighting})"
    return [claim.tested(cell.backbone, cell.temp, f"{m} - {tail}", *cell.average(m, spec),
                         study.fig6(cell.backbone, cell.temp), False) for _, m in lams]


def _merged_best(claim: Claim, cell: Cell) -> list[Row]:
    others = [m for m in cell.methods if not m.startswith("merged") and "@" not in m and "[" not in m
              and m not in ("autoregressive", ORACLE)]  # (the hindsight oracle is a ceiling, not a method)
    if "merged" not in cell.methods or not others:
        return []
    best, text = _pick(cell, sorted(others))
    what = f"merged - best other method ({text}), average ({cell.weighting})"
    return [claim.tested(cell.backbone, cell.temp, what, *cell.average("merged", best),
                         study.merged_best(cell.backbone, cell.temp))]


def _sweep_slots(grid, backbone=None) -> int:
    """One hypothesis per averaged drafter strictly between the specialists, on the backbones the sweep
    runs on (one when that is not a sweep)."""
    swept = grid.sweep_backbones is None or backbone is None or backbone in grid.sweep_backbones
    sweep = sum(0 < lam < 1 for lam in grid.lambdas) if swept else 0
    return sweep if sweep >= 2 else 1


RQ3_CLAIMS = (
    Claim("RQ3a", "merged trees beat confidence routing (Table 1, average)", f"merged and {ROUTED}", STUDY,
          _rq3a,
          study=lambda bb, t: study.pair(bb, t, "merged", ROUTED, "average")),
    Claim("RQ3b", "confidence routing beats the best single checkpoint (Table 1, average)",
          f"{ROUTED} and a single drafter", STUDY, _rq3b, study=lambda bb, t: study.rq3b(bb, t, ROUTED)),
    Claim("RQ3c", "the weight-averaged checkpoint is the weakest (Table 1)", "avg0.5 and a single drafter",
          STUDY,
          _rq3c, study=study.rq3c),
    Claim("RQ3c-cells", "the weight-averaged checkpoint is the worst in every cell (Table 1: each benchmark)",
          "avg0.5 and another Table 1 variant", STUDY, _rq3c_cells, study=study.rq3c_all,
          slots=lambda grid, backbone=None: len(grid.benchmarks)),
    Claim("Fig6", "no lambda of the averaging sweep recovers specialist-level acceptance (Figure 6)",
          "a lambda sweep (>= 2 averaged checkpoints, 0 < lambda < 1) and both specialists", STUDY, _fig6,
          study=study.fig6, slots=_sweep_slots),
    Claim("merged-best", "merged trees are the best method overall (Table 1, average)",
          "merged and another method",
          STUDY, _merged_best, study=study.merged_best),
)


def _rq4(claim: Claim, cell: Cell) -> list[Row]:
    """Domain separation = share of math choices on math benchmarks + share of chat choices on
    MT-Bench, averaged; confidence minus entropy routing, paired over prompts: first the study's
    pair as its code counts it (ROUTED vs HEADS_LAST, a prompt's head its last turn's: its Table 2;
    the study family), then ROUTED vs HEADS (the majority of turns) and the project's own pairs at
    each granularity (exploratory). A choice is read by name from the row's ``drafter``
    ("math+chat+..."); rows without one read drafter i as route_pair[i] (the profile decides the order)."""
    pp = cell.prompts
    backbone = cell.backbone
    temp = cell.temp
    route_pair = cell.route_pair
    out = []
    if "math" not in route_pair or "chat" not in route_pair:
        return out
    if "drafter" not in pp.columns:
        pp = pp.with_columns(pl.lit("+".join(route_pair)).alias("drafter"))
    heads = pp.filter(pl.col("method") == HEADS)
    if heads.height and "routing_choice_last" in heads.columns:  # HEADS_LAST rows: each prompt's last turn
        pp = pl.concat([pp, last_turn_rows(heads)], how="diagonal_relaxed")
    pairs = [(ROUTED, HEADS_LAST, "prompt")]  # the study's two routers as its code ran them (its Table 2)
    pairs += [(ROUTED, HEADS, "prompt")]  # the majority over turns: exploratory, beside it
    pairs += [(f"confidence({g})", f"entropy({g})", g) for g in ("step", "turn", "prompt")]
    for c, e, gran in pairs:
        sub = pp.filter((pl.col("backbone") == backbone) & (pl.col("temperature") == temp)
                        & pl.col("method").is_in([c, e]))
        if sub["method"].n_unique() < 2:
            continue
        correct = sub.with_columns(chosen_name().alias("chosen")).with_columns(
            matched_expr().cast(pl.Float64).alias("ok"))
        w = (correct.pivot(on="method", index=["benchmark", "prompt_id"], values="ok").drop_nulls()
             .sort("benchmark", "prompt_id"))
        if w.is_empty():
            continue
        n = int(w.group_by("benchmark").len()["len"].min())
        ev = study.rq4(backbone, temp, gran)
        if e == HEADS:
            ev["study_note"] = "; ".join(x for x in (ev["study_note"],
                                                     "a prompt's head is its turns' majority "
                                                     "(the study's code records the last turn's)") if x)
        out.append(claim.tested(backbone, temp, f"{c} - {e}: share routed to the matched specialist",
                                mean_diff_ci((w[c] - w[e]).to_numpy(), p=True), n, ev,
                                family=None if (c, e) == (ROUTED, HEADS_LAST) else EXPLORATORY))
    return out


RQ4_CLAIMS = (
    Claim("RQ4", "confidence routing separates the domains, entropy routing does not (Table 2)",
          f"{ROUTED} and {HEADS} with each turn's head "
          "(or confidence and entropy routing at one granularity)",
          STUDY, _rq4, study=lambda bb, t: study.rq4(bb, t, "prompt")),
)


CHUNK = 1000  # bootstrap draws per block (memory: 2 x methods x CHUNK x prompts)


def same_order(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Whether the rows of x and y, both (R, M), order their M entries identically (ties included)."""
    i, j = np.triu_indices(x.shape[1], k=1)
    return (np.sign(x[:, i] - x[:, j]) == np.sign(y[:, i] - y[:, j])).all(1)


def _per_benchmark(sub: pl.DataFrame, pair: tuple, methods: list[str], weighting: str = STUDY_W):
    """Per benchmark: (2, M, n) arrays of tokens and of verifier calls on the prompts every cell has,
    and the benchmarks' weights in the average (claim.py)."""
    nums = []
    dens = []
    names = []
    for bn in sorted(sub["benchmark"].unique().to_list()):
        cells = [sub.filter((pl.col("backbone") == bb) & (pl.col("method") == m)
                            & (pl.col("benchmark") == bn))
                 for bb in pair for m in methods]
        ids = set.intersection(*(set(c["prompt_id"].to_list()) for c in cells))
        if not ids:
            continue
        ids = sorted(ids)
        cells = [c.filter(pl.col("prompt_id").is_in(ids)).sort("prompt_id") for c in cells]
        nums.append(np.array([c["new_tokens"].to_numpy() for c in cells], float).reshape(2, len(methods), -1))
        dens.append(np.array([c["verifier_calls"].to_numpy() for c in cells], float).reshape(2, len(methods),
                -1))
        names.append(bn)
    return nums, dens, np.array(weights(names, weighting))


def _resampled(nums: list, dens: list, n_methods: int, rng: np.random.Generator,
               w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(Kendall tau_b, same order) of B_TEST resamples of the prompts, in blocks of CHUNK; the
    benchmarks' taus averaged with weights ``w``."""
    taus, same = [], []
    for size in [CHUNK] * (B_TEST // CHUNK) + ([B_TEST % CHUNK] if B_TEST % CHUNK else []):
        boot = np.zeros((2, n_methods, size))
        for wi, nu, de in zip(w, nums, dens):
            idx = rng.integers(0, nu.shape[-1], size=(size, nu.shape[-1]))  # (size, n)
            boot += wi * nu[:, :, idx].sum(-1) / np.maximum(de[:, :, idx].sum(-1), 1e-12)  # (2, M, size)
        taus.append(kendall_tau_b(boot[0].T, boot[1].T))
        same.append(same_order(boot[0].T, boot[1].T))
    return np.concatenate(taus), np.concatenate(same)  # (B_TEST,)


def _ordering(claim: Claim, cell: Cell, seed: int = 0) -> list[Row]:
    backbones, temp = cell.backbones, cell.temp
    # the study's pair; else EAGLE-3 against EAGLE-2 (or any two)
    on_study = {"hass", "eagle2"} <= set(backbones)
    pair = ("hass", "eagle2") if on_study else ("eagle3", "eagle2") if {"eagle3",
            "eagle2"} <= set(backbones) \
        else tuple(backbones[:2])
    if len(pair) < 2:
        return []
    sub = cell.prompts.filter((pl.col("temperature") == temp) & pl.col("backbone").is_in(list(pair))
                              & (pl.col("verifier_calls") > 0))
    per_bb = [set(sub.filter(pl.col("backbone") == bb)["method"].to_list()) for bb in pair]
    methods = sorted(m for m in per_bb[0] & per_bb[1] if "@" not in m and "[" not in m
                     and m not in ("autoregressive", ORACLE))
    if len(methods) < 3:
        return []
    nums, dens, w = _per_benchmark(sub, pair, methods, cell.weighting)
    if not nums:
        return []
    rng = data_rng(seed, *nums, *dens)  # prompts in prompt_id order: the draws depend on the data alone
    taus = np.array([nu.sum(-1) / de.sum(-1) for nu, de in zip(nums, dens)])  # (benchmarks, 2, M)
    point = np.einsum("b,bij->ij", w, taus)  # (2, M)
    n = min(nu.shape[-1] for nu in nums)
    draws, same = _resampled(nums, dens, len(methods), rng, w)
    est = float(kendall_tau_b(point[0][None], point[1][None])[0])
    point_same = bool(same_order(point[0][None], point[1][None])[0])
    share = float(same.mean())
    lo, hi = (np.percentile(draws[np.isfinite(draws)], [2.5, 97.5]) if n > 1 and np.isfinite(draws).any()
              else (np.nan, np.nan))
    p = max(1 / (len(same) + 1), min(1.0, 2 * min(share, 1 - share))) if n > 1 else float("nan")
    v = ("inconclusive" if n < 2 else "holds" if point_same and share >= 0.975
         else "does not hold" if not point_same and share <= 0.025 else "inconclusive")
    what = (f"the same order of {len(methods)} methods' mean tau, {pair[0]} vs {pair[1]}: "
            f"{'the same' if point_same else 'a different'} order here, in {share:.1%} of resamples; "
            "estimate = Kendall tau_b (1 = same order)")
    # the study's numbers (hass, eagle2) over the same methods as the run's side
    ev = study.backbones(temp, methods) if on_study else study.none_for("+".join(pair), temp)
    return [claim.row("+".join(pair), temp, what, est, float(lo), float(hi), v, n, p, ev)]


ORDERING_CLAIMS = (
    Claim("backbones",
          "the methods keep the same ordering on both backbones (Table 1, average): the same order",
          "both backbones with >= 3 methods in common", STUDY, _ordering,
          study=lambda bb, t: study.backbones(t), keys=lambda backbones, temps: [("hass+eagle2", t)
                  for t in temps],
          across_backbones=True),
)


def _speed(claim: Claim, cell: Cell) -> list[Row]:
    routed = SPEED_ROUTED
    if not {routed, "merged"} <= cell.methods or not cell.timed(routed, "merged"):
        return []
    ev = study.speed()
    ev["study_note"] = (f"{ev['study_note']}; this row times {routed}, the study's text's deployable router "
                        f"({ROUTED} decodes both whole generations)")
    r = claim.tested(cell.backbone, cell.temp, f"{routed} - merged, tokens/s, average over benchmarks",
                     *cell.speed(routed, "merged"), ev)
    return [replace(r, verdict=TIMED_APART, p_value=NAN) if cell.timed_apart(routed, "merged") else r]


SPEED_CLAIMS = (
    Claim("speed", "confidence routing costs less speed than merged trees (Section 7 estimate)",
          f"{SPEED_ROUTED} and merged with wall-clock times", STUDY, _speed, study=lambda bb,
          t: study.speed()),
)
