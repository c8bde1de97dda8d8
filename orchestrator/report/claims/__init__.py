"""The claims the report checks, grouped by research-question family: one record per claim and the
benchmark weighting (claim.py), RQ1-RQ2 and the Table 1 statements (specialisation.py), RQ3-RQ4, the
ordering across backbones and the speed estimate (composition.py), RQ5 and Tables 3-8 (depth.py), the
project's own (project.py: the study's proposed next experiments, the third backbone, the online
router), the study's numbers for each claim's cell (study.py), and the registry in the report's order
with the two Holm families and ``check_claims``, which runs them all on a run (check.py)."""
from __future__ import annotations

from orchestrator.report.claims.check import (
           CLAIMS,
           STUDY_CLAIMS,
           add_holm,
           check_claims,
           family_of,
           family_size,
)
from orchestrator.report.claims.claim import EXPLORATORY, MIN_PROMPTS, STUDY, Cell, Claim, Grid, Row, frame

__all__ = ["CLAIMS", "EXPLORATORY", "MIN_PROMPTS", "STUDY", "STUDY_CLAIMS", "Cell", "Claim", "Grid", "Row",
           "add_holm", "check_claims", "family_of", "family_size", "frame"]
