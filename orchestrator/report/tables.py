"""The study's tables from the Parquet traces, with polars (lazy scans, no loops over rows)."""
from __future__ import annotations

import re
from pathlib import Path

import polars as pl

from decoding.config import TREE_MODES, DecodeConfig
from orchestrator.report.stats import ratio_ci

MATH_BENCH = ("gsm8k", "math500", "svamp")

STUDY_W = "1 chat : 3 math"  # the study's Table 1 average (its 4 benchmarks: 3 math, 1 chat)
EQUAL_W = "equal per benchmark"
MATH_SHARE = 0.75


def weights(benches: list[str], kind: str = STUDY_W) -> list[float]:
    """One weight per benchmark of ``benches`` (summing to 1) under ``kind``."""
    if kind not in (STUDY_W, EQUAL_W):
        raise ValueError(f"weighting {kind!r} is not one of {STUDY_W!r}, {EQUAL_W!r}")
    n_math = sum(b in MATH_BENCH for b in benches)
    n_chat = len(benches) - n_math
    if kind == EQUAL_W or not n_math or not n_chat:
        return [1 / len(benches)] * len(benches) if benches else []
    return [MATH_SHARE / n_math if b in MATH_BENCH else (1 - MATH_SHARE) / n_chat for b in benches]


def bench_weight(benches) -> pl.Expr:
    """Each row's benchmark weight in an average over ``benches`` under the study's weighting
    (:func:`weights`: 1 chat : 3 math; a plain mean over the study's own four benchmarks)."""
    names = sorted(set(benches))
    return pl.col("benchmark").replace_strict(dict(zip(names, weights(names))), default=None,
                                              return_dtype=pl.Float64)


def weighted_mean(col: str, w: pl.Expr) -> pl.Expr:
    """``col``'s mean weighted by ``w`` over the rows that have a value (weights renormalised)."""
    have = w * pl.col(col).is_not_null().cast(pl.Float64)
    return (pl.col(col).fill_null(0.0) * have).sum() / have.sum()
KEYS = ["backbone", "method", "benchmark", "temperature"]
# Figure 6's reference lines: both specialists, mixed
LAMBDA_REFS = ("math", "chat", "mixed_half", "mixed_full")


# trace columns a run may lack (written before they existed), with the value they had then: the tree
# mode's (column "tree") and the strategy options' (DecodeConfig's defaults, as its columns() writes them)
CELL_DEFAULTS = {"tree": TREE_MODES[0]} | DecodeConfig().columns()


def method_expr(names=None) -> pl.Expr:
    """A row label per composition: specialist name, merge name, routing(granularity[, node][, N heads]),
    merged, switching(k=K[, to merged]), depth_adaptive(d=D), hedge(step) (the first online router) or
    hedge(<its options>) (decoding/hedge.py's label). ``names``: the frame's columns (a column
    of CELL_DEFAULTS it lacks reads as its default; None: all of them do)."""
    def col(c):
        return pl.col(c) if names is not None and c in names else pl.lit(CELL_DEFAULTS[c])

    g, s = pl.col("routing_granularity"), pl.col("strategy")
    auto = pl.when(col("tree") == "auto").then(pl.lit(" [tree auto]")).otherwise(pl.lit(""))
    n = pl.col("drafter").str.count_matches("+", literal=True) + 1
    node = pl.when(col("route_score") == "node").then(pl.lit(", node")).otherwise(pl.lit(""))
    heads = pl.when(n > 2).then(pl.lit(", ") + n.cast(pl.Utf8) + pl.lit(" heads")).otherwise(pl.lit(""))
    at = pl.when(pl.col("budget_matched")).then(pl.lit("@") + pl.col("total_tokens").cast(pl.Utf8)) \
        .otherwise(pl.lit(""))
    to = pl.when(col("switch_to") == "merged").then(pl.lit(", to merged")).otherwise(pl.lit(""))
    return (
        pl.when(s == "autoregressive").then(pl.lit("autoregressive"))
        .when(s == "single").then(pl.col("drafter") + at)
        .when(s == "merged").then(
            pl.when(pl.col("merge_dedup")).then(pl.lit("merged-dedup")).otherwise(pl.lit("merged")) + at)
        .when(s == "switching").then(pl.lit("switching(k=") + col("switch_after").cast(pl.Utf8) + to + pl.lit(
                ")"))
        .when(s == "depth_adaptive").then(
            pl.lit("depth_adaptive(d=") + col("switch_depth").cast(pl.Utf8) + pl.lit(")"))
        .when((s == "hedge") & (col("hedge_spec") != "")).then(pl.lit("hedge(") + col("hedge_spec") + pl.lit(
                ")"))
        .otherwise(s + pl.lit("(") + g + node + heads + pl.lit(")"))
    ) + auto


