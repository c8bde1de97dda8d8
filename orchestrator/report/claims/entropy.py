"""Tables 3-4: rejected draft tokens carry higher draft entropy than accepted ones, and verifier
entropy shows the same direction, in every functioning checkpoint. One row per checkpoint and benchmark
(issue 64: the universal claim checked cell by cell inside the study's Holm family), one value per
prompt (rejected minus accepted entropy, from the step summary's per-prompt means, steps.entropy),
bootstrapped over prompts."""
from __future__ import annotations

from functools import partial

import polars as pl

from ..labels import SINGLES
from ..stats import mean_diff_ci
from . import study
from .claim import STUDY, Cell, Claim, Row


def _entropy(claim: Claim, cell: Cell, kind: str) -> list[Row]:
    """Rejected minus accepted ``kind`` (draft or verifier) entropy, one value per prompt, one row per
    checkpoint (SINGLES: the study's "every functioning checkpoint", the averaged one left out, see
    rq5_more.py's entropy-averaged) and benchmark: the universal
    claim checked cell by cell, each row a hypothesis of the study family (slots). Prompts without
    both numbers are dropped before they are counted."""
    per_prompt = cell.steps.entropy.get(kind) if cell.steps is not None else None
    if per_prompt is None:
        return []
    backbone, temp = cell.backbone, cell.temp
    s = per_prompt.filter((pl.col("backbone") == backbone) & (pl.col("temperature") == temp)
                          & pl.col("method").is_in(SINGLES))
    out = []
    for (method, bench), rows in sorted(s.group_by("method", "benchmark"), key=lambda kv: kv[0]):
        per = (rows.with_columns((pl.col("rej") - pl.col("acc")).alias("diff")).drop_nulls("diff")
               .filter(pl.col("diff").is_not_nan()).group_by("prompt_id").agg(pl.col("diff").mean())
               .sort("prompt_id"))
        if per.is_empty():
            continue
        ev = (study.entropy(backbone, temp, method, bench) if kind == "draft"
              else study.verifier_entropy(backbone, temp))
        what = f"rejected - accepted {kind} entropy (nats), {method} drafter on {bench}"
        res = mean_diff_ci(per["diff"].to_numpy(), p=True)
        out.append(claim.tested(backbone, temp, what, res, per.height, ev, bench=bench))
    return out


def _slots(grid, backbone=None) -> int:
    """One hypothesis per checkpoint and benchmark."""
    return len(SINGLES) * len(grid.benchmarks)


CLAIMS = (
    Claim("entropy", "rejected draft tokens carry higher draft entropy than accepted ones (Tables 3-4)",
          "step traces of single drafters", STUDY, partial(_entropy, kind="draft"),
          study=lambda bb, t: study.entropy(bb, t, "math", "gsm8k"), slots=_slots),
    Claim("verifier-entropy", "verifier entropy shows the same direction: higher at rejected tokens (Tables 3-4)",
          "step traces of single drafters", STUDY, partial(_entropy, kind="verifier"),
          study=study.verifier_entropy, slots=_slots),
)
