"""The routers by name, the study's post hoc confidence router and Table 2 (routing decisions per prompt).

The study's Table 1 "confidence routed" numbers come from its code's post hoc router
(Moe-Zbeeb/TAPS ``Eagle-Code/scripts/run_confidence_router_tau.py``): after the math and chat
drafters have each decoded a question in full, each run's overall confidence picks the run with
the higher one, and near-ties (|difference| < 0.01) take the mixed checkpoint's run, whose whole
generation is reported. The overall confidence (its ``eagle/model/ea_model.py`` decode loop with
``confidence_log``) scores every drafted tree node by its path score from the root (V, the
cumulative draft probability that ranks the nodes, ``cnets1.py``): the nodes of the accepted path
count as accepted, every other drafted node as rejected, and the question's score is the mean
over all of them, every step of every turn (accepted and rejected means weighted by their counts).
``POSTHOC`` is that router, from the single-drafter traces (``accepted_path_confidence``,
``offpath_confidence_sum``, ``offpath_nodes``); ``POSTHOC_NODE`` is this project's earlier reading
(each node's own conditional probability c(v), only the first rejected child per step counted
rejected). Neither is deployable: it sees both whole generations; its wall time is that of every
generation it read. Both are appended to the per-prompt frame as methods."""
from __future__ import annotations

import polars as pl

from orchestrator.report.labels import (
    AFTER_THE_FACT,
    HEADS,
    HEADS_LAST,
    LAST_TURN,
    ORACLE,
    POSTHOC,
    POSTHOC_NODE,
    POSTHOCS,
    PROMPT_NODE,
)
from orchestrator.report.steps import as_summary
from orchestrator.report.study_tables import other_of
from orchestrator.report.tables import KEYS, MATH_BENCH

NOT_DEPLOYABLE = "not deployable (sees both whole generations)"
LOSSY_MARK = "‡"
NOT_LOSSLESS = (f"{LOSSY_MARK} not lossless at T>0: a post hoc router (and the hindsight oracle) chooses "
                "between "
                "finished samples by a function of those samples, so its output is no longer a sample of the "
                "verifier's distribution and a comparison with it is selection-biased in its favour (at T=0 "
                "both "
                "generations are the verifier's greedy output, so the choice changes only acceptance). Every "
                "other strategy and router here decides from tokens already verified or before "
                "verification, and "
                "is lossless at every temperature.")


def lossless(method: str, temperature: float) -> bool:
    """Whether a method's output is the verifier's (greedy at T=0, its distribution at T>0)."""
    return not (method in AFTER_THE_FACT and temperature > 0)


ROW_TEMPERATURE = pl.col("temperature")  # mark_lossy's default: each row's own temperature


def mark_lossy(temperature: pl.Expr | float = ROW_TEMPERATURE, column: str = "method") -> pl.Expr:
    """``column`` with LOSSY_MARK on the methods not lossless at ``temperature`` (a column or a number)."""
    temp = temperature if isinstance(temperature, pl.Expr) else pl.lit(temperature)
    lossy = pl.col(column).is_in(list(AFTER_THE_FACT)) & (temp > 0)
    return pl.when(lossy).then(pl.col(column) + f" {LOSSY_MARK}").otherwise(pl.col(column)).alias(column)


def mark_comparison(text: str, temperature: float) -> str:
    """A comparison's words with LOSSY_MARK after every method in it that is not lossless at
    ``temperature``."""
    if temperature <= 0 or LOSSY_MARK in text:
        return text
    for m in sorted(AFTER_THE_FACT, key=len, reverse=True):  # (no name is inside another: each ends its ")")
        text = text.replace(m, f"{m} {LOSSY_MARK}")
    return text


TIE = 0.01  # the study's near-tie margin
SCORE = {POSTHOC: "path", POSTHOC_NODE: "node"}
DESCRIBE = {
    POSTHOC: "the study's code's router (its Table 1 numbers): post hoc per prompt, the specialist whose "
             "whole generation had the higher mean path score V over every drafted node (accepted path "
             f"and every node off it), near-ties (< {TIE}) to the mixed checkpoint; " + NOT_DEPLOYABLE,
    POSTHOC_NODE: "the project's earlier reading of the study's code's router: as "
                  f"`{POSTHOC}`, scoring each node by its own c(v) and counting only the first rejected "
                  "child per step; " + NOT_DEPLOYABLE,
    PROMPT_NODE: "the study's text's router: decided once per prompt from each specialist's first tree, on "
                 "the "
                 "mean node confidence c(v); deployable",
    HEADS: "the study's code's entropy router: per prompt turn, the lowest mean draft entropy of four heads "
           "(math, chat, mixed, averaged) on the first tree; deployable (Table 2: a prompt's majority of "
           "turns)",
    HEADS_LAST: f"`{HEADS}` counted as the study's Table 2 counts it: a prompt's choice is its last turn's",
    "confidence(step)": "the project's own: every verifier call, on the mean path confidence V",
    "confidence(prompt)": "the project's own: once per prompt, on the mean path confidence V",
    "entropy(step)": "the project's own: every verifier call, the lower mean draft entropy",
    ORACLE: "the ceiling of a router over the pair: per prompt, the specialist whose run had the higher tau, "
            "chosen in hindsight; " + NOT_DEPLOYABLE,
}


