"""Issue 64 item 4: the study's average weighted as the study weights it (1 chat : 3 math) and the best
single checkpoint each weighting picks, the universal claims checked per checkpoint and benchmark inside
the study's Holm family, and the study's statements the RQ claims did not check, each driven to holds
and to does not hold on small synthetic frames (tests/test_claims.py's helpers)."""
from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from orchestrator.report.claims import Grid, check_claims, family_size
from orchestrator.report.claims.claim import EQUAL_W, STUDY_W, weights
from orchestrator.report.labels import HEADS, ROUTED
from orchestrator.report.stats import paired_avg_diff_ci
from tests.test_claims import N, _pp, _rows, _steps, _words

SPEC = {("math", "gsm8k"): 3.0, ("chat", "gsm8k"): 2.0, ("math", "mt_bench"): 1.5, ("chat", "mt_bench"): 2.5}


def test_the_study_weights_one_chat_to_three_math_benchmarks():
    assert weights(["gsm8k", "mt_bench"]) == [0.75, 0.25]
    assert weights(["gsm8k", "math500", "mt_bench", "svamp"]) == [0.25] * 4  # the study's own plain mean
    assert weights(["gsm8k", "mt_bench"], EQUAL_W) == [0.5, 0.5] and weights(["gsm8k", "svamp"]) == [0.5, 0.5]
    rng = np.random.default_rng(0)
    groups = [tuple(rng.integers(20, 60, 12).astype(float) for _ in range(4)) for _ in range(2)]
    plain = paired_avg_diff_ci(groups, p=True)
    assert paired_avg_diff_ci(groups, p=True, weights=[0.5, 0.5]) == plain  # equal weights: drawn as before
    est = paired_avg_diff_ci(groups, p=True, weights=[0.75, 0.25])[0]
    per = [g[0].sum() / g[1].sum() - g[2].sum() / g[3].sum() for g in groups]
    assert est == pytest.approx(0.75 * per[0] + 0.25 * per[1]) and est != pytest.approx(plain[0])


def test_each_weighting_picks_its_own_best_single_and_the_row_names_both():
    """math 2.625 vs chat 2.45 by 1 : 3 (math best); 2.25 vs 2.5 equally weighted (chat best)."""
    cells = {("math", "gsm8k"): (3.0, 1), ("math", "mt_bench"): (1.5, 1), ("chat", "gsm8k"): (2.4, 2),
             ("chat", "mt_bench"): (2.6, 2)} | {(ROUTED, b): (2.55, 3) for b in ("gsm8k", "mt_bench")}
    study = _rows(check_claims(_pp(cells), None, None), "RQ3b").row(0, named=True)
    assert study["comparison"].startswith(f"{ROUTED} - best single (math; equal per benchmark's best: chat)")
    assert study["comparison"].endswith(f"average ({STUDY_W})") and study["verdict"] == "does not hold"
    assert study["estimate"] == pytest.approx(2.55 - 2.625, abs=0.03)
    equal = _rows(check_claims(_pp(cells), None, None, weighting=EQUAL_W), "RQ3b").row(0, named=True)
    assert equal["comparison"].startswith(f"{ROUTED} - best single (chat; 1 chat : 3 math's best: math)")
    assert equal["estimate"] == pytest.approx(2.55 - 2.5, abs=0.03)


def test_universal_claims_have_one_row_per_checkpoint_and_benchmark_in_the_study_family():
    """entropy and RQ5 on two checkpoints x two benchmarks: four rows each, every one a study-family
    hypothesis; the family's size is the grid's (4 single checkpoints x 2 benchmarks for entropy, 5 x 2
    for RQ5), whatever the run produced, so Holm is over the whole family."""
    steps = []
    for m in ("math", "chat"):
        for b in ("gsm8k", "mt_bench"):
            steps += _steps(m, b, lambda i: 2, 3, rej=1.5 if (m, b) != ("chat", "gsm8k") else 0.2)
    grid = Grid(("hass",), (0.0,), ("gsm8k", "mt_bench"))
    cl = check_claims(_pp(SPEC), pl.DataFrame(steps), None, grid=grid)
    for claim in ("entropy", "RQ5"):
        rows = _rows(cl, claim)
        assert rows.height == 4 and set(rows["family"]) == {"study"}
        assert set(rows["benchmark"]) == {"gsm8k", "mt_bench"}
    assert _words(cl, "entropy", "chat drafter on gsm8k") == ["does not hold"]
    assert _words(cl, "entropy", "math drafter on mt_bench") == ["holds"]
    size = cl.filter(pl.col("family") == "study")["family_size"][0]
    assert size == family_size(grid) == family_size(grid, cl)
    r = _rows(cl, "entropy", "math drafter on gsm8k").row(0, named=True)
    assert r["p_holm"] == pytest.approx(min(1.0, size * r["p_value"]))  # the family's smallest p, x its size


