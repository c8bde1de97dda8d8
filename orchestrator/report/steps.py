"""The step table in bounded memory: read in passes, reduced per prompt.

At the paper's size the step table has about 58 M rows, so the report never holds it (docs/report.md
says what a pass holds). What the claims and the post hoc routers take from it are per-prompt reductions
(groups of rows that share backbone, temperature, benchmark and prompt_id), so the table is read in passes
that each hold whole groups: the trace files of one or more hive partitions (backbone/benchmark/temperature
directories), a partition of more than ``pass_rows`` rows split further by a hash of prompt_id. Each
pass is reduced with the in-memory engine, the expressions the report used on the whole table, and a
group's rows reach them in the same order (the files in path order), so the numbers do not depend on
how the table was cut (tests/test_report_passes.py). Tables 3-4 are summed from the per-prompt sums
in key order, so their float means have the same bits in every build (the streaming engine's
changed in the last bits from one build to the next); Table 2's step shares and Tables 5-8 (counts
and means of booleans: exact) are lazy queries on the streaming engine (tables.py), as per_prompt
reads the prompt table."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq

from orchestrator.report.duplicates import ROW_KEYS, duplicates
from orchestrator.report.tables import KEYS, scan_files

PASS_ROWS = 2_000_000  # step rows one pass holds (its memory, measured: docs/report.md)
PARTITIONS = ("backbone", "benchmark", "temperature")
PROMPT = ["backbone", "temperature", "method", "benchmark", "prompt_id"]  # a prompt of a cell
# what the reductions read: nothing else of a step row is held
COLUMNS = list(dict.fromkeys(KEYS + ROW_KEYS["steps"] + [
    "unit_key", "strategy", "committed", "depth_accept", "accepted_path_confidence", "offpath_confidence_sum",
    "offpath_nodes", "accepted_draft_confidence", "rejected_draft_confidence", "accepted_draft_entropy",
    "rejected_draft_entropy", "accepted_verifier_entropy", "rejected_verifier_entropy"]))


@dataclass(frozen=True)
class StepSummary:
    """The per-prompt reductions of a step table (each None where the traces lack its columns):
    ``confidence[score]`` the post hoc routers' score per prompt of the single-drafter cells,
    ``entropy[kind]`` the mean accepted and first-rejected entropy per prompt (single drafters),
    ``entropy_sums`` the sums and counts behind Tables 3-4 per prompt (every cell),
    ``rates`` the acceptance rate per prompt and depth (single drafters), ``early`` the tokens per
    call over the first calls of ``early_method``'s prompts, ``duplicates`` the repeated rows."""
    confidence: dict = field(default_factory=dict)
    entropy: dict = field(default_factory=dict)
    entropy_sums: pl.DataFrame | None = None
    rates: pl.DataFrame | None = None
    early: pl.DataFrame | None = None
    duplicates: pl.DataFrame = field(default_factory=pl.DataFrame)
    rows: int = 0
    passes: int = 0


def confidence(df: pl.DataFrame, score: str = "path") -> pl.DataFrame | None:
    """Per (KEYS, prompt) of the single-drafter cells: the post hoc router's ``confidence``
    (routers.whole_confidence says which)."""
    k = KEYS + ["prompt_id"]
    need = ({"accepted_path_confidence", "offpath_confidence_sum", "offpath_nodes"} if score == "path"
            else {"accepted_draft_confidence", "rejected_draft_confidence"})
    if not need | {"strategy", *k} <= set(df.columns):
        return None
    s = df.filter(pl.col("strategy") == "single")
    if score == "path":
        acc = pl.col("accepted_path_confidence")
        total = (acc.list.sum().fill_null(0.0) + pl.col("offpath_confidence_sum").fill_null(0.0)).sum()
        n = (acc.list.len().fill_null(0) + pl.col("offpath_nodes").fill_null(0)).sum()
        return s.group_by(k).agg(pl.when(n > 0).then(total / n).otherwise(0.0).alias("confidence"))
    acc = s.select(*k, pl.col("accepted_draft_confidence").alias("c")).explode("c")
    rej = s.select(*k, pl.col("rejected_draft_confidence").cast(pl.Float64).alias("c"))
    both = pl.concat([acc.with_columns(pl.col("c").cast(pl.Float64)), rej])
    return (both.filter(pl.col("c").is_not_null() & pl.col("c").is_not_nan())
            .group_by(k).agg(pl.col("c").mean().alias("confidence")))


def entropy(df: pl.DataFrame, kind: str = "draft") -> pl.DataFrame | None:
    """Per prompt of each single-drafter cell: ``acc``, the mean over steps of each step's mean
    accepted ``kind`` entropy, and ``rej``, the mean first-rejected one (NaN read as missing)."""
    a, r = f"accepted_{kind}_entropy", f"rejected_{kind}_entropy"
    if not {a, r, "strategy", *PROMPT} <= set(df.columns):
        return None
    acc = pl.col(a).list.eval(pl.element().fill_nan(None)).list.mean()
    return (df.filter(pl.col("strategy") == "single")
            .with_columns(acc.alias("acc"), pl.col(r).fill_nan(None).alias("rej"))
            .group_by(PROMPT).agg(pl.col("acc").mean(), pl.col("rej").mean()))


