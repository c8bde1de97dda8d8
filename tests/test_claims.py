"""Every claim check of the report driven to holds / does not hold / inconclusive on small synthetic
frames, the study's numbers per row, the prompt as the bootstrap unit, and the Holm column."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from orchestrator.report import study_tables as st
from orchestrator.report.claims import Grid, add_holm, check_claims, family_size
from orchestrator.report.claims import study as cs
from orchestrator.report.labels import ROUTED, SPEED_ROUTED
from orchestrator.report.stats import holm, mean_diff_ci

N = 12
NOISE = [0.1 * ((-1) ** i) * (i % 3) for i in range(N)]  # sums to 0 over 12 prompts


def _noise(k: int) -> list[float]:
    """Independent-looking noise per method (a rotation of NOISE), still summing to 0."""
    return NOISE[k % N:] + NOISE[: k % N]


def _pp(cells, backbone="hass", temp=0.0, n=N, wall=None, invocation=None):
    """Per-prompt rows from {(method, bench): tau or (tau, noise_index)}; 20 calls per prompt."""
    rows = []
    for (method, bench), spec in cells.items():
        tau, k = spec if isinstance(spec, tuple) else (spec, 0)
        for i in range(n):
            t = tau + (_noise(k)[i] if k is not None else 0.0)
            tok = int(round(t * 20))
            rows.append({"backbone": backbone, "method": method, "benchmark": bench, "temperature": temp,
                         "prompt_id": f"p{i}", "new_tokens": tok, "verifier_calls": 20, "routing_choice": -1,
                         "out_tokens": tok + 1, "wall_time_s": (wall or {}).get(method, 1.0),
                         "invocation": (invocation or {}).get(method, "A")})
    return pl.DataFrame(rows)


def _rows(cl, claim, contains=""):
    return cl.filter((pl.col("claim") == claim) & pl.col("comparison").str.contains(contains, literal=True))


def _words(cl, claim, contains=""):
    return sorted(set(_rows(cl, claim, contains)["verdict"].to_list()))


SPEC = {("math", "gsm8k"): 3.0, ("chat", "gsm8k"): 2.0, ("math", "mt_bench"): 1.5, ("chat", "mt_bench"): 2.5}


@pytest.mark.parametrize("mixed,expected", [(2.8, "holds"), (1.0, "does not hold"), (None, "inconclusive")])
def test_rq2_is_robustness_per_benchmark(mixed, expected):
    """RQ2 as the study states it: mixed beats the MISMATCHED specialist on each benchmark."""
    cells = dict(SPEC)
    if mixed is None:  # equal to the mismatched specialist on each benchmark, with noise
        cells |= {("mixed_full", "gsm8k"): (2.0, 3), ("mixed_full", "mt_bench"): (1.5, 3)}
    else:
        cells |= {("mixed_full", "gsm8k"): (mixed, 3), ("mixed_full", "mt_bench"): (mixed - 0.3, 3)}
    cl = check_claims(_pp(cells), None, None)
    assert _words(cl, "RQ2") == [expected]
    assert _rows(cl, "RQ2").height == 2 and "chat" in _rows(cl, "RQ2", "gsm8k")["comparison"][0]
    home = _rows(cl, "RQ2-home", "gsm8k").row(0, named=True)  # matched specialist math (3.0) vs mixed
    assert home["comparison"].startswith("math - mixed_full on gsm8k")


def test_rq2_home_reaches_every_verdict():
    for mixed, expected in ((2.0, "holds"), (3.5, "does not hold"), (3.0, "inconclusive")):
        cells = dict(SPEC) | {("mixed_half", "gsm8k"): (mixed, 4), ("mixed_half", "mt_bench"): (2.0, 4)}
        cl = check_claims(_pp(cells), None, None)
        assert _words(cl, "RQ2-home", "gsm8k") == [expected], mixed


@pytest.mark.parametrize("t0,t1,expected", [((3.0, 2.5), (2.0, 2.5), ["holds"]),
                                            ((3.0, 2.5), (2.5, 2.0), ["does not hold", "holds"]),
                                            ((2.5, 2.5), (2.5, 2.5), ["inconclusive"])])
def test_rq2_reversal_between_temperatures(t0, t1, expected):
    """Mixed 70k+70k (full) ahead of 35k+35k (half) at T=0, behind at T=1: one row per temperature."""
    frames = []
    for temp, (full, half) in ((0.0, t0), (1.0, t1)):
        frames.append(_pp({("mixed_full", "gsm8k"): (full, 1), ("mixed_half", "gsm8k"): (half, 5)},
                          temp=temp))
    cl = check_claims(pl.concat(frames), None, None)
    rows = _rows(cl, "RQ2-reversal")
    assert rows.height == 2 and sorted(set(rows["verdict"])) == expected
    assert rows.filter(pl.col("temperature") == 1.0)["comparison"][0].startswith("mixed_half - mixed_full")
    only_t0 = check_claims(frames[0], None, None)  # no T=1 cells: the T=1 half is said to be missing
    assert "not in this run" in _rows(only_t0,
                                      "RQ2-reversal").filter(pl.col("temperature") == 1.0)["verdict"][0]


@pytest.mark.parametrize("lam_taus,expected", [((1.5, 1.8, 1.6), ["holds"]),
                                               ((1.5, 3.5, 1.6), ["does not hold", "holds"]),
                                               ((2.6, 2.6, 2.6), ["inconclusive"])])
def test_fig6_no_lambda_recovers_specialist_level(lam_taus, expected):
    """Against the better specialist by the study's weighting (1 chat : 3 math): math 2.625, chat 2.125."""
    cells = dict(SPEC)
    for k, (lam, tau) in enumerate(zip((0.25, 0.5, 0.75), lam_taus)):
        cells |= {(f"avg{lam:g}", b): (tau, k + 2) for b in ("gsm8k", "mt_bench")}
    cl = check_claims(_pp(cells), None, None)
    assert _rows(cl, "Fig6").height == 3 and sorted(set(_rows(cl, "Fig6")["verdict"])) == expected
    # the best specialist on average: math by 1 chat : 3 math; equally weighted a tie (2.25), chat by name
    # order
    assert "best specialist (math; equal per benchmark's best: chat)" in _rows(cl, "Fig6")["comparison"][0]
    one = check_claims(_pp(dict(SPEC) | {("avg0.5", "gsm8k"): 1.0, ("avg0.5", "mt_bench"): 1.0}), None, None)
    assert "not in this run" in _rows(one, "Fig6")["verdict"][0]  # one lambda is not a sweep


