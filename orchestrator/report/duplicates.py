"""Rows that appear twice in the traces: a table that sums them would count them twice.

The driver writes each unit's rows once (content keys, one file per unit, the manifest naming the
files to read), so a duplicate means a bug or a hand-edited output; the report refuses to
aggregate over one rather than print numbers that silently double.
"""
from __future__ import annotations

import polars as pl

from orchestrator.report.tables import KEYS

# what identifies a row: its cell, its prompt, its turn (and, for a step row, the step)
ROW_KEYS = {"prompts": KEYS + ["prompt_id", "turn"], "steps": KEYS + ["prompt_id", "turn", "step"]}


class DuplicateRows(ValueError):
    """The traces hold a row more than once (the message is one line, with an example)."""


def duplicates(lf: pl.LazyFrame, kind: str) -> pl.DataFrame:
    """One row per repeated identity of ``kind`` (see ROW_KEYS), with ``copies`` and the
    ``unit_key`` values holding it; empty when every row is unique. A frame without the identity
    columns (traces from before they existed) is not checked."""
    names = lf.collect_schema().names()
    keys = ROW_KEYS[kind]
    if not set(keys) <= set(names):
        return pl.DataFrame()
    units = pl.col("unit_key").unique().sort() if "unit_key" in names else pl.lit(None).implode()
    return (lf.group_by(keys).agg(pl.len().alias("copies"), units.alias("units"))
            .filter(pl.col("copies") > 1).sort(keys).collect())


def check_unique(lf: pl.LazyFrame | None, kind: str, where: str) -> None:
    """Raise :class:`DuplicateRows` if ``lf`` (the ``kind`` traces under ``where``) repeats a row."""
    refuse(duplicates(lf, kind) if lf is not None else pl.DataFrame(), where, kind)


def refuse(d: pl.DataFrame, where: str, kind: str) -> None:
    """Raise :class:`DuplicateRows` for the repeated rows ``d`` (duplicates' frame), if any."""
    if d.is_empty():
        return
    r = d.row(0, named=True)
    cell = f"{r['backbone']} {r['method']} {r['benchmark']} T={r['temperature']:g}"
    raise DuplicateRows(f"{where}: {int(d['copies'].sum() - d.height)} duplicated {kind} row(s) in "
                        f"{d.height} "
                        f"place(s), e.g. {cell} prompt {r['prompt_id']} turn {r['turn']} x{r['copies']} "
                        f"(units {r['units']}); the report refuses to sum them twice: remove the extra "
                        "copies "
                        f"or rerun the eval stage (--force eval)")