@pytest.mark.parametrize("chat_gsm,expected", [(2.0, "holds"), (2.9, "does not hold")])
def test_mismatch_penalty_is_in_the_studys_range(chat_gsm, expected):
    """1 - 2.0/3.0 = 33% lost off-domain (inside 19-46%); 1 - 2.9/3.0 = 3% (below it)."""
    cells = dict(SPEC) | {("chat", "gsm8k"): (chat_gsm, 2)}
    r = _rows(check_claims(_pp(cells), None, None), "RQ1-penalty", "on gsm8k").row(0, named=True)
    assert r["verdict"] == expected and r["family"] == "exploratory" and r["prompts"] == N
    assert r["estimate"] == pytest.approx(1 - chat_gsm / 3.0, abs=0.02)


@pytest.mark.parametrize("t1,expected", [((2.5, 2.3), "holds"), ((3.5, 1.5), "does not hold")])
def test_specialisation_narrows_at_t1(t1, expected):
    """math - chat on gsm8k: +1.0 at T=0, then +0.2 (narrower: holds) or +2.0 (wider) at T=1."""
    frames = [_pp({("math", "gsm8k"): (3.0, 1), ("chat", "gsm8k"): (2.0, 2)}, temp=0.0),
              _pp({("math", "gsm8k"): (t1[0], 3), ("chat", "gsm8k"): (t1[1], 4)}, temp=1.0)]
    cl = check_claims(pl.concat(frames), None, None)
    rows = _rows(cl, "RQ1-narrows")
    r = rows.filter(pl.col("temperature") == 1.0).row(0, named=True)
    assert r["verdict"] == expected and r["family"] == "study" and r["benchmark"] == "gsm8k"
    assert r["estimate"] == pytest.approx(1.0 - (t1[0] - t1[1]), abs=0.05)
    assert rows.filter(pl.col("temperature") == 0.0).is_empty()  # a T=1 claim


@pytest.mark.parametrize("full,expected", [(3.4, ["holds"]), (1.0, ["does not hold"])])
def test_mixed_70k_above_both_specialists_on_average_at_t0(full, expected):
    cells = dict(SPEC) | {("mixed_full", b): (full, 5) for b in ("gsm8k", "mt_bench")}
    rows = _rows(check_claims(_pp(cells), None, None), "RQ2-full-above")
    assert rows.height == 2 and sorted(set(rows["verdict"])) == expected
    assert {c.split(",")[0] for c in rows["comparison"]} == {"mixed_full - math", "mixed_full - chat"}


@pytest.mark.parametrize("ratio,expected", [(0.96, "holds"), (1.4, "does not hold")])
def test_entropy_routing_lands_near_the_specialists_mean(ratio, expected):
    """The specialists' mean is 2.5 on gsm8k and 2.0 on mt_bench; entropy routing at 0.96 of it is within
    10%, at 1.4 times it is not."""
    cells = dict(SPEC) | {(HEADS, "gsm8k"): (2.5 * ratio, 6), (HEADS, "mt_bench"): (2.0 * ratio, 6)}
    r = _rows(check_claims(_pp(cells), None, None), "entropy-routing-mean").row(0, named=True)
    assert r["verdict"] == expected and HEADS in r["comparison"]
    assert r["estimate"] == pytest.approx(ratio - 1, abs=0.02)