@pytest.mark.parametrize("merged,expected", [(3.5, "holds"), (1.5, "does not hold"), (2.7, "inconclusive")])
def test_merged_trees_best_overall(merged, expected):
    """The routed drafter (2.7) is the best other method by either weighting (math: 2.625 by 1 : 3)."""
    cells = dict(SPEC) | {(ROUTED, b): (2.7, 1) for b in ("gsm8k", "mt_bench")}
    cells |= {("merged", b): (merged, 5) for b in ("gsm8k", "mt_bench")}
    cells |= {("merged@16", b): 9.0 for b in ("gsm8k", "mt_bench")}  # a merged variant is not a rival
    cl = check_claims(_pp(cells), None, None)
    r = _rows(cl, "merged-best").row(0, named=True)
    assert r["verdict"] == expected and f"({ROUTED})" in r["comparison"]


@pytest.mark.parametrize("second,expected", [((1.0, 2.0, 3.0, 4.0), "holds"),
                                             ((4.0, 3.0, 2.0, 1.0), "does not hold"),
                                             ((2.0, 2.0, 2.0, 2.0), "inconclusive")])
def test_same_ordering_on_both_backbones(second, expected):
    methods = ("math", "chat", "mixed_half", "merged")
    first = (1.0, 2.0, 3.0, 4.0) if expected != "inconclusive" else (2.0, 2.0, 2.0, 2.0)
    frames = [_pp({(m, b): (t, k * 3 + j + off) for k, (m, t) in enumerate(zip(methods, taus))
                   for j, b in enumerate(("gsm8k", "mt_bench"))}, backbone=bb)
              for bb, taus, off in (("hass", first, 0), ("eagle2", second, 5))]
    cl = check_claims(pl.concat(frames), None, None)
    r = _rows(cl, "backbones").row(0, named=True)
    assert r["backbone"] == "hass+eagle2" and r["verdict"] == expected and r["prompts"] == N
    if expected != "inconclusive":
        assert r["estimate"] == pytest.approx(1.0 if expected == "holds" else -1.0)