def trace_files(run: Path, kind: str, recorded: set[str] | None = None) -> tuple[list[Path], list[Path]]:
    """(files to read, files ignored) of ``kind``: with ``recorded`` (paths relative to the run,
    from the manifest's finished eval units) only those; a file the manifest does not record is
    stale (another configuration, or a unit that failed when it was redone) and is ignored."""
    root = Path(run) / "traces" / kind
    files = sorted(root.rglob("*.parquet")) if root.is_dir() else []
    if recorded is None:
        return files, []
    keep = [f for f in files if str(f.relative_to(run)) in recorded]
    return keep, [f for f in files if str(f.relative_to(run)) not in recorded]


def scan(run: Path, kind: str, recorded: set[str] | None = None) -> pl.LazyFrame | None:
    """The trace files of ``kind`` (see trace_files) with their hive partition columns; files
    written by different versions (one has a column another lacks) concatenate with nulls."""
    files, _ = trace_files(run, kind, recorded)
    return scan_files(Path(run) / "traces" / kind, files) if files else None


_SCHEMAS: dict[tuple, int] = {}  # (path, mtime, size) -> index of its schema in _SIGNATURES
_SIGNATURES: dict[tuple, int] = {}


def _schema_id(f: Path) -> int:
    """A small id of a Parquet file's schema (files with the same id scan as one), read once per file."""
    st = f.stat()
    key = (str(f), st.st_mtime_ns, st.st_size)
    if key not in _SCHEMAS:
        sig = tuple((k, str(v)) for k, v in pl.read_parquet_schema(f).items())
        _SCHEMAS[key] = _SIGNATURES.setdefault(sig, len(_SIGNATURES))
    return _SCHEMAS[key]


def scan_files(root: Path, files: list[Path]) -> pl.LazyFrame:
    """``files`` (under ``root``, e.g. run/traces/steps) as one lazy frame, in their order: each run
    of consecutive files with one schema and the same hive keys in their paths is one multi-file
    scan (the keys' values from each file's path, as strings), the runs concatenated with nulls for
    columns a run lacks (one scan per file held a query plan per file: docs/report.md, at the paper's
    ~24k units per trace kind)."""
    runs: list[tuple[tuple, list[Path]]] = []
    for f in files:
        keys = tuple(dict(p.split("=", 1) for p in f.relative_to(root).parts[:-1] if "=" in p))
        sig = (_schema_id(f), keys)
        if runs and runs[-1][0] == sig:
            runs[-1][1].append(f)
        else:
            runs.append((sig, [f]))
    frames = [pl.scan_parquet(fs, hive_partitioning=bool(k), hive_schema=dict.fromkeys(k, pl.String) or None)
              for (_, k), fs in runs]
    lf = frames[0] if len(frames) == 1 else pl.concat(frames, how="diagonal_relaxed")
    names = lf.collect_schema().names()
    if "id" in names:  # traces written before the column was named prompt_id
        lf = (lf.with_columns(pl.coalesce("prompt_id", "id").alias("prompt_id")) if "prompt_id" in names
              else lf.rename({"id": "prompt_id"})).drop("id", strict=False)
    names = lf.collect_schema().names()
    # e.g. before tree auto
    lf = lf.with_columns(pl.lit(v).alias(c) if c not in names else pl.col(c).fill_null(v)
                         for c, v in CELL_DEFAULTS.items())
    return lf.with_columns(pl.col("temperature").cast(pl.Float64)).with_columns(
        method_expr(list(CELL_DEFAULTS)).alias("method"))


