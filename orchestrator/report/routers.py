"""The routers by name, the study's post hoc confidence router and Table 2 (routing decisions per prompt).

The study's Table 1 "confidence routed" numbers come from its code's post hoc router
(Moe-Zbeeb/TAPS ``Eagle-Code/evaluate/run_confidence_router_tau.py``): after the math and chat
drafters have each decoded a question in full, each run's whole-generation confidence (the mean
node confidence c(v) over its accepted and rejected draft tokens, every step) picks the run with
the higher one, and near-ties (|difference| < 0.01) take the mixed checkpoint's run. It is not
deployable: it sees both whole generations. Here it is computed from the single-drafter traces
(``accepted_draft_confidence``, ``rejected_draft_confidence``) and appended to the per-prompt
frame as the method ``POSTHOC``; its wall time is that of every generation it read."""
from __future__ import annotations

import polars as pl

from .tables import KEYS, MATH_BENCH

POSTHOC = "confidence(post hoc)"  # the study's code's router, the study's Table 1 numbers
PROMPT_NODE = "confidence(prompt, node)"  # the study's text's router: once per prompt, mean c(v)
HEADS = "entropy(turn, 4 heads)"  # the study's code's entropy router over math, chat, mixed, averaged
NOT_DEPLOYABLE = "not deployable (sees both whole generations)"
TIE = 0.01  # the study's near-tie margin
DESCRIBE = {
    POSTHOC: "the study's code's router (its Table 1 numbers): post hoc per prompt, the specialist whose "
             f"whole generation had the higher mean c(v), near-ties (< {TIE}) to the mixed checkpoint; "
             + NOT_DEPLOYABLE,
    PROMPT_NODE: "the study's text's router: decided once per prompt from each specialist's first tree, on the "
                 "mean node confidence c(v); deployable",
    HEADS: "the study's code's entropy router: per prompt turn, the lowest mean draft entropy of four heads "
           "(math, chat, mixed, averaged) on the first tree; deployable",
    "confidence(step)": "the project's own: every verifier call, on the mean path confidence V (EAGLE-2's score)",
    "confidence(prompt)": "the project's own: once per prompt, on the mean path confidence V",
    "entropy(step)": "the project's own: every verifier call, the lower mean draft entropy",
}


def describe(method: str) -> str:
    if method in DESCRIBE:
        return DESCRIBE[method]
    if method.startswith("switching("):
        return ("the study's proposed next experiment: starts as the text's router, switches after k steps "
                "with nothing accepted")
    if method.startswith("depth_adaptive("):
        return "the study's proposed next experiment: mixed drafter at shallow levels, routed specialist deeper"
    return "the project's own routing variant"


def whole_confidence(steps: pl.DataFrame) -> pl.DataFrame:
    """Per (backbone, temperature, benchmark, method, prompt): mean c(v) over every accepted and
    rejected draft token of the generation (the post hoc router's score), single-drafter cells."""
    need = {"accepted_draft_confidence", "rejected_draft_confidence"}
    if steps is None or not need <= set(steps.columns):
        return pl.DataFrame()
    k = KEYS + ["prompt_id"]
    s = steps.filter(pl.col("strategy") == "single")
    acc = s.select(*k, pl.col("accepted_draft_confidence").alias("c")).explode("c")
    rej = s.select(*k, pl.col("rejected_draft_confidence").cast(pl.Float64).alias("c"))
    both = pl.concat([acc.with_columns(pl.col("c").cast(pl.Float64)), rej])
    return (both.filter(pl.col("c").is_not_null() & pl.col("c").is_not_nan())
            .group_by(k).agg(pl.col("c").mean().alias("confidence")))


