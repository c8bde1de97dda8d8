"""The study's numbers as data: ``study_tables.csv`` beside this file, loaded and validated.

One row per cell: table, quantity, backbone, row (the study's row label), benchmark, temperature,
value, source; the CSV's header comment says where the numbers come from and which τ convention
they use (TAPS's compute_tau.py). A malformed row stops the load with one error naming the file,
the line and the problem, before any report is built. Then the lookups of one cell (``tau_of``,
``other_of``: where the paper's text and TAPS's README give a cell differently, the paper's number)
and the study's τ cells beside a run's (``study_comparison``)."""
from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import polars as pl

from orchestrator.report.labels import POSTHOC
from orchestrator.report.tables import bench_weight, weighted_mean

CSV_PATH = Path(__file__).with_name("study_tables.csv")
COLUMNS = ("table", "quantity", "backbone", "row", "benchmark", "temperature", "value", "source")
# the study's row labels -> the project's method (or router kind) names
ROWS = {"MathInstruct": "math", "ShareGPT": "chat", "Mixed 35k+35k": "mixed_half",
        "Mixed 70k+70k": "mixed_full",
        "Averaged": "avg0.5", "Confidence Routed": POSTHOC, "Merged Trees": "merged",
        "Confidence router": "confidence", "Entropy router": "entropy"}
QUANTITIES = ("tau", "matched_share", "draft_entropy_accepted", "draft_entropy_rejected", "draft_entropy_gap",
              "verifier_entropy_gap", "accept_rate_d1", "accept_rate_d3", "accept_rate_d5",
              "speedup_lost_min",
              "speedup_lost_max")
# differences (rejected - accepted): Table 4 has negatives
SIGNED = ("draft_entropy_gap", "verifier_entropy_gap")
BACKBONES = ("hass", "eagle2", "any")
BENCHMARKS = ("mt_bench", "gsm8k", "math500", "svamp", "average", "any")
TEMPERATURES = (0.0, 1.0)
PAPER, README = "paper", "TAPS README"  # source prefixes; a source naming both counts as the paper's


@dataclass(frozen=True)
class StudyCell:
    table: str
    quantity: str
    backbone: str
    row: str  # the study's label, e.g. "Mixed 35k+35k"
    method: str  # the project's name for it, e.g. "mixed_half"
    benchmark: str
    temperature: float | None
    value: float
    source: str

    @property
    def from_paper(self) -> bool:
        return self.source.startswith(PAPER)


def _parse(path: Path, line: int, rec: dict) -> StudyCell:
    def bad(what: str) -> ValueError:
        return ValueError(f"{path}: line {line}: {what} (row: {rec})")

    if None in rec or any(rec.get(c) is None for c in COLUMNS):
        raise bad(f"expected the {len(COLUMNS)} columns {', '.join(COLUMNS)}")
    r = {k: v.strip() for k, v in rec.items()}
    for col, allowed in (("quantity", QUANTITIES), ("backbone", BACKBONES), ("row", tuple(ROWS)),
                         ("benchmark", BENCHMARKS)):
        if r[col] not in allowed:
            raise bad(f"{col} {r[col]!r} is not one of {', '.join(allowed)}")
    if not r["table"] or not r["source"]:
        raise bad("table and source must not be empty")
    try:
        temp = None if r["temperature"] == "" else float(r["temperature"])
        value = float(r["value"])
    except ValueError as e:
        raise bad(f"temperature and value must be numbers ({e})") from None
    if temp is not None and temp not in TEMPERATURES:
        raise bad(f"temperature {temp:g} is not one of the study's {TEMPERATURES}")
    if not math.isfinite(value):
        raise bad(f"value {value} must be a finite number")
    if value < 0 and r["quantity"] not in SIGNED:
        raise bad(f"value {value} must be >= 0 for quantity {r['quantity']} (only the gaps "
                  f"{', '.join(SIGNED)} are signed)")
    return StudyCell(r["table"], r["quantity"], r["backbone"], r["row"], ROWS[r["row"]], r["benchmark"], temp,
                     value, r["source"])


def load(path: str | Path = CSV_PATH) -> tuple[StudyCell, ...]:
    """Every cell of the CSV, validated; lines starting with '#' are comments."""
    path = Path(path)
    with path.open(newline="", encoding="utf-8") as f:
        lines = [(i, s) for i, s in enumerate(f, 1) if s.strip() and not s.lstrip().startswith("#")]
    if not lines:
        raise ValueError(f"{path}: no header and no rows")
    reader = csv.DictReader([s for _, s in lines])
    if tuple(reader.fieldnames or ()) != COLUMNS:
        raise ValueError(f"{path}: line {lines[0][0]}: header {reader.fieldnames} is not {list(COLUMNS)}")
    cells, seen = [], {}
    for (line, _), rec in zip(lines[1:], reader):
        c = _parse(path, line, rec)
        key = (c.quantity, c.backbone, c.row, c.benchmark, c.temperature, c.source)
        if key in seen:
            raise ValueError(f"{path}: line {line}: repeats the cell of line {seen[key]} ({key})")
        seen[key] = line
        cells.append(c)
    return tuple(cells)