def per_prompt(prompts: pl.LazyFrame) -> pl.DataFrame:
    """One row per (cell, prompt): turns summed."""
    have = prompts.collect_schema().names()
    for c, t in (("generate_tokens", pl.Int64), ("generate_wall_time_s", pl.Float64), ("invocation", pl.Utf8),
                 ("generate_matches", pl.Boolean)):
        if c not in have:  # traces written before the generate baseline (or the invocation tag) existed
            prompts = prompts.with_columns(pl.lit(None, dtype=t).alias(c))
    return (prompts.group_by(KEYS + ["prompt_id"]).agg(
        pl.col("generate_tokens").sum(), pl.col("generate_wall_time_s").sum(), pl.col("invocation").first(),
        pl.col("generate_matches").all().alias("generate_matches"),
        pl.col("new_tokens").sum(), pl.col("verifier_calls").sum(), pl.col("wall_time_s").sum(),
        pl.col("output_token_ids").list.len().sum().alias("out_tokens"),
        (pl.col("mean_tree_size") * pl.col("verifier_calls")).sum().alias("tree_nodes"),
        pl.col("t_draft_s").sum(), pl.col("t_verify_s").sum(),
        pl.col("routing_choice").mode().sort().first().alias("routing_choice"),
        pl.col("routing_choice").sort_by("turn").last().alias("routing_choice_last"),
        # TAPS's denominator: its decode loop's index at exit per turn (counted from 0: passes - 1)
        (pl.col("verifier_calls") - 1).clip(lower_bound=0).sum().alias("loop_indices"),
        pl.col("drafter").first(), pl.col("strategy").first(),
    ).sort(KEYS + ["prompt_id"]).collect())  # one order for every build (group_by's is arbitrary)


def _ci_table(pp: pl.DataFrame, num: str, den: str, name: str) -> pl.DataFrame:
    rows = []
    for key, g in pp.group_by(KEYS, maintain_order=True):
        p, lo, hi = ratio_ci(g[num].to_numpy(), g[den].to_numpy())
        rows.append(dict(zip(KEYS, key)) | {name: p, f"{name}_lo": lo, f"{name}_hi": hi, "prompts": g.height})
    return pl.DataFrame(rows).sort(KEYS) if rows else pl.DataFrame()


def table1(pp: pl.DataFrame) -> pl.DataFrame:
    """Acceptance length, ours: ``tau`` = tokens committed by verification passes (accepted draft
    tokens + the verifier's bonus token) / passes, a ratio of sums over the cell's prompts, 95% CI.
    Beside it ``tau_taps``, tau as the study's code computes its tables' numbers (TAPS
    ``scripts/compute_tau.py``): the same tokens over the sum of each turn's decode-loop index at
    exit, counted from 0 (passes - 1 per turn), with its CI; ``tau_prompt_mean`` (each prompt's tokens
    per pass, averaged over prompts) and ``tau_study``, the study's text's wording: accepted draft
    tokens per pass (bonus excluded), averaged over prompts = tau_prompt_mean - 1."""
    ok = pp.filter(pl.col("verifier_calls") > 0)
    t = _ci_table(ok, "new_tokens", "verifier_calls", "tau")
    if t.is_empty():
        return t
    if "loop_indices" in ok.columns:
        taps = _ci_table(ok, "new_tokens", "loop_indices", "tau_taps").drop("prompts")
        t = t.join(taps, on=KEYS, how="left")
    per = ok.group_by(KEYS).agg((pl.col("new_tokens") / pl.col("verifier_calls")).mean().alias(
            "tau_prompt_mean"))
    return (t.join(per, on=KEYS, how="left").with_columns((pl.col("tau_prompt_mean") - 1).alias("tau_study"))
            .sort(KEYS))


def table1_wide(t1: pl.DataFrame, backbone: str, temperature: float) -> pl.DataFrame:
    t = t1.filter((pl.col("backbone").is_in([backbone, "none"])) & (pl.col("temperature") == temperature))
    if t.is_empty():
        return t
    cell = t.with_columns(pl.format("{} [{}, {}]", pl.col("tau").round(2), pl.col("tau_lo").round(2),
                                    pl.col("tau_hi").round(2)).alias("v"))
    wide = cell.pivot(on="benchmark", index="method", values="v")
    w = bench_weight(t["benchmark"].to_list())  # the study's average: 1 chat : 3 math
    avg = t.group_by("method").agg(weighted_mean("tau", w).round(2).alias("average"),
                                   *([weighted_mean("tau_taps", w).round(2).alias("average (TAPS tau)")]
                                     if "tau_taps" in t.columns else []),
                                   *([weighted_mean("tau_study", w).round(2)
                                      .alias("average (study's convention)")]
                                     if "tau_study" in t.columns else []))
    return wide.join(avg, on="method").sort(["average", "method"], descending=[True, False])  # ties by name


def lambda_of(method: str) -> float | None:
    """λ of an averaged drafter's method name (``avg0.25`` -> 0.25: λ·math + (1-λ)·chat), else None."""
    m = re.fullmatch(r"avg([0-9]+(?:\.[0-9]+)?)", method)
    return float(m.group(1)) if m else None


