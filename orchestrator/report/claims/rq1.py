"""RQ1: a specialist drafts longer on its own domain (Table 1). Each benchmark compares the two
specialists, the matched one first (math on the math benchmarks, chat on MT-Bench), tau paired by
prompt."""
from __future__ import annotations

from functools import partial

from ..tables import MATH_BENCH
from . import study
from .claim import STUDY, Cell, Claim, Row


def _home(claim: Claim, cell: Cell, math_home: bool) -> list[Row]:
    """The matched minus the mismatched specialist on each benchmark of ``math_home``'s domain."""
    if not {"math", "chat"} <= cell.methods:
        return []
    rows = []
    a, b = ("math", "chat") if math_home else ("chat", "math")
    for bn in cell.benches:
        if (bn in MATH_BENCH) != math_home:
            continue
        ev = study.pair(cell.backbone, cell.temp, a, b, bn)
        rows.append(claim.tested(cell.backbone, cell.temp, f"{a} - {b} specialist on {bn} (tau)",
                                 *cell.on_bench(a, b, bn), ev, bench=bn))
    return rows


def _n_math(grid, backbone=None) -> int:
    return sum(b in MATH_BENCH for b in grid.benchmarks)


CLAIMS = (
    Claim("RQ1-math", "a drafter trained on math data has the longer acceptance on math benchmarks (Table 1)",
          "math and chat specialists on a math benchmark", STUDY, partial(_home, math_home=True),
          study=lambda bb, t: study.pair(bb, t, "math", "chat", "gsm8k"), slots=_n_math),
    Claim("RQ1-chat", "a drafter trained on chat data has the longer acceptance on MT-Bench (Table 1)",
          "math and chat specialists on mt_bench", STUDY, partial(_home, math_home=False),
          study=lambda bb, t: study.pair(bb, t, "chat", "math", "mt_bench"),
          slots=lambda grid, backbone=None: len(grid.benchmarks) - _n_math(grid)),
)