ENTROPY = ("accepted_draft_entropy", "accepted_verifier_entropy", "rejected_draft_entropy",
           "rejected_verifier_entropy")


def entropy_sums(df: pl.DataFrame) -> pl.DataFrame | None:
    """Per prompt of every cell: the sum and the count of each entropy column (the accepted ones over
    every accepted token, the first-rejected ones over steps), what Tables 3-4 average per cell."""
    k = KEYS + ["prompt_id"]
    if not {*ENTROPY, *k} <= set(df.columns):
        return None
    acc = list(ENTROPY[:2])
    per_token = (df.select(*k, *acc).explode(acc)
                 .group_by(k).agg(*(pl.col(c).sum().alias(f"{c}_sum") for c in acc),
                                  *(pl.col(c).count().alias(f"{c}_n") for c in acc)))
    per_step = df.group_by(k).agg(*(pl.col(c).sum().alias(f"{c}_sum") for c in ENTROPY[2:]),
                                  *(pl.col(c).count().alias(f"{c}_n") for c in ENTROPY[2:]))
    return per_token.join(per_step, on=k)


def rates(df: pl.DataFrame) -> pl.DataFrame | None:
    """Acceptance rate at each depth per prompt of each single-drafter cell: accepted at d / reached d."""
    if not {"depth_accept", "strategy", *PROMPT} <= set(df.columns):
        return None
    return (df.filter(pl.col("strategy") == "single")
            .select(*PROMPT, "depth_accept")
            .with_columns(pl.int_ranges(1, pl.col("depth_accept").list.len() + 1).alias("depth"))
            .explode(["depth_accept", "depth"]).drop_nulls("depth")
            .group_by(*PROMPT, "depth")
            .agg(pl.col("depth_accept").cast(pl.Float64).mean().alias("rate"), pl.len().alias("reached")))


def early(df: pl.DataFrame, method: str, steps: int) -> pl.DataFrame | None:
    """Per prompt of ``method``'s cells: tokens committed per call over the first ``steps`` calls
    of its first turn (``early``)."""
    k = ["backbone", "temperature", "benchmark", "prompt_id"]
    if not {"method", "turn", "step", "committed", *k} <= set(df.columns):
        return None
    s = df.filter(pl.col("method") == method)
    first = s.filter(pl.col("turn") == pl.col("turn").min().over(k)).sort(*k, "step")
    return first.group_by(k, maintain_order=True).agg(pl.col("committed").head(steps).mean().alias("early"))


def _reduce(df: pl.DataFrame, early_method: str | None, early_steps: int) -> dict:
    return {"confidence": {s: confidence(df, s) for s in ("path", "node")},
            "entropy": {k: entropy(df, k) for k in ("draft", "verifier")}, "entropy_sums": entropy_sums(df),
            "rates": rates(df), "early": early(df, early_method, early_steps) if early_method else None,
            "duplicates": duplicates(df.lazy(), "steps")}


def _concat(frames: list) -> pl.DataFrame | None:
    """The passes' frames of one reduction (None where the columns are missing)."""
    have = [f for f in frames if f is not None]
    return pl.concat(have, how="vertical_relaxed") if have else None


def _combine(parts: list[dict], rows: int) -> StepSummary:
    """One summary from the passes' reductions; frames in key order (each pass's group order is arbitrary)."""
    def sort(df, by):
        return None if df is None else df.sort(by)

    first = parts[0]
    return StepSummary(
        confidence={s: sort(_concat([p["confidence"][s] for p in parts]), KEYS + ["prompt_id"])
                    for s in first["confidence"]},
        entropy={k: sort(_concat([p["entropy"][k] for p in parts]), PROMPT) for k in first["entropy"]},
        entropy_sums=sort(_concat([p["entropy_sums"] for p in parts]), KEYS + ["prompt_id"]),
        rates=sort(_concat([p["rates"] for p in parts]), PROMPT + ["depth"]),
        early=sort(_concat([p["early"] for p in parts]), ["backbone", "temperature", "benchmark",
                                                          "prompt_id"]),
        duplicates=_duplicates([p["duplicates"] for p in parts]), rows=rows, passes=len(parts))


def _duplicates(frames: list[pl.DataFrame]) -> pl.DataFrame:
    """The passes' repeated rows as duplicates() gives them for the whole table (a row's copies
    share its prompt, so they meet in one pass)."""
    have = [f for f in frames if not f.is_empty()]
    return pl.concat(have).sort(ROW_KEYS["steps"]) if have else pl.DataFrame()


