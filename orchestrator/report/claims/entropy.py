"""Tables 3-4: rejected draft tokens carry higher draft entropy than accepted ones, and verifier
entropy shows the same direction. One value per prompt (rejected minus accepted entropy, from the
step summary's per-prompt means, steps.entropy), bootstrapped over prompts."""
from __future__ import annotations

from functools import partial

import polars as pl

from ..stats import mean_diff_ci
from . import study
from .claim import STUDY, Cell, Claim, Row


def _entropy(claim: Claim, cell: Cell, kind: str) -> list[Row]:
    """Rejected minus accepted ``kind`` (draft or verifier) entropy, one value per prompt, for the
    study's cell (the math drafter on GSM8K) where present, else the mean over single drafters per
    (benchmark, prompt) (labelled as such). Prompts without both numbers are dropped before they are
    counted."""
    per_prompt = cell.steps.entropy.get(kind) if cell.steps is not None else None
    if per_prompt is None:
        return []
    backbone, temp = cell.backbone, cell.temp
    s = per_prompt.filter((pl.col("backbone") == backbone) & (pl.col("temperature") == temp))
    rows = s.filter((pl.col("method") == "math") & (pl.col("benchmark") == "gsm8k"))
    what, bench = f"rejected - accepted {kind} entropy (nats), math drafter on gsm8k", "gsm8k"
    ev = study.entropy(backbone, temp, "math", "gsm8k") if kind == "draft" else study.verifier_entropy(backbone, temp)
    if rows.is_empty():
        rows, bench = s, None
        what = f"rejected - accepted {kind} entropy (nats), mean over single drafters per prompt"
        ev = (study.none_for(backbone, temp, "pooled single drafters") if kind == "draft"
              else study.verifier_entropy(backbone, temp))
    if rows.is_empty():
        return []
    per = (rows.with_columns((pl.col("rej") - pl.col("acc")).alias("diff")).drop_nulls("diff")
           .group_by("benchmark", "prompt_id").agg(pl.col("diff").mean()).sort("benchmark", "prompt_id"))
    if per.is_empty():
        return []
    n = int(per.group_by("benchmark").len()["len"].min())
    return [claim.tested(backbone, temp, what, mean_diff_ci(per["diff"].to_numpy(), p=True), n, ev, bench=bench)]


CLAIMS = (
    Claim("entropy", "rejected draft tokens carry higher draft entropy than accepted ones (Tables 3-4)",
          "step traces of single drafters", STUDY, partial(_entropy, kind="draft"),
          study=lambda bb, t: study.entropy(bb, t, "math", "gsm8k")),
    Claim("verifier-entropy", "verifier entropy shows the same direction: higher at rejected tokens (Tables 3-4)",
          "step traces of single drafters", STUDY, partial(_entropy, kind="verifier"), study=study.verifier_entropy),
)