def describe(method: str) -> str:
    if method in DESCRIBE:
        return DESCRIBE[method]
    if method.startswith("hedge("):
        return ("the project's online router (decoding/hedge.py): only the chosen drafter drafts, the "
                "learner "
                "reads verified tokens; deployable and lossless" + ("" if method == "hedge(step)" else
                                                                    f"; options: {method[6:-1]}"))
    if method.startswith("switching("):
        return ("the study's proposed next experiment: starts as the text's router, switches after k steps "
                "with nothing accepted")
    if method.startswith("depth_adaptive("):
        return ("the study's proposed next experiment: mixed drafter at shallow levels, "
                "routed specialist deeper")
    return "the project's own routing variant"


def whole_confidence(steps, score: str = "path") -> pl.DataFrame:
    """Per (backbone, temperature, benchmark, method, prompt) of the single-drafter cells: the post
    hoc router's ``confidence``. ``score="path"`` (TAPS): the mean path score V over every drafted
    node of every step (accepted path and off it), 0 where no node was drafted (its
    ``overall_confidence``); ``"node"``: the mean c(v) over accepted nodes and first rejected children.
    ``steps``: a step frame or its StepSummary (steps.py); empty without the columns it needs."""
    s = as_summary(steps)
    conf = s.confidence.get(score) if s is not None else None
    return conf if conf is not None else pl.DataFrame()


def posthoc_rows(pp: pl.DataFrame, steps, pair=("math", "chat"),
                 mixed: str = "mixed_full", method: str = POSTHOC) -> pl.DataFrame:
    """A post hoc router's per-prompt rows (empty without the traces it needs): the chosen run's
    row with ``method`` (POSTHOC: TAPS's scores; POSTHOC_NODE: c(v)), ``routing_choice`` indexing
    ``drafter`` = "a+b+mixed", ``wall_time_s`` the sum over the runs it read (both specialists, and
    the mixed one on a near-tie), and ``posthoc_margin`` = confidence(a) - confidence(b). A near-tie
    whose mixed run is missing takes the higher specialist (``posthoc_tie_fallback``)."""
    conf = whole_confidence(steps, SCORE[method])
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
                         pl.when(tie & has_mixed).then(2).when(margin > 0).then(0).otherwise(1)
                         .cast(pl.Int64).alias("_choice")))
    if dec.is_empty():
        return pl.DataFrame()
    names = pl.DataFrame({"_choice": [0, 1, 2], "_method": [a, b, mixed]},
                         schema_overrides={"_choice": pl.Int64})
    wall = (pl.col(f"wall_{a}") + pl.col(f"wall_{b}")
            + pl.when(pl.col("_choice") == 2).then(pl.col(f"wall_{mixed}")).otherwise(0.0))
    chosen = (dec.join(names, on="_choice").with_columns(wall.alias("_wall"))
              .select(*on, "_choice", "_method", "_wall", "posthoc_margin", "posthoc_tie_fallback"))
    rows = (runs.join(chosen, left_on=on + ["method"], right_on=on + ["_method"], how="inner")
            .with_columns(pl.lit(method).alias("method"), pl.lit(f"{a}+{b}+{mixed}").alias("drafter"),
                          pl.lit("posthoc").alias("strategy"), pl.col("_choice").alias("routing_choice"),
                          pl.col("_wall").alias("wall_time_s"))
            .drop("_choice", "_wall").sort(on))  # one order for every build (a join's is arbitrary)
    return rows.select([c for c in pp.columns if c in rows.columns] + ["posthoc_margin",
            "posthoc_tie_fallback"])


