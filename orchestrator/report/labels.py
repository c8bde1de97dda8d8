"""The report's names for the routers and drafters it singles out, shared by the tables, the claims
and the study's numbers (this module imports nothing of the report: every other module may use it).

What each router is: routers.py (``DESCRIBE``) and docs/report.md."""
from __future__ import annotations

POSTHOC = "confidence(post hoc)"  # the study's code's router exactly (its Table 1 numbers)
POSTHOC_NODE = "confidence(post hoc, node)"  # the project's earlier reading of it: c(v), first rejected child
POSTHOCS = (POSTHOC, POSTHOC_NODE)
# the better specialist of the route pair per prompt, in hindsight (by its tau): the ceiling of a router over
# the pair (hedge's), not a method: not deployable, and at T>0 not lossless (it picks between two samples)
ORACLE = "oracle(hindsight)"
AFTER_THE_FACT = (*POSTHOCS, ORACLE)  # the methods that choose between finished generations
PROMPT_NODE = "confidence(prompt, node)"  # the study's text's router: once per prompt, mean c(v)
HEADS = "entropy(turn, 4 heads)"  # the study's code's entropy router over math, chat, mixed, averaged
LAST_TURN = ", last turn)"  # Table 2's variant of a per-turn router: the prompt's choice is its last turn's
HEADS_LAST = HEADS[:-1] + LAST_TURN  # the study's Table 2 entropy column (its code records the last turn's)

# The headline routing (RQ3a, RQ3b, RQ4): the study's Table 1 "confidence routed" numbers are its code's
# post hoc router's (routers.py), so these claims use it; it is not deployable (it sees both whole
# generations), so the speed claim times the study's text's deployable per-prompt router instead.
ROUTED = POSTHOC
SPEED_ROUTED = PROMPT_NODE

SINGLES = ("math", "chat", "mixed_half", "mixed_full")  # the single drafters of the study's data variants
MIXED = ("mixed_half", "mixed_full")  # Mixed 35k+35k and Mixed 70k+70k