def summarize(steps: pl.DataFrame | pl.LazyFrame, early_method: str | None = None, early_steps: int = 3,
              pass_rows: int = PASS_ROWS) -> StepSummary:
    """The summary of a step frame (a DataFrame as it is; a LazyFrame in passes of at most about
    ``pass_rows`` rows, cut by a hash of prompt_id)."""
    if isinstance(steps, pl.DataFrame):
        return _combine([_reduce(steps, early_method, early_steps)], steps.height)
    n = steps.select(pl.len()).collect().item()
    k = max(1, math.ceil(n / pass_rows))
    cols = [c for c in COLUMNS if c in steps.collect_schema().names()]
    parts = [_reduce(_bucket(steps, k, i).select(cols).collect(), early_method, early_steps)
             for i in range(k)]
    return _combine(parts, n)


def as_summary(steps, early_method: str | None = None, early_steps: int = 3) -> StepSummary | None:
    """``steps`` as a StepSummary: a summary as it is, a step frame summarized, None as None."""
    if steps is None or isinstance(steps, StepSummary):
        return steps
    return summarize(steps, early_method, early_steps)


def _bucket(lf: pl.LazyFrame, k: int, i: int) -> pl.LazyFrame:
    return lf if k == 1 else lf.filter(pl.col("prompt_id").hash(seed=0) % k == i)


def _partition(f: Path, root: Path) -> tuple | None:
    """(backbone, benchmark, temperature) of a file's hive path; None if its path lacks one."""
    parts = dict(p.split("=", 1) for p in f.relative_to(root).parts[:-1] if "=" in p)
    if not set(PARTITIONS) <= set(parts):
        return None
    try:
        return parts["backbone"], parts["benchmark"], float(parts["temperature"])
    except ValueError:
        return None


def plan_passes(files: list[Path], root: Path, pass_rows: int = PASS_ROWS) -> list[tuple[list[Path], int,
        int]]:
    """Passes over the step files, each (files, buckets, bucket): whole hive partitions packed up to
    ``pass_rows`` rows (Parquet footers), a larger partition read in ``buckets`` hash buckets of
    prompt_id. Files in path order; without a full hive path anywhere, every file is one partition."""
    keys = {f: _partition(f, root) for f in files}
    if any(v is None for v in keys.values()):
        keys = dict.fromkeys(files, ())
    groups: dict = {}
    for f in files:
        groups.setdefault(keys[f], []).append(f)
    rows = {f: pq.read_metadata(f).num_rows for f in files}
    passes = []
    cur = []
    n_cur = 0
    for key in sorted(groups, key=str):
        g = groups[key]
        n = sum(rows[f] for f in g)
        if n > pass_rows:
            k = math.ceil(n / pass_rows)
            passes += [(g, k, i) for i in range(k)]
            continue
        if cur and n_cur + n > pass_rows:
            passes.append((cur, 1, 0))
            cur, n_cur = [], 0
        cur, n_cur = cur + g, n_cur + n
    if cur:
        passes.append((cur, 1, 0))
    order = {f: i for i, f in enumerate(sorted(files))}
    return [(sorted(fs, key=order.get), k, i) for fs, k, i in passes]


def read_steps(run: Path, files: list[Path], early_method: str | None = None, early_steps: int = 3,
               pass_rows: int = PASS_ROWS) -> StepSummary | None:
    """The summary of a run's step files (tables.trace_files), read pass by pass (plan_passes); each
    pass is cast to the whole table's schema, so a pass of old files reads as they do among new ones."""
    if not files:
        return None
    root = Path(run) / "traces" / "steps"
    schema = scan_files(root, files).collect_schema()
    cols = [c for c in COLUMNS if c in schema]
    parts, n = [], 0
    for fs, k, i in plan_passes(files, root, pass_rows):
        lf = _bucket(scan_files(root, fs), k, i)
        have = set(lf.collect_schema().names())
        df = lf.select([pl.col(c).cast(schema[c]) if c in have else pl.lit(None, dtype=schema[c]).alias(c)
                        for c in cols]).collect()
        n += df.height
        parts.append(_reduce(df, early_method, early_steps))
        del df
    return _combine(parts, n)


def entropy_table(steps) -> pl.DataFrame:
    """Tables 3-4: mean draft and verifier entropy (nats) of accepted vs first-rejected tokens, per
    cell: the per-prompt sums of ``steps`` (a step frame or its StepSummary, steps.entropy_sums)
    added up in key order (the same bits in every build), over their counts."""
    sums = as_summary(steps).entropy_sums
    if sums is None:
        return pl.DataFrame()
    cols = {"accepted_draft_entropy": "draft_accepted", "accepted_verifier_entropy": "verifier_accepted",
            "rejected_draft_entropy": "draft_rejected", "rejected_verifier_entropy": "verifier_rejected"}
    mean = [pl.when(pl.col(f"{c}_n") > 0).then(pl.col(f"{c}_sum") / pl.col(f"{c}_n")).alias(name)
            for c, name in cols.items()]
    cells = sums.filter(pl.col("method") != "autoregressive").drop("prompt_id")
    return (cells.group_by(KEYS).agg(pl.all().sum())
            .select(*KEYS, *mean)
            .with_columns((pl.col("draft_rejected") - pl.col("draft_accepted")).alias("draft_diff"),
                          (pl.col("verifier_rejected") - pl.col("verifier_accepted")).alias("verifier_diff"))
            .sort(KEYS))