def lambda_table(t1: pl.DataFrame, backbone: str, temperature: float) -> pl.DataFrame:
    """Figure 6 as a table: τ [95% CI] per benchmark of every averaged drafter of the sweep (``lambda``,
    the math drafter's weight), then the reference drafters (both specialists, the mixed one) with
    ``lambda`` null; empty unless the cell has >= 2 averaged drafters (one λ is not a sweep)."""
    t = t1.filter((pl.col("backbone") == backbone) & (pl.col("temperature") == temperature))
    lam = pl.col("method").map_elements(lambda_of, return_dtype=pl.Float64)
    t = t.with_columns(lam.alias("lambda")).filter(pl.col("lambda").is_not_null()
                                                   | pl.col("method").is_in(list(LAMBDA_REFS)))
    if t.filter(pl.col("lambda").is_not_null())["method"].n_unique() < 2:
        return pl.DataFrame()
    cell = t.with_columns(pl.format("{} [{}, {}]", pl.col("tau").round(2), pl.col("tau_lo").round(2),
                                    pl.col("tau_hi").round(2)).alias("v"))
    benches = sorted(t["benchmark"].unique().to_list())
    wide = cell.pivot(on="benchmark", index=["method", "lambda"], values="v")
    avg = t.group_by("method").agg(weighted_mean("tau", bench_weight(benches)).round(2).alias("average"))
    order = pl.col("method").replace_strict({m: i for i, m in enumerate(LAMBDA_REFS)}, default=-1,
                                            return_dtype=pl.Int64)
    return (wide.join(avg, on="method").with_columns(order.alias("_o")).sort("_o", "lambda")
            .drop("_o").select("method", "lambda", *benches, "average"))


GENERATE = "generate (transformers)"


def speed(pp: pl.DataFrame) -> pl.DataFrame:
    """Wall-clock: tokens/s with CI; ``speedup`` over transformers' generate and ``vs_autoregressive``;
    verifier calls per token, mean tree size, draft/verify time share, tau per verified node.

    The baseline of ``speedup``: a cell that timed generate on every one of its own inputs (every
    cell with ``eval.paired_baseline``) divides by those runs (``paired_baseline`` true); any other
    divides by the autoregressive cell's generate timing on the same inputs, or by the project's
    own autoregressive loop where no generate timing exists. ``outputs_equal_generate``: the share
    of prompts whose output equals generate's token for token (T=0 cells that timed generate)."""
    gen = (pp.filter((pl.col("method") == "autoregressive") & (pl.col("generate_wall_time_s") > 0))
           .with_columns(pl.lit(GENERATE).alias("method"), pl.col("generate_tokens").alias("out_tokens"),
                         pl.col("generate_wall_time_s").alias("wall_time_s")))
    tps = _ci_table(pl.concat([pp, gen], how="diagonal_relaxed") if gen.height else pp, "out_tokens",
                    "wall_time_s", "tokens_per_s")
    agg = pp.group_by(KEYS).agg(
        (pl.col("verifier_calls").sum() / pl.col("out_tokens").sum()).alias("calls_per_token"),
        (pl.col("tree_nodes").sum() / pl.col("verifier_calls").sum()).alias("mean_tree_size"),
        (pl.col("t_draft_s").sum() / pl.col("wall_time_s").sum()).alias("draft_share"),
        (pl.col("t_verify_s").sum() / pl.col("wall_time_s").sum()).alias("verify_share"),
        (pl.col("new_tokens").sum() / (pl.col("tree_nodes").sum() + pl.col("verifier_calls").sum())).alias(
                "tokens_per_verified_node"),
    )
    on = ["benchmark", "temperature"]
    ar = tps.filter(pl.col("method") == "autoregressive").select(*on, pl.col("tokens_per_s").alias("ar_tps"))
    base_name = GENERATE if gen.height else "autoregressive"
    base = tps.filter(pl.col("method") == base_name).select(*on, pl.col("tokens_per_s").alias("base_tps"))
    timed = pl.col("generate_wall_time_s").fill_null(0) > 0
    own = pp.group_by(KEYS).agg(
        timed.all().alias("paired_baseline"),
        (pl.col("generate_tokens").sum() / pl.col("generate_wall_time_s").sum()).alias("own_tps"),
        pl.when((pl.col("temperature") == 0) & timed).then(pl.col("generate_matches").cast(pl.Float64)).mean()
        .alias("outputs_equal_generate"))
    paired = pl.col("paired_baseline").fill_null(False)
    return (tps.join(agg, on=KEYS, how="left").join(ar, on=on, how="left").join(base, on=on, how="left")
            .join(_same_invocation(pp, on), on=KEYS, how="left").join(own, on=KEYS, how="left")
            .with_columns(pl.when(paired).then(pl.col("tokens_per_s") / pl.col("own_tps"))
                          .otherwise(pl.col("tokens_per_s") / pl.col("base_tps")).alias("speedup"),
                          (pl.col("tokens_per_s") / pl.col("ar_tps")).alias("vs_autoregressive"),
                          pl.when(paired).then(pl.lit(GENERATE)).otherwise(pl.lit(base_name)).alias("baseline"),
                          paired.alias("paired_baseline"),
                          (pl.col("same_invocation") | paired).alias("same_invocation"))
            .drop("ar_tps", "base_tps", "own_tps").sort(KEYS))


