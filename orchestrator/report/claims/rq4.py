"""RQ4: confidence routing separates the domains, entropy routing does not (Table 2). Domain
separation is the share of prompts routed to the matched specialist (math on the math benchmarks,
chat on MT-Bench); confidence minus entropy routing, paired over prompts."""
from __future__ import annotations

import polars as pl

from ..labels import HEADS, HEADS_LAST, ROUTED
from ..routers import chosen_name, last_turn_rows, matched_expr
from ..stats import mean_diff_ci
from . import study
from .claim import EXPLORATORY, STUDY, Cell, Claim, Row


def _rq4(claim: Claim, cell: Cell) -> list[Row]:
    """Domain separation = share of math choices on math benchmarks + share of chat choices on
    MT-Bench, averaged; confidence minus entropy routing, paired over prompts: first the study's
    pair as its code counts it (ROUTED vs HEADS_LAST, a prompt's head its last turn's: its Table 2;
    the study family), then ROUTED vs HEADS (the majority of turns) and the project's own pairs at
    each granularity (exploratory). A choice is read by name from the row's ``drafter``
    ("math+chat+..."); rows without one read drafter i as route_pair[i] (the profile decides the order)."""
    pp, backbone, temp, route_pair = cell.prompts, cell.backbone, cell.temp, cell.route_pair
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
            ev["study_note"] = "; ".join(x for x in (ev["study_note"], "a prompt's head is its turns' majority "
                                                     "(the study's code records the last turn's)") if x)
        out.append(claim.tested(backbone, temp, f"{c} - {e}: share routed to the matched specialist",
                                mean_diff_ci((w[c] - w[e]).to_numpy(), p=True), n, ev,
                                family=None if (c, e) == (ROUTED, HEADS_LAST) else EXPLORATORY))
    return out


CLAIMS = (
    Claim("RQ4", "confidence routing separates the domains, entropy routing does not (Table 2)",
          f"{ROUTED} and {HEADS} with each turn's head (or confidence and entropy routing at one granularity)",
          STUDY, _rq4, study=lambda bb, t: study.rq4(bb, t, "prompt")),
)