def _steps(method, bench, k_of, length, n=N, per=10, backbone="hass", temp=0.0, rej=1.5, acc=0.5):
    """`per` steps per prompt; depth_accept = [True] * (length - 1) + [step < k_of(i)], so the rate at
    the last depth on prompt i is k_of(i) / per and 1 at shallower depths."""
    return [{"backbone": backbone, "temperature": temp, "strategy": "single", "method": method,
             "benchmark": bench,
             "prompt_id": f"p{i}", "depth_accept": [True] * (length - 1) + [j < k_of(i)],
             "accepted_draft_entropy": [acc], "rejected_draft_entropy": rej(i) if callable(rej) else rej}
            for i in range(n) for j in range(per)]


@pytest.mark.parametrize("k_math,k_chat,expected", [(lambda i: 9, lambda i: 5, "holds"),
                                                    (lambda i: 5, lambda i: 9, "does not hold"),
                                                    (lambda i: 6 + i % 3, lambda i: 8 - i % 3,
                                                     "inconclusive")])
def test_matched_specialist_declines_more_slowly(k_math, k_chat, expected):
    steps = pl.DataFrame(_steps("math", "gsm8k", k_math, 3) + _steps("chat", "gsm8k", k_chat, 3))
    cl = check_claims(_pp({("math", "gsm8k"): 3.0, ("chat", "gsm8k"): 2.0}), steps, None)
    r = _rows(cl, "depth-slope").row(0, named=True)
    assert r["verdict"] == expected and r["prompts"] == N and "gsm8k:3" in r["comparison"]


@pytest.mark.parametrize("k_mixed,expected", [(lambda i: 10, "holds"), (lambda i: 4, "does not hold"),
                                              (lambda i: 6 + i % 3, "inconclusive")])
def test_mixed_leads_at_shallow_depth(k_mixed, expected):
    steps = pl.DataFrame(_steps("math", "gsm8k", lambda i: 8 - i % 3, 1)
                         + _steps("mixed_full", "gsm8k", k_mixed, 1))
    cl = check_claims(_pp({("math", "gsm8k"): 3.0, ("mixed_full", "gsm8k"): 2.0}), steps, None)
    assert _words(cl, "depth-shallow", "mixed_full") == [expected]


def test_depth_claim_counts_prompts_per_benchmark():
    """RQ5 is checked per checkpoint and benchmark (issue 64): 12 prompts on gsm8k hold, the 5 on mt_bench
    are below the rule of 10 per benchmark; each row names its benchmark."""
    steps = pl.DataFrame(_steps("math", "gsm8k", lambda i: 2, 3)
                         + _steps("math", "mt_bench", lambda i: 2, 3, n=5))
    cl = check_claims(_pp({("math", "gsm8k"): 3.0}), steps, None)
    g, m = (_rows(cl, "RQ5", f"on {b}").row(0, named=True) for b in ("gsm8k", "mt_bench"))
    assert (g["prompts"], g["benchmark"], g["verdict"]) == (N, "gsm8k", "holds")
    assert m["prompts"] == 5 and m["verdict"] == "inconclusive (n=5 < 10 prompts)"
    assert m["benchmark"] == "mt_bench"
    assert m["estimate"] == pytest.approx(0.8)


def test_entropy_claim_counts_only_prompts_with_a_difference_and_resamples_prompts():
    # 3 of 12 prompts never rejected a token (NaN): 9 prompts count, below the rule
    def rej(i):
        return float("nan") if i < 3 else 1.5
    steps = pl.DataFrame(_steps("math", "gsm8k", lambda i: 5, 2, rej=rej))
    cl = check_claims(_pp({("math", "gsm8k"): 3.0}), steps, None)
    r = _rows(cl, "entropy").row(0, named=True)
    assert r["prompts"] == 9 and r["verdict"] == "inconclusive (n=9 < 10 prompts)"
    assert r["estimate"] == pytest.approx(1.0)
    # every checkpoint on every benchmark (issue 64): one row per drafter and benchmark, each over its prompts
    diff = [0.25 * i for i in range(N)]  # exact in binary: the claim's means give these very bytes (the seed)
    steps = pl.DataFrame(_steps("chat", "mt_bench", lambda i: 5, 2, rej=lambda i: 0.5 + diff[i])
                         + _steps("mixed_full", "mt_bench", lambda i: 5, 2, rej=lambda i: 0.5 + diff[i])
                         + _steps("chat", "gsm8k", lambda i: 5, 2, rej=lambda i: 0.5 - diff[i]))
    cl = _rows(check_claims(_pp({("chat", "mt_bench"): 2.0}), steps, None), "entropy")
    est, lo, hi, _ = mean_diff_ci(np.array([diff[i] for i in sorted(range(N), key=lambda i: f"p{i}")]),
                                  p=True)
    assert cl.height == 3 and set(cl["prompts"]) == {N}
    for r in cl.filter(pl.col("benchmark") == "mt_bench").iter_rows(named=True):
        assert (r["estimate"], r["ci_lo"], r["ci_hi"]) == pytest.approx((est, lo,
                hi)) and r["verdict"] == "holds"
    assert _rows(cl, "entropy", "chat drafter on gsm8k")["verdict"][0] == "does not hold"