def posthoc_rows(pp: pl.DataFrame, steps: pl.DataFrame | None, pair=("math", "chat"),
                 mixed: str = "mixed_full") -> pl.DataFrame:
    """The post hoc router's per-prompt rows (empty without the traces it needs): the chosen run's
    row with ``method`` POSTHOC, ``routing_choice`` indexing ``drafter`` = "a+b+mixed", ``wall_time_s``
    the sum over the runs it read (both specialists, and the mixed one on a near-tie), and
    ``posthoc_margin`` = confidence(a) - confidence(b). A near-tie whose mixed run is missing takes
    the higher specialist (``posthoc_tie_fallback``)."""
    conf = whole_confidence(steps)
    a, b = pair
    if conf.is_empty() or not {a, b} <= set(conf["method"].to_list()):
        return pl.DataFrame()
    on = ["backbone", "temperature", "benchmark", "prompt_id"]
    side = lambda m: conf.filter(pl.col("method") == m).select(*on, pl.col("confidence").alias(m))  # noqa: E731
    runs = pp.filter(pl.col("method").is_in([a, b, mixed]))
    walls = runs.pivot(on="method", index=on, values="wall_time_s")
    for m in (a, b, mixed):
        if m not in walls.columns:
            walls = walls.with_columns(pl.lit(None, dtype=pl.Float64).alias(m))
    walls = walls.rename({m: f"wall_{m}" for m in (a, b, mixed)})
    margin = pl.col(a) - pl.col(b)
    tie = margin.abs() < TIE
    has_mixed = pl.col(f"wall_{mixed}").is_not_null()
    dec = (side(a).join(side(b), on=on).join(walls, on=on, how="inner")
           .filter(pl.col(f"wall_{a}").is_not_null() & pl.col(f"wall_{b}").is_not_null())
           .with_columns(margin.alias("posthoc_margin"), (tie & ~has_mixed).alias("posthoc_tie_fallback"),
                         pl.when(tie & has_mixed).then(2).when(margin >= 0).then(0).otherwise(1)
                         .cast(pl.Int64).alias("_choice")))
    if dec.is_empty():
        return pl.DataFrame()
    names = pl.DataFrame({"_choice": [0, 1, 2], "_method": [a, b, mixed]}, schema_overrides={"_choice": pl.Int64})
    wall = (pl.col(f"wall_{a}") + pl.col(f"wall_{b}")
            + pl.when(pl.col("_choice") == 2).then(pl.col(f"wall_{mixed}")).otherwise(0.0))
    chosen = (dec.join(names, on="_choice").with_columns(wall.alias("_wall"))
              .select(*on, "_choice", "_method", "_wall", "posthoc_margin", "posthoc_tie_fallback"))
    rows = (runs.join(chosen, left_on=on + ["method"], right_on=on + ["_method"], how="inner")
            .with_columns(pl.lit(POSTHOC).alias("method"), pl.lit(f"{a}+{b}+{mixed}").alias("drafter"),
                          pl.lit("posthoc").alias("strategy"), pl.col("_choice").alias("routing_choice"),
                          pl.col("_wall").alias("wall_time_s"))
            .drop("_choice", "_wall"))
    return rows.select([c for c in pp.columns if c in rows.columns] + ["posthoc_margin", "posthoc_tie_fallback"])


def with_posthoc(pp: pl.DataFrame, steps: pl.DataFrame | None, pair=("math", "chat"),
                 mixed: str = "mixed_full") -> pl.DataFrame:
    """``pp`` plus the post hoc router's rows where the run has what it needs."""
    rows = posthoc_rows(pp, steps, pair, mixed)
    return pl.concat([pp, rows], how="diagonal_relaxed") if rows.height else pp


def chosen_name() -> pl.Expr:
    """The drafter a routing row chose, by name ("-" for none or merged trees)."""
    names = pl.col("drafter").str.split("+")
    ok = (pl.col("routing_choice") >= 0) & (pl.col("routing_choice") < names.list.len())
    return pl.when(ok).then(names.list.get(pl.col("routing_choice").clip(0), null_on_oob=True)) \
        .otherwise(pl.lit("-"))


def matched_expr() -> pl.Expr:
    """Whether the chosen drafter is the matched specialist (math on math benchmarks, chat on MT-Bench)."""
    return pl.when(pl.col("benchmark").is_in(list(MATH_BENCH))).then(pl.col("chosen") == "math") \
        .otherwise(pl.col("chosen") == "chat")


def is_router() -> pl.Expr:
    return pl.col("strategy").is_in(["confidence", "entropy", "posthoc"])


def table2(pp: pl.DataFrame, steps: pl.LazyFrame | None = None) -> pl.DataFrame:
    """Table 2, per prompt as the study's: for every router (by name), benchmark and drafter, the
    prompts routed to it and their share (a prompt's choice: its turns' majority, ties to the first
    drafter); beside it the share of verifier calls (``step_share``) for routers that choose per
    call or turn, and the study's matched-specialist share where STUDY.md gives it."""
    from .claims_study import other_of

    r = pp.filter(is_router()) if "strategy" in pp.columns else pp.head(0)
    if r.is_empty():
        return pl.DataFrame()
    r = r.with_columns(chosen_name().alias("chosen"))
    tot = r.group_by(KEYS).agg(pl.len().alias("of"))
    out = (r.group_by(KEYS + ["chosen"]).agg(pl.len().alias("prompts")).join(tot, on=KEYS)
           .with_columns((pl.col("prompts") / pl.col("of")).alias("prompt_share"),
                         matched_expr().alias("matched")))
    if steps is not None:
        st = (steps.filter(pl.col("strategy").is_in(["confidence", "entropy"]))
              .with_columns(pl.col("chosen_drafter").alias("routing_choice"))
              .with_columns(chosen_name().alias("chosen"))
              .group_by(KEYS + ["chosen"]).agg(pl.len().alias("_n")).collect())
        st = st.with_columns((pl.col("_n") / pl.col("_n").sum().over(KEYS)).alias("step_share")).drop("_n")
        out = out.join(st, on=KEYS + ["chosen"], how="left")
    study = {(POSTHOC, "confidence"), (HEADS, "entropy")}
    vals = [next((other_of("matched_share", bb, t, kind, bn) for m2, kind in study if m2 == m and ok), None)
            for bb, t, m, bn, ok in zip(out["backbone"], out["temperature"], out["method"], out["benchmark"],
                                        out["matched"])]
    return (out.with_columns(pl.Series("study_matched_share", vals, dtype=pl.Float64))
            .rename({"chosen": "drafter"}).sort(KEYS + ["drafter"]))
