"""The claims the report checks: one record per claim (claim.Claim: name, wording, needs, Holm family,
check), one module per research question (rq1..rq5, ordering, speed, entropy; proposed: the study's
proposed next experiments; eagle3, hedge: the project's own), the registry of them in the report's
order, the study's numbers for each claim's cell (study.py), the two Holm families (family.py) and
``check_claims``, which runs them all on a run (check.py)."""
from __future__ import annotations

from .check import add_holm, check_claims
from .claim import EXPLORATORY, MIN_PROMPTS, STUDY, Cell, Claim, Row, frame
from .family import family_size
from .grid import Grid
from .registry import CLAIMS, STUDY_CLAIMS, family_of

__all__ = ["CLAIMS", "EXPLORATORY", "MIN_PROMPTS", "STUDY", "STUDY_CLAIMS", "Cell", "Claim", "Grid", "Row",
           "add_holm", "check_claims", "family_of", "family_size", "frame"]