@pytest.mark.parametrize("wall,inv,expected", [
    ({SPEED_ROUTED: 1.0, "merged": 2.0}, None, "holds"),
    ({SPEED_ROUTED: 2.0, "merged": 1.0}, None, "does not hold"),
    ({SPEED_ROUTED: 1.0, "merged": 1.0}, None, "inconclusive"),
    ({SPEED_ROUTED: 1.0, "merged": 2.0}, {"merged": "B"},
     "inconclusive (timed in different grid invocations)")])
def test_routing_costs_less_speed_than_merged_trees(wall, inv, expected):
    """Timed on the study's text's deployable router (the post hoc one decodes both generations)."""
    cells = {(SPEED_ROUTED, b): (2.5, 1) for b in ("gsm8k", "mt_bench")}
    cells |= {("merged", b): (2.5, 7) for b in ("gsm8k", "mt_bench")}
    cl = check_claims(_pp(cells, wall=wall, invocation=inv), None, None)
    r = _rows(cl, "speed").row(0, named=True)
    assert r["verdict"] == expected and "Section 7" in r["study"] and r["study_consistent"] is True
    assert r["comparison"].startswith(f"{SPEED_ROUTED} - merged") and ROUTED in r["study_note"]
    no_clock = _pp(cells).with_columns(pl.lit(None, dtype=pl.Float64).alias("wall_time_s"))
    assert "not in this run" in _rows(check_claims(no_clock, None, None), "speed")["verdict"][0]


def test_holm_adjusts_over_every_test_of_the_run():
    adj = holm([0.01, 0.04, 0.03, float("nan")])
    assert adj[:3].tolist() == pytest.approx([0.03, 0.06, 0.06]) and math.isnan(adj[3])
    cl = pl.DataFrame({"claim": ["a", "b", "c", "d", "e"], "prompts": [12, 12, 12, 5, None],
                       "p_value": [0.01, 0.04, 0.03, 0.001, float("nan")],
                       "verdict": ["holds", "does not hold", "holds", "inconclusive (n=5 < 10 prompts)",
                                   "inconclusive (not in this run: needs x)"]})
    out = add_holm(cl)  # d (too few prompts) and e (no cells) are not tests: m = 3
    assert out["verdict_holm"].to_list() == ["holds", "inconclusive (Holm)", "inconclusive (Holm)",
                                             "inconclusive (n=5 < 10 prompts)",
                                             "inconclusive (not in this run: needs x)"]
    assert out["p_holm"][0] == pytest.approx(0.03) and math.isnan(out["p_holm"][3])


def test_each_row_carries_the_study_numbers_of_its_own_cell():
    cells = {("math", "svamp"): 3.0, ("chat", "svamp"): 2.0}
    pp = pl.concat([_pp(cells, backbone="eagle2"), _pp(cells, backbone="hass", temp=1.0)])
    cl = check_claims(pp, None, None)
    e = _rows(cl, "RQ1-math").filter(pl.col("backbone") == "eagle2").row(0, named=True)
    assert e["study"] == "Table 1 (eagle2, T=0, svamp): MathInstruct 70k 4.81 vs ShareGPT 70k 3.71"
    assert e["study_consistent"] is True and "math benchmarks" in e["wording"]
    h = _rows(cl, "RQ1-math").filter((pl.col("backbone") == "hass") & (pl.col("temperature") == 1.0))
    h = h.row(0, named=True)  # a cell only TAPS's README gives, where the study contradicts its wording
    assert h["study"] == "Table 1 (hass, T=1, svamp): MathInstruct 70k 2.46 vs ShareGPT 70k 3.95"
    assert h["study_consistent"] is False
    other = check_claims(_pp(cells, backbone="tiny"), None, None)  # no study number for another backbone
    t = _rows(other, "RQ1-math").row(0, named=True)
    assert t["study"].startswith("the study gives no number") and t["study_consistent"] is None