def _same_invocation(pp: pl.DataFrame, on: list[str]) -> pl.DataFrame:
    """Per cell: was it timed in the grid invocation(s) that timed its baseline (the autoregressive
    cell of its benchmark and temperature)? False marks a resumed run's mix of machine conditions;
    null, traces written before the invocation tag."""
    inv = pp.group_by(KEYS).agg(pl.col("invocation").drop_nulls().unique().sort().alias("inv"))
    ar = inv.filter(pl.col("method") == "autoregressive").select(*on, pl.col("inv").alias("base_inv"))
    inv = pl.concat([inv, ar.with_columns(pl.lit(GENERATE).alias("method"), pl.lit("none").alias("backbone"))
                     .rename({"base_inv": "inv"})], how="diagonal_relaxed")
    known = (pl.col("inv").list.len() > 0) & (pl.col("base_inv").list.len() > 0)
    return (inv.join(ar, on=on, how="left")
            .select(*KEYS, pl.when(known).then(pl.col("inv") == pl.col("base_inv")).alias("same_invocation")))


STUDY_DEPTHS = 5  # the study's Tables 5-8 report depths 1-5; a tree of depth 6 reaches one level more


def _depths(steps: pl.LazyFrame) -> pl.LazyFrame:
    """Acceptance rate at depth d = accepted at d / reached d, every depth any tree reached."""
    return (steps.filter(pl.col("strategy") != "autoregressive").select(KEYS + ["depth_accept"])
            .with_columns(pl.int_ranges(1, pl.col("depth_accept").list.len() + 1).alias("depth"))
            .explode(["depth_accept", "depth"]).drop_nulls("depth")
            .group_by(KEYS + ["depth"]).agg(pl.col("depth_accept").mean().alias("accept_rate"),
                                            pl.len().alias("reached")))


def depth_table(steps: pl.LazyFrame, max_depth: int | None = STUDY_DEPTHS) -> pl.DataFrame:
    """Tables 5-8: acceptance rate by depth, depths 1..``max_depth`` (the study's 5; None: all)."""
    d = _depths(steps)
    if max_depth is not None:
        d = d.filter(pl.col("depth") <= max_depth)
    return d.sort(KEYS + ["depth"]).collect()


def depth_table_deeper(steps: pl.LazyFrame, beyond: int = STUDY_DEPTHS) -> pl.DataFrame:
    """The appendix's rest of Tables 5-8: depths deeper than the study's tables (> ``beyond``)."""
    return _depths(steps).filter(pl.col("depth") > beyond).sort(KEYS + ["depth"]).collect()


def aligned(pp: pl.DataFrame, backbone: str, temperature: float, bench: str, a: str, b: str,
            num: str = "new_tokens", den: str = "verifier_calls"):
    """Per-prompt (num, den) arrays of methods a and b on the same prompts (paired); by default
    tokens and verifier calls (tau), e.g. ``out_tokens``/``wall_time_s`` for tokens per second."""
    def get(m):
        bb = "none" if m == "autoregressive" else backbone
        return pp.filter((pl.col("backbone") == bb) & (pl.col("method") == m)
                         & (pl.col("temperature") == temperature)
                         & (pl.col("benchmark") == bench)).select("prompt_id", pl.col(num).alias("n"),
                                                                  pl.col(den).alias("d"))
    j = get(a).join(get(b), on="prompt_id", suffix="_b")
    return (j["n"].to_numpy(), j["d"].to_numpy(), j["n_b"].to_numpy(), j["d_b"].to_numpy())


def timed(pp, bb, temp, methods) -> bool:
    """Whether every row of these methods in the cell has a wall-clock time (speed claims need it)."""
    if not {"wall_time_s", "out_tokens"} <= set(pp.columns):
        return False
    w = pp.filter((pl.col("backbone") == bb) & (pl.col("temperature") == temp)
                  & pl.col("method").is_in(methods))
    return w.height > 0 and w["wall_time_s"].fill_null(0).min() > 0