@pytest.mark.parametrize("hass,expected", [(0.3, "holds"), (-0.3, "does not hold")])
def test_hass_above_eagle2(hass, expected):
    frames = [_pp({k: (v + (hass if bb == "hass" else 0.0), i) for i, (k, v) in enumerate(SPEC.items())},
                  backbone=bb) for bb in ("hass", "eagle2")]
    r = _rows(check_claims(pl.concat(frames), None, None), "hass-above-eagle2").row(0, named=True)
    assert r["verdict"] == expected and r["backbone"] == "hass+eagle2" and r["family"] == "study"
    assert r["estimate"] == pytest.approx(hass, abs=0.05) and "mean over math, chat" in r["comparison"]


@pytest.mark.parametrize("k_avg,expected", [(lambda i: 2, "holds"), (lambda i: 10, "does not hold")])
def test_the_averaged_drafter_collapses_with_depth(k_avg, expected):
    """The math specialist accepts 8-i%3 of 10 at depth 3; the averaged drafter 2 (collapse) or 10 of 10."""
    steps = pl.DataFrame(_steps("math", "gsm8k", lambda i: 8 - i % 3, 3)
                         + _steps("avg0.5", "gsm8k", k_avg, 3))
    cl = check_claims(_pp({("math", "gsm8k"): 3.0, ("avg0.5", "gsm8k"): 1.0}), steps, None)
    assert _words(cl, "avg-collapse") == [expected]
    assert "gsm8k:3" in _rows(cl, "avg-collapse")["comparison"][0]


@pytest.mark.parametrize("rej,expected", [(0.2, "holds"), (1.5, "does not hold")])
def test_hass_averaged_checkpoint_has_lower_entropy_at_rejected_tokens(rej, expected):
    """Table 4's exception: HASS's averaged checkpoint, rejected - accepted (0.5) draft entropy below 0."""
    steps = _steps("avg0.5", "gsm8k", lambda i: 5, 2, rej=lambda i: rej + 0.01 * i)
    cl = check_claims(_pp({("avg0.5", "gsm8k"): 2.0}), pl.DataFrame(steps), None)
    r = _rows(cl, "entropy-averaged").row(0, named=True)
    assert r["verdict"] == expected and "-0.5364" in r["study"]
    e2 = check_claims(_pp({("avg0.5", "gsm8k"): 2.0}, backbone="eagle2"),
                      pl.DataFrame(_steps("avg0.5", "gsm8k", lambda i: 5, 2, backbone="eagle2")), None)
    assert _rows(e2, "entropy-averaged").is_empty()  # the study's negatives are HASS's


def test_the_reports_averages_weight_benchmarks_as_the_claims_do():
    """Table 1's `average` columns, the summary's τ table, the λ table and study_vs_ours' "average" are
    means over benchmarks at 1 chat : 3 math (the study's Table 1 average), the weighting the claims use."""
    import polars as pl

    from orchestrator.report.study_tables import study_comparison
    from orchestrator.report.summary import _tau_by_column
    from orchestrator.report.tables import table1_wide

    tau = [2.0, 1.0, 1.2, 1.6]
    t1 = pl.DataFrame({"backbone": ["eagle2"] * 4, "method": ["math", "math", "chat", "chat"],
                       "benchmark": ["gsm8k", "mt_bench"] * 2, "temperature": [0.0] * 4, "tau": tau,
                       "tau_lo": [x - 0.1 for x in tau], "tau_hi": [x + 0.1 for x in tau],
                       "tau_taps": [x + 0.2 for x in tau], "tau_study": [x - 1 for x in tau],
                       "prompts": [10] * 4})
    avg = dict(table1_wide(t1, "eagle2", 0.0).select("method", "average").iter_rows())
    assert avg == {"math": 1.75, "chat": 1.3}  # 0.75 * 2.0 + 0.25 * 1.0 (a plain mean: 1.5 and 1.4)
    wide, _ = _tau_by_column(t1)
    assert wide["method"].to_list() == ["math", "chat"] and wide["eagle2 T=0"][0].startswith("1.75")
    ours = study_comparison(t1).filter((pl.col("method") == "math") & (pl.col("benchmark") == "average")
                                       & (pl.col("temperature") == 0.0) & (pl.col("backbone") == "eagle2"))
    assert ours["our_tau"].to_list() and ours["our_tau"][0] == pytest.approx(1.75)