def test_the_study_contradicts_some_of_its_own_wordings():
    """RQ3b: HASS T=0 Mixed 70k+70k averages 5.18 > confidence routing 4.80; EAGLE-2 T=0 agrees.
    Merged trees best: 5.11 < 5.18 on HASS. Same ordering: the averages order differently."""
    h, e = cs.rq3b("hass", 0.0, ROUTED), cs.rq3b("eagle2", 0.0, ROUTED)
    assert h["study_consistent"] is False and "5.18" in h["study"] and "contradict" in h["study_note"]
    assert e["study_consistent"] is True
    assert cs.merged_best("hass", 0.0)["study_consistent"] is False
    assert cs.merged_best("eagle2", 1.0)["study_consistent"] is True
    assert cs.backbones(0.0)["study_consistent"] is False
    assert cs.reversal("hass", 1.0)["study_consistent"] is True and "4.29" in cs.reversal("hass",
            1.0)["study"]
    assert cs.reversal("hass", 0.0)["study_consistent"] is True  # only MT-Bench gives both: 4.13 vs 3.92
    assert cs.rq4("eagle2", 0.0, "prompt")["study_consistent"] is True
    # the old RQ2 wording (mixed beats each specialist on average) fails on the study's EAGLE-2 T=0 numbers
    assert st.tau_of("eagle2", 0.0, "math", "average")[0] > st.tau_of("eagle2", 0.0, "mixed_half",
                                                                      "average")[0]
    # and the report says so beside the verdict
    cells = {(m, b): 2.0 + 0.1 * k for k, m in enumerate(("math", "chat", ROUTED))
             for b in ("gsm8k", "mt_bench")}
    r = _rows(check_claims(_pp(cells), None, None), "RQ3b").row(0, named=True)
    assert r["study_consistent"] is False and "5.18" in r["study"]


def test_the_study_numbers_are_those_of_study_md():
    """Every number the CSV takes from the paper is in STUDY.md's text (the README's have their own test)."""
    study = Path(__file__).parents[1] / ".." / "shared" / "STUDY.md"
    if not study.is_file():
        pytest.skip("../shared/STUDY.md is not next to this checkout")
    text = study.read_text().replace("–", "-")
    for row in st.STUDY_NUMBERS:
        if row[5].startswith("paper"):
            assert f"{row[4]:.2f}" in text, row
    for row in st.STUDY_OTHER:
        v = row[5]
        if row[6].startswith("paper"):
            assert any(s in text for s in (f"{v:.2f}×", f"{v:.3f}", f"{100 * v:.1f}%")), row
    assert "MathInstruct drafter 5.02 GSM8K" in text.replace("\n", " ")


def test_table1_gives_the_study_convention_beside_ours():
    from orchestrator.report.tables import table1

    pp = pl.DataFrame({"backbone": ["hass"] * 2, "method": ["math"] * 2, "benchmark": ["gsm8k"] * 2,
                       "temperature": [0.0] * 2, "prompt_id": ["a", "b"], "new_tokens": [40, 40],
                       "verifier_calls": [20, 10]})
    r = table1(pp).row(0, named=True)
    assert r["tau"] == pytest.approx(80 / 30) and r["tau_prompt_mean"] == pytest.approx(3.0)
    assert r["tau_study"] == pytest.approx(2.0)


# --- the claims as the study states them (issue 39), the Holm families, the p floor, the prompt rule ---

def _verifier_steps(method, bench, rej, acc=0.5, n=N, per=4):
    return [{"backbone": "hass", "temperature": 0.0, "strategy": "single", "method": method,
             "benchmark": bench,
             "prompt_id": f"p{i}", "depth_accept": [True, False], "accepted_draft_entropy": [0.5],
             "rejected_draft_entropy": 1.5, "accepted_verifier_entropy": [acc],
             "rejected_verifier_entropy": rej(i)} for i in range(n) for _ in range(per)]