def oracle_rows(pp: pl.DataFrame, pair=("math", "chat")) -> pl.DataFrame:
    """ORACLE's per-prompt rows: of the pair's two single runs of a prompt, the one with the higher tau
    over its turns (ties: the pair's first), chosen in hindsight; ``routing_choice`` indexes ``drafter``
    = "a+b", ``wall_time_s`` is both runs' (it decodes both). Empty without both runs."""
    a, b = pair
    on = ["backbone", "temperature", "benchmark", "prompt_id"]
    runs = pp.filter(pl.col("method").is_in([a, b]) & (pl.col("verifier_calls") > 0))
    if runs.is_empty():
        return pl.DataFrame()
    tau = pl.col("new_tokens") / pl.col("verifier_calls")
    side = lambda m: runs.filter(pl.col("method") == m).select(  # noqa: E731
        *on, tau.alias(f"_tau_{m}"), pl.col("wall_time_s").alias(f"_w_{m}"))
    better = pl.when(pl.col(f"_tau_{b}") > pl.col(f"_tau_{a}")).then(pl.lit(b)).otherwise(pl.lit(a))
    dec = side(a).join(side(b), on=on, how="inner").select(
        *on, better.alias("_method"), (pl.col(f"_w_{a}") + pl.col(f"_w_{b}")).alias("_wall"))
    rows = (runs.join(dec, left_on=on + ["method"], right_on=on + ["_method"], how="inner")
            .with_columns((pl.col("method") == b).cast(pl.Int64).alias("routing_choice"),
                          pl.lit(ORACLE).alias("method"), pl.lit(f"{a}+{b}").alias("drafter"),
                          pl.lit("oracle").alias("strategy"), pl.col("_wall").alias("wall_time_s"))
            .drop("_wall").sort(on))
    return rows.select([c for c in pp.columns if c in rows.columns])


def with_posthoc(pp: pl.DataFrame, steps, pair=("math", "chat"), mixed: str = "mixed_full") -> pl.DataFrame:
    """``pp`` plus both post hoc routers' rows (POSTHOC, POSTHOC_NODE) where the run has what each needs
    (``steps``: a step frame or its StepSummary, read once for both), and, in a run with hedge cells,
    ORACLE's (the hindsight ceiling of a router over the pair)."""
    steps = as_summary(steps)
    rows = [r for r in (posthoc_rows(pp, steps, pair, mixed, m) for m in POSTHOCS) if r.height]
    if "strategy" in pp.columns and pp.filter(pl.col("strategy") == "hedge").height:
        rows += [r for r in (oracle_rows(pp, pair),) if r.height]
    return pl.concat([pp, *rows], how="diagonal_relaxed") if rows else pp


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


def last_turn_rows(r: pl.DataFrame) -> pl.DataFrame:
    """Per-turn entropy routers (``entropy(turn...``) once more, each prompt's choice its last turn's
    (``routing_choice_last``, tables.per_prompt), as ``...LAST_TURN``: the study's Table 2 records the
    head its code chose at a question's last turn (``gen_routing_eval.py``), not a majority."""
    if "routing_choice_last" not in r.columns:
        return r.head(0)
    turn = r.filter(pl.col("method").str.starts_with("entropy(turn"))
    label = pl.col("method").str.replace(")", LAST_TURN, literal=True)  # the first ")": the label's own
    return turn.with_columns(label.alias("method"), pl.col("routing_choice_last").alias("routing_choice"))


def table2(pp: pl.DataFrame, steps: pl.LazyFrame | None = None) -> pl.DataFrame:
    """Table 2, per prompt as the study's: for every router (by name), benchmark and drafter, the
    prompts routed to it and their share (a prompt's choice: its turns' majority, ties to the first
    drafter; per-turn entropy routers also as the study's code counts them, the last turn's choice,
    ``last_turn_rows``); beside it the share of verifier calls (``step_share``) for routers that choose
    per call or turn, and the study's matched-specialist share where STUDY.md gives it (on the routers
    as its code ran them: POSTHOC and HEADS_LAST)."""
    r = pp.filter(is_router()) if "strategy" in pp.columns else pp.head(0)
    if r.is_empty():
        return pl.DataFrame()
    r = pl.concat([r, last_turn_rows(r)], how="diagonal_relaxed")
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
    study = {(POSTHOC, "confidence"), (HEADS_LAST, "entropy")}  # the routers as the study's code counted them
    vals = [next((other_of("matched_share", bb, t, kind, bn) for m2, kind in study if m2 == m and ok), None)
            for bb, t, m, bn, ok in zip(out["backbone"], out["temperature"], out["method"], out["benchmark"],
                                        out["matched"])]
    return (out.with_columns(pl.Series("study_matched_share", vals, dtype=pl.Float64))
            .rename({"chosen": "drafter"}).sort(KEYS + ["drafter"]))
