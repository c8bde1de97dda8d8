"""Checks of ``hedge``, the project's online router (decoding/hedge.py; issue 57): does it find the
home drafter, and does it hold up against the study's post hoc router and merged trees? Every
interval is a paired bootstrap over prompts, in the exploratory family (the study has no such claim).

``hedge-home``: hedge minus the matched specialist (math on the math benchmarks, chat on MT-Bench),
per benchmark: an online router that finds the home drafter is not below it. ``hedge-posthoc``:
hedge minus TAPS's post hoc router (routers.POSTHOC, not deployable), average. ``hedge-merged``:
hedge minus merged trees, average (merged trees verify the union of both trees: a larger budget).
``hedge-speed``: hedge minus merged trees in tokens per second, average. ``row`` is claims._row
(passed in, as in claims_next: claims imports this module)."""
from __future__ import annotations

from .routers import POSTHOC
from .stats import paired_avg_diff_ci, paired_diff_ci, verdict
from .tables import MATH_BENCH, aligned, timed

CLAIMS = ("hedge-home", "hedge-posthoc", "hedge-merged", "hedge-speed")
WORDING = {
    "hedge-home": "hedge finds the home drafter: its tau is above the matched specialist's on each benchmark "
                  "(level with it, inside the interval, is issue 57's target)",
    "hedge-posthoc": "hedge (online, lossless) beats TAPS's post hoc router (after the fact, not deployable)",
    "hedge-merged": "hedge beats merged trees on acceptance length (average)",
    "hedge-speed": "hedge is at least as fast as merged trees (tokens/s, average)",
}
NEEDS = {
    "hedge-home": "hedge and the math and chat specialists",
    "hedge-posthoc": f"hedge and {POSTHOC}",
    "hedge-merged": "hedge and merged",
    "hedge-speed": "hedge and merged with wall-clock times",
}
NOTE = "the project's own online router (issue 57): the study has no number for it"


def hedge_methods(methods) -> list[str]:
    """The report's names of the hedge cells (tables.method_expr: ``hedge(step)``)."""
    return sorted(m for m in methods if m == "hedge" or m.startswith("hedge("))


def hedge_claims(pp, backbone, temp, benches, methods, row) -> list[dict]:
    out = []

    def test(claim, what, res, n, bench=None):
        est, lo, hi, p = res
        ev = {"wording": WORDING[claim], "study": NOTE, "study_consistent": None, "study_note": ""}
        return row(claim, backbone, temp, what, est, lo, hi, verdict(lo, hi), n, p, ev, bench)

    def avg(a, b, num="new_tokens", den="verifier_calls"):
        groups = [aligned(pp, backbone, temp, bn, a, b, num, den) for bn in benches]
        return paired_avg_diff_ci(groups, p=True), min(len(g[0]) for g in groups)

    for h in hedge_methods(methods):
        if {"math", "chat"} <= methods:
            for bn in benches:
                home = "math" if bn in MATH_BENCH else "chat"
                arrays = aligned(pp, backbone, temp, bn, h, home)
                out.append(test("hedge-home", f"{h} - {home} (matched specialist) on {bn} (tau)",
                                paired_diff_ci(*arrays, p=True), len(arrays[0]), bn))
        if POSTHOC in methods:
            out.append(test("hedge-posthoc", f"{h} - {POSTHOC}, average (tau)", *avg(h, POSTHOC)))
        if "merged" in methods:
            out.append(test("hedge-merged", f"{h} - merged, average (tau)", *avg(h, "merged")))
            if timed(pp, backbone, temp, [h, "merged"]):
                out.append(test("hedge-speed", f"{h} - merged, tokens/s, average",
                                *avg(h, "merged", "out_tokens", "wall_time_s")))
    return out