def test_averaging_is_checked_in_every_cell_against_the_lowest_other_variant():
    """'worst in every cell': on gsm8k averaging is the lowest (holds); on mt_bench the math
    specialist is lower (does not hold); each row names its rival and carries the study's cell."""
    cells = dict(SPEC) | {("avg0.5", "gsm8k"): (1.0, 2), ("avg0.5", "mt_bench"): (2.0, 2),
                          ("merged", "gsm8k"): (3.5, 4), ("merged", "mt_bench"): (3.0, 4)}
    cl = check_claims(_pp(cells), None, None)
    g = _rows(cl, "RQ3c-cells", "gsm8k").row(0, named=True)
    m = _rows(cl, "RQ3c-cells", "mt_bench").row(0, named=True)
    assert g["verdict"] == "holds" and "(chat) on gsm8k" in g["comparison"]
    assert m["verdict"] == "does not hold" and "(math) on mt_bench" in m["comparison"]
    assert g["study"] == "Table 1 (hass, T=0, gsm8k): Averaged 2.80 vs ShareGPT 70k 4.09" and g[
            "study_consistent"]
    # the study's own Table 1 breaks it at HASS T=1 SVAMP (TAPS README: Averaged 2.69 > MathInstruct 2.46)
    ev = cs.rq3c_all("hass", 1.0)
    assert ev["study_consistent"] is False and "svamp" in ev["study"] and "2.46" in ev["study"]
    assert cs.rq3c_all("eagle2", 0.0)["study_consistent"] is True


@pytest.mark.parametrize("rej,expected", [(lambda i: 1.0 + 0.1 * (i % 3), "holds"),
                                          (lambda i: 0.1 * (i % 3), "does not hold"),
                                          (lambda i: 0.5 + 0.1 * (i % 3 - 1), "inconclusive")])
def test_verifier_entropy_is_checked_like_draft_entropy(rej, expected):
    steps = pl.DataFrame(_verifier_steps("math", "gsm8k", rej))
    r = _rows(check_claims(_pp({("math", "gsm8k"): 3.0}), steps, None), "verifier-entropy").row(0, named=True)
    assert r["verdict"] == expected and "verifier entropy" in r["comparison"] and r["benchmark"] == "gsm8k"
    assert "verifier entropy shows the same direction" in r["study"]


@pytest.mark.parametrize("k_mixed,expected", [(lambda i: 4, "holds"), (lambda i: 10, "does not hold"),
                                              (lambda i: 6 + i % 3, "inconclusive")])
def test_matched_specialist_beats_mixed_at_depths_4_5(k_mixed, expected):
    """Depth 5 trees: both accept depths 1-4; at depth 5 the matched specialist accepts 7 steps of 10."""
    steps = pl.DataFrame(_steps("math", "gsm8k", lambda i: 8 - i % 3, 5)
                         + _steps("mixed_full", "gsm8k", k_mixed, 5))
    cl = check_claims(_pp({("math", "gsm8k"): 3.0, ("mixed_full", "gsm8k"): 2.0}), steps, None)
    assert _words(cl, "depth-deep", "mixed_full") == [expected]
    assert "depths 4-5" in _rows(cl, "depth-deep")["comparison"][0]


def test_acceptance_by_depth_is_checked_for_every_variant():
    """One RQ5 row per variant: math falls with depth (holds), chat does not (its depth 3 accepts
    as often as depth 1), so 'every variant' is not hidden by a mean over drafters."""
    steps = pl.DataFrame(_steps("math", "gsm8k", lambda i: 2, 3) + _steps("chat", "gsm8k", lambda i: 10, 3))
    cl = check_claims(_pp({("math", "gsm8k"): 3.0, ("chat", "gsm8k"): 3.0}), steps, None)
    rows = {r["comparison"].split(":")[0]: r for r in _rows(cl, "RQ5").iter_rows(named=True)}
    assert rows["math"]["verdict"] == "holds" and rows["chat"]["verdict"] == "inconclusive"
    assert "every variant" in rows["math"]["wording"]


