"""The study's cost estimate, measured: confidence routing costs less speed than merged trees. Tokens
per second of the deployable per-prompt router (``SPEED_ROUTED``: the post hoc router has no
deployable wall clock) minus merged trees, a ratio of sums over the same prompts, mean over
benchmarks, where the traces carry wall-clock times; cells timed in different grid invocations are
not compared."""
from __future__ import annotations

from dataclasses import replace

from ..labels import ROUTED, SPEED_ROUTED
from . import study
from .claim import NAN, STUDY, TIMED_APART, Cell, Claim, Row


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


CLAIMS = (
    Claim("speed", "confidence routing costs less speed than merged trees (Section 7 estimate)",
          f"{SPEED_ROUTED} and merged with wall-clock times", STUDY, _speed, study=lambda bb, t: study.speed()),
)
