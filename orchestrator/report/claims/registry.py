"""Every claim the report checks, by name, in the report's order: the study's claims (RQ1-RQ5, the
ordering across backbones, the Table 1 and Tables 4-8 statements issue 64 added, the speed estimate),
then its proposed next experiments, the third backbone and the project's online router. One record per claim (claim.Claim), each defined in the
module of its research question."""
from __future__ import annotations

from . import (eagle3, entropy, hedge, ordering, proposed, rq1, rq2, rq3, rq4, rq5, seed_depth, seed_table1,
               speed)
from .claim import EXPLORATORY, STUDY, Claim

MODULES = (rq1, rq2, rq3, ordering, seed_table1, rq4, entropy, rq5, seed_depth, speed, proposed, eagle3, hedge)
CLAIMS: dict[str, Claim] = {c.name: c for module in MODULES for c in module.CLAIMS}
STUDY_CLAIMS = tuple(name for name, c in CLAIMS.items() if c.family == STUDY)


def family_of(claim: str, backbone: str | None = None) -> str:
    """The Holm family of a claim's row on ``backbone`` (Claim.family_on; a name not listed: exploratory)."""
    return CLAIMS[claim].family_on(backbone) if claim in CLAIMS else EXPLORATORY