def test_the_backbones_must_order_the_methods_identically():
    """One swap of two close methods: Kendall tau_b stays high (0.67, CI above 0: the old test said
    holds), but the study says 'the same order', so the claim does not hold."""
    methods = ("math", "chat", "mixed_half", "merged")
    taus = {"hass": (1.0, 2.0, 3.0, 4.0), "eagle2": (1.0, 2.0, 4.0, 3.0)}
    frames = [_pp({(m, b): (t, k * 3 + j + off) for k, (m, t) in enumerate(zip(methods, taus[bb]))
                   for j, b in enumerate(("gsm8k", "mt_bench"))}, backbone=bb)
              for bb, off in (("hass", 0), ("eagle2", 5))]
    r = _rows(check_claims(pl.concat(frames), None, None), "backbones").row(0, named=True)
    assert r["verdict"] == "does not hold" and r["estimate"] == pytest.approx(2 / 3) and r["ci_lo"] > 0
    assert "a different order here, in 0.0% of resamples" in r["comparison"]
    study = cs.backbones(0.0)
    assert study["study_consistent"] is False and "a different order" in study["study"]


def test_p_is_never_zero():
    from orchestrator.report.stats import B_TEST, boot_p

    assert boot_p(np.ones(2000)) == pytest.approx(1 / 2001)
    cl = check_claims(_pp(SPEC), None, None)
    r = _rows(cl, "RQ1-math").row(0, named=True)  # every resample positive
    assert r["p_value"] == pytest.approx(1 / (B_TEST + 1)) and r["verdict"] == "holds"
    assert (cl["p_value"].drop_nans() > 0).all()


def test_a_benchmark_without_rows_fails_the_prompt_rule():
    """The profile asks for svamp; no svamp rows: its per-benchmark rows and the averages that should
    span it have 0 prompts, and are not tests."""
    grid = Grid(("hass",), (0.0,), ("gsm8k", "mt_bench", "svamp"))
    cells = dict(SPEC) | {(ROUTED, b): (2.0, 1) for b in ("gsm8k", "mt_bench")}
    cells |= {("merged", b): (3.5, 5) for b in ("gsm8k", "mt_bench")}
    cl = check_claims(_pp(cells), None, None, grid=grid)
    sv = _rows(cl, "RQ1-math", "svamp").row(0, named=True)
    assert sv["prompts"] == 0 and sv["verdict"] == "inconclusive (n=0 < 10 prompts: no rows on svamp)"
    avg = _rows(cl, "RQ3a").row(0, named=True)
    assert avg["prompts"] == 0 and avg["verdict"].startswith("inconclusive (n=0")
    assert math.isnan(avg["p_holm"])
    # without the profile's grid (what the traces hold) the same run passes the rule
    assert _rows(check_claims(_pp(cells), None, None), "RQ3a")["verdict"][0] == "holds"


def test_holm_families_are_fixed_by_the_grid_and_keep_exploratory_tests_apart():
    grid = Grid(("hass", "eagle2"), (0.0, 1.0), ("gsm8k", "mt_bench"), (0.25, 0.5, 0.75))
    full = dict(SPEC) | {(ROUTED, b): (2.0, 1) for b in ("gsm8k", "mt_bench")}
    full |= {("merged", b): (3.5, 5) for b in ("gsm8k", "mt_bench")}
    less = {k: v for k, v in full.items() if k[0] != "merged"}  # merged failed
    a, b = check_claims(_pp(full), None, None, grid=grid), check_claims(_pp(less), None, None, grid=grid)
    size = a.filter(pl.col("family") == "study")["family_size"][0]
    assert size == b.filter(pl.col("family") == "study")["family_size"][0] == family_size(grid)
    # per backbone and temperature: RQ1 2, RQ2 and RQ2-home 4 each, RQ3c-cells 2, Fig6 3 lambdas, RQ5 5
    # variants x 2 benchmarks, entropy and verifier-entropy 4 single checkpoints x 2 benchmarks each (issue
    # 64:
    # the universal claims cell by cell), depth-shallow/-deep 2 each, 8 more claims 1 each; RQ2-reversal at
    # both temperatures (4); backbones (2); RQ1-narrows at T=1 per benchmark (4); RQ2-full-above at T=0, one
    # per specialist (4); hass-above-eagle2 per temperature (2); entropy-averaged on HASS per benchmark (4)
    assert size == 4 * (2 + 4 + 4 + 2 + 3 + 10 + 8 + 8 + 2 + 2 + 8) + 4 + 2 + 4 + 4 + 2 + 4
    r = _rows(a, "RQ1-math").filter(pl.col("backbone") == "hass").row(0, named=True)
    assert r["p_holm"] == pytest.approx(min(1.0, size * r["p_value"]))  # the smallest p of the family
    # the project's own routers and the next experiments are exploratory: they do not change the study's
    # p_holm
    extra = _pp(full | {("switching(k=1)", b): (2.5, 3) for b in ("gsm8k", "mt_bench")}
                | {("confidence(prompt, node)", b): (2.0, 6) for b in ("gsm8k", "mt_bench")})
    c = check_claims(extra, None, None, grid=grid)
    assert set(c.filter(pl.col("claim") == "switching")["family"]) == {"exploratory"}
    assert _rows(c, "RQ1-math").filter(pl.col("backbone") == "hass")["p_holm"][0] == r["p_holm"]
    # the sweep on EAGLE-2 only (merge.sweep_backbones): HASS's Figure 6 is one hypothesis, not 3
    one_sweep = Grid(grid.backbones, grid.temperatures, grid.benchmarks, grid.lambdas, ("eagle2",))
    assert family_size(one_sweep) == size - 2 * len(grid.temperatures)
    assert holm([0.01, float("nan")], m=3)[0] == pytest.approx(0.03)
    with pytest.raises(ValueError, match="family of 1 cannot hold 2 tests"):
        holm([0.01, 0.02], m=1)