@lru_cache(maxsize=1)
def cells() -> tuple[StudyCell, ...]:
    """The packaged CSV, loaded once."""
    return load()


# The study's "confidence routed" numbers are its code's post hoc router's (labels.POSTHOC).
# (backbone, temperature, method, benchmark or "average", acceptance length, source): every τ cell
STUDY_NUMBERS = [(c.backbone, c.temperature, c.method, c.benchmark, c.value, c.source)
                 for c in cells() if c.quantity == "tau"]
# Numbers that are not acceptance lengths: (quantity, backbone, temperature, method, benchmark, value,
# source).
# matched_share: share of prompts routed to the matched specialist (math on math benchmarks, chat on
# MT-Bench).
STUDY_OTHER = [(c.quantity, c.backbone, c.temperature, c.method, c.benchmark, c.value, c.source)
               for c in cells() if c.quantity != "tau"]
TAU_CONVENTION = ("the study's τ is TAPS's compute_tau.py: total new tokens (bonus tokens included) / total "
                  "loop indices counted from 0; compare it with `tau_taps`")
FOUR = ("gsm8k", "math500", "mt_bench", "svamp")


def _paper_last(rows, source_at: int):
    """Rows ordered so that a paper row comes after (and so overrides) a README row of the same cell."""
    return sorted(rows, key=lambda r: r[source_at].startswith(PAPER))


def tau_of(backbone: str, temp: float, method: str, bench: str) -> tuple[float | None, str]:
    """The study's τ for one cell (the paper's number where the paper and TAPS's README differ); for
    "average" its own average, else the mean of the per-benchmark numbers given (labelled), else None."""
    hit = {b: v for bb, t, m, b, v, _ in _paper_last(STUDY_NUMBERS, 5) if (bb, t, m) == (backbone, temp,
            method)}
    if bench in hit:
        return hit[bench], f"{hit[bench]:.2f}"
    if bench == "average":
        per = [hit[b] for b in FOUR if b in hit]
        if len(per) >= 2:
            v = sum(per) / len(per)
            return v, f"{v:.2f} (mean of the {len(per)} benchmarks given)"
    return None, ""


def other_of(quantity: str, backbone: str, temp, method: str, bench: str) -> float | None:
    hit = None
    for q, bb, t, m, b, v, _ in _paper_last(STUDY_OTHER, 6):
        if (q, bb, t, m, b) == (quantity, backbone, temp, method, bench):
            hit = v
    return hit


def comparison_note(t1: pl.DataFrame, column: str = "tau_taps") -> str:
    """One line for the report: which of our columns is compared with the study's numbers."""
    if column in t1.columns:
        return (f"`{column}` is ours in the study's convention ({TAU_CONVENTION}); `diff` = `{column}` - "
                "`study_tau`.")
    return (f"this run's Table 1 has no `{column}` column, so the study's numbers (TAPS's compute_tau.py "
            "convention) are beside `our_tau` only, which counts passes differently: no `diff` is given.")


def study_comparison(t1: pl.DataFrame, column: str = "tau_taps") -> pl.DataFrame:
    """Every τ cell of the study (study_tables.csv, one row per cell and source) next to ours (same
    backbone, temperature, method, benchmark; "average" = the mean over our benchmarks, 1 chat : 3 math
    as the study's Table 1), in our convention (``our_tau``) and in the study's (``our_<column>``, from
    Table 1's ``column``, default ``tau_taps``); without that column its values stay empty and
    comparison_note says so."""
    rows = []
    has = column in t1.columns
    for bb, temp, method, bench, value, source in STUDY_NUMBERS:
        t = t1.filter((pl.col("backbone") == bb) & (pl.col("temperature") == temp)
                      & (pl.col("method") == method))
        if bench != "average":
            t = t.filter(pl.col("benchmark") == bench)
        w = bench_weight(t["benchmark"].to_list())  # "average": Table 1's, 1 chat : 3 math
        ours = float(t.select(weighted_mean("tau", w)).item()) if t.height else None
        conv = (float(t.select(weighted_mean(column, w)).item())
                if t.height and has and t[column].is_not_null().any() else None)
        rows.append({"backbone": bb, "temperature": temp, "method": method, "benchmark": bench,
                     "study_tau": value,
                     "source": source, "our_tau": ours, f"our_{column}": conv,
                     "diff": None if conv is None else conv - value, "our_benchmarks": t.height})
    return pl.DataFrame(rows, schema_overrides={f"our_{column}": pl.Float64, "diff": pl.Float64,
                                                "our_tau": pl.Float64})
