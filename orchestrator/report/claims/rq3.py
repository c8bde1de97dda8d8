"""RQ3: composing two specialists (Table 1, Figure 6). Merged trees against the study's confidence
routing (RQ3a), that routing against the best single drafter (RQ3b), the weight-averaged drafter
the weakest (RQ3c) and the worst in every cell (RQ3c-cells), no λ of the averaging sweep recovering
the better specialist (Fig6), merged trees the best method overall (merged-best). The routing rows
use ``ROUTED``, the router behind the study's Table 1 numbers (labels.py)."""
from __future__ import annotations

import re

import numpy as np
import polars as pl

from ..labels import ORACLE, ROUTED, SINGLES
from . import study
from .claim import STUDY, Cell, Claim, Row
from .weighting import mean_tau, named, picks

ROUTING_NOTE = (f"this row's routing is {ROUTED}, the study's code's router behind its Table 1 numbers; "
                "not deployable (sees both whole generations)")


def _mean_tau(cell: Cell, m: str, benches) -> float:
    """``m``'s tau (ratio of sums) per benchmark of ``benches``, averaged as the cell weights them
    (weighting.py); -inf where it has none."""
    return mean_tau(cell.prompts, cell.backbone, cell.temp, m, list(benches), cell.weighting)


def _pick(cell: Cell, methods: list[str], best: bool = True) -> tuple[str, str]:
    """(the best or worst of ``methods`` under the cell's weighting, its name with the other
    weighting's pick where that differs: weighting.named)."""
    choice = picks(cell.prompts, cell.backbone, cell.temp, methods, cell.benches, best)
    return choice[cell.weighting], named(choice, "best" if best else "worst", cell.weighting)


def _singles(cell: Cell) -> list[str]:
    return [m for m in SINGLES if m in cell.methods]


def _rq3a(claim: Claim, cell: Cell) -> list[Row]:
    if not {"merged", ROUTED} <= cell.methods:
        return []
    ev = study.pair(cell.backbone, cell.temp, "merged", ROUTED, "average", note=ROUTING_NOTE)
    return [claim.tested(cell.backbone, cell.temp, f"merged - {ROUTED}, average", *cell.average("merged", ROUTED),
                         ev)]


def _rq3b(claim: Claim, cell: Cell) -> list[Row]:
    singles = _singles(cell)
    if ROUTED not in cell.methods or not singles:
        return []
    best, text = _pick(cell, singles)
    ev = study.rq3b(cell.backbone, cell.temp, ROUTED)
    ev["study_note"] = "; ".join(x for x in (ev["study_note"], ROUTING_NOTE) if x)
    what = f"{ROUTED} - best single ({text}), average ({cell.weighting})"
    return [claim.tested(cell.backbone, cell.temp, what, *cell.average(ROUTED, best), ev)]


def _rq3c(claim: Claim, cell: Cell) -> list[Row]:
    singles = _singles(cell)
    if "avg0.5" not in cell.methods or not singles:
        return []
    worst, text = _pick(cell, singles, best=False)
    what = f"averaged - worst specialist ({text}), average ({cell.weighting})"
    return [claim.tested(cell.backbone, cell.temp, what, *cell.average("avg0.5", worst),
                         study.rq3c(cell.backbone, cell.temp), False)]


def _rq3c_cells(claim: Claim, cell: Cell) -> list[Row]:
    """"Worst in every cell": on each benchmark, the averaged drafter against its lowest rival there."""
    rivals = [m for m in (*SINGLES, ROUTED, "merged") if m in cell.methods and m != "avg0.5"]
    if "avg0.5" not in cell.methods or not rivals:
        return []
    rows = []
    for bn in cell.benches:
        worst = min(rivals, key=lambda m: _mean_tau(cell, m, [bn]))
        rows.append(claim.tested(cell.backbone, cell.temp, f"averaged - lowest other variant ({worst}) on {bn} (tau)",
                                 *cell.on_bench("avg0.5", worst, bn),
                                 study.rq3c_cell(cell.backbone, cell.temp, bn, rivals), False, bn))
    return rows


def _fig6(claim: Claim, cell: Cell) -> list[Row]:
    """Each λ strictly between the specialists against the better specialist (a sweep: >= 2 of them)."""
    lams = sorted((float(m[3:]), m) for m in cell.methods if re.fullmatch(r"avg[0-9.]+", m) and 0 < float(m[3:]) < 1)
    if len(lams) < 2 or not {"math", "chat"} <= cell.methods:
        return []
    spec, text = _pick(cell, ["math", "chat"])
    tail = f"best specialist ({text}), average ({cell.weighting})"
    return [claim.tested(cell.backbone, cell.temp, f"{m} - {tail}", *cell.average(m, spec),
                         study.fig6(cell.backbone, cell.temp), False) for _, m in lams]


def _merged_best(claim: Claim, cell: Cell) -> list[Row]:
    others = [m for m in cell.methods if not m.startswith("merged") and "@" not in m and "[" not in m
              and m not in ("autoregressive", ORACLE)]  # (the hindsight oracle is a ceiling, not a method)
    if "merged" not in cell.methods or not others:
        return []
    best, text = _pick(cell, sorted(others))
    what = f"merged - best other method ({text}), average ({cell.weighting})"
    return [claim.tested(cell.backbone, cell.temp, what, *cell.average("merged", best),
                         study.merged_best(cell.backbone, cell.temp))]


def _sweep_slots(grid, backbone=None) -> int:
    """One hypothesis per averaged drafter strictly between the specialists, on the backbones the sweep
    runs on (one when that is not a sweep)."""
    swept = grid.sweep_backbones is None or backbone is None or backbone in grid.sweep_backbones
    sweep = sum(0 < lam < 1 for lam in grid.lambdas) if swept else 0
    return sweep if sweep >= 2 else 1


CLAIMS = (
    Claim("RQ3a", "merged trees beat confidence routing (Table 1, average)", f"merged and {ROUTED}", STUDY, _rq3a,
          study=lambda bb, t: study.pair(bb, t, "merged", ROUTED, "average")),
    Claim("RQ3b", "confidence routing beats the best single checkpoint (Table 1, average)",
          f"{ROUTED} and a single drafter", STUDY, _rq3b, study=lambda bb, t: study.rq3b(bb, t, ROUTED)),
    Claim("RQ3c", "the weight-averaged checkpoint is the weakest (Table 1)", "avg0.5 and a single drafter", STUDY,
          _rq3c, study=study.rq3c),
    Claim("RQ3c-cells", "the weight-averaged checkpoint is the worst in every cell (Table 1: each benchmark)",
          "avg0.5 and another Table 1 variant", STUDY, _rq3c_cells, study=study.rq3c_all,
          slots=lambda grid, backbone=None: len(grid.benchmarks)),
    Claim("Fig6", "no lambda of the averaging sweep recovers specialist-level acceptance (Figure 6)",
          "a lambda sweep (>= 2 averaged checkpoints, 0 < lambda < 1) and both specialists", STUDY, _fig6,
          study=study.fig6, slots=_sweep_slots),
    Claim("merged-best", "merged trees are the best method overall (Table 1, average)", "merged and another method",
          STUDY, _merged_best, study=study.merged_best),
)