def test_the_grid_comes_from_the_profile_and_refuses_an_empty_axis():
    pp = _pp(SPEC)
    prof = {"train": {"backbones": ["eagle2", "hass"]}, "merge": {"lambdas": [0.0, 0.5, 1.0]},
            "eval": {"benchmarks": {"gsm8k": 10, "mt_bench": None, "svamp": 300}, "temperatures": [0.0, 1.0]}}
    g = Grid.from_profile(prof, pp)
    assert g == Grid(("eagle2", "hass"), (0.0, 1.0), ("gsm8k", "mt_bench", "svamp"), (0.0, 0.5, 1.0))
    assert Grid.from_profile({}, pp) == Grid(("hass",), (0.0,), ("gsm8k", "mt_bench"))  # what the traces hold
    assert Grid.from_profile({}, pp.with_columns(pl.lit("none").alias("backbone"))).backbones == ("none",)
    with pytest.raises(ValueError, match="claims grid: benchmarks is empty"):
        Grid(("hass",), (0.0,), ())


def test_eagle3_is_compared_with_eagle2_on_matched_specialists_and_its_rows_are_exploratory():
    """Issue #40: the third backbone. EAGLE-3's math drafter on gsm8k and chat drafter on mt_bench
    against EAGLE-2's, paired by prompt (holds / does not hold); the study's claims on eagle3 are
    checked like on the study's backbones but kept out of the study's Holm family (it is about
    EAGLE-2 and HASS), so adding eagle3 to a run leaves the study's family and p_holm as they were."""
    grid2 = Grid(("eagle2",), (0.0,), ("gsm8k", "mt_bench"))
    grid3 = Grid(("eagle2", "eagle3"), (0.0,), ("gsm8k", "mt_bench"))
    e2 = _pp(SPEC, backbone="eagle2")
    for boost, expected, ratio in ((0.6, "holds", "gsm8k 1.20x"), (-0.6, "does not hold", "gsm8k 0.80x")):
        e3 = _pp({k: (v + boost, 7) for k, v in SPEC.items()}, backbone="eagle3")
        cl = check_claims(pl.concat([e2, e3]), None, None, grid=grid3)
        r = _rows(cl, "eagle3").row(0, named=True)
        assert r["backbone"] == "eagle3+eagle2" and r["family"] == "exploratory" and r["verdict"] == expected
        assert r["estimate"] == pytest.approx(boost, abs=0.02) and ratio in r["comparison"], r["comparison"]
        assert "6.23 vs 4.24" in r["study"]
        e3_rq1 = cl.filter((pl.col("claim") == "RQ1-math") & (pl.col("backbone") == "eagle3"))
        assert e3_rq1.height and set(e3_rq1["family"]) == {"exploratory"} and e3_rq1["verdict"][0] == "holds"
    alone = check_claims(e2, None, None, grid=grid2)
    assert _rows(alone, "eagle3").is_empty()  # no row at all without eagle3
    both = cl.filter(pl.col("family") == "study")
    assert both["family_size"][0] == alone.filter(pl.col("family") == "study")["family_size"][0]
    assert _rows(cl, "RQ1-math").filter(pl.col("backbone") == "eagle2")["p_holm"][0] == \
        _rows(alone, "RQ1-math")["p_holm"][0]
