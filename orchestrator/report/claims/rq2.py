"""RQ2: mixed data against the specialists (Table 1). As the study states it, robustness: a mixed
drafter beats the mismatched specialist on every benchmark (RQ2), while the matched specialist often
beats it on its home benchmark (RQ2-home); and the two mixes trade places between T=0 and T=1
(RQ2-reversal)."""
from __future__ import annotations

from functools import partial

from ..labels import MIXED
from ..tables import MATH_BENCH
from . import study
from .claim import STUDY, Cell, Claim, Row


def _against_specialist(claim: Claim, cell: Cell, home: bool) -> list[Row]:
    """Per mixed drafter and benchmark: mixed - mismatched specialist, or (``home``) matched - mixed."""
    if not {"math", "chat"} <= cell.methods:
        return []
    rows = []
    for mixed in MIXED:
        if mixed not in cell.methods:
            continue
        for bn in cell.benches:
            matched, mismatched = ("math", "chat") if bn in MATH_BENCH else ("chat", "math")
            a, b = (matched, mixed) if home else (mixed, mismatched)
            rows.append(claim.tested(cell.backbone, cell.temp, f"{a} - {b} on {bn} (tau)", *cell.on_bench(a, b, bn),
                                     study.pair(cell.backbone, cell.temp, a, b, bn), bench=bn))
    return rows


def _reversal(claim: Claim, cell: Cell) -> list[Row]:
    """Mixed 70k+70k - Mixed 35k+35k at T=0, the other way round at T=1, average over benchmarks."""
    if not set(MIXED) <= cell.methods or cell.temp not in (0.0, 1.0):
        return []
    a, b = ("mixed_full", "mixed_half") if cell.temp == 0 else ("mixed_half", "mixed_full")
    return [claim.tested(cell.backbone, cell.temp, f"{a} - {b}, average over benchmarks", *cell.average(a, b),
                         study.reversal(cell.backbone, cell.temp))]


def _both_temperatures(backbones: list[str], temps: list[float]) -> list[tuple[str, float]]:
    """The reversal is a claim about T=0 and T=1: both are checked (reported missing) whatever the grid."""
    return [(bb, t) for bb in backbones for t in sorted(set(temps) | {0.0, 1.0})]


def _per_mixed_bench(grid, backbone=None) -> int:
    return len(MIXED) * len(grid.benchmarks)


CLAIMS = (
    Claim("RQ2", "mixed data is robust: it beats the mismatched specialist on every benchmark (Table 1)",
          "a mixed drafter and both specialists", STUDY, partial(_against_specialist, home=False),
          study=lambda bb, t: study.pair(bb, t, "mixed_full", "math", "mt_bench"), slots=_per_mixed_bench),
    Claim("RQ2-home", "on its home domain the matched specialist often beats mixed data (Table 1)",
          "a mixed drafter and both specialists", STUDY, partial(_against_specialist, home=True),
          study=lambda bb, t: study.pair(bb, t, "chat", "mixed_full", "mt_bench"), slots=_per_mixed_bench),
    Claim("RQ2-reversal", "Mixed 70k+70k leads Mixed 35k+35k at T=0; the order reverses at T=1 (Table 1)",
          "mixed_half and mixed_full at this temperature (T=0 and T=1 for the reversal)", STUDY, _reversal,
          study=study.reversal, keys=_both_temperatures),
)
