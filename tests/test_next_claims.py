"""The checks of the study's proposed next experiments (switching, depth-adaptive composition),
each driven to holds / does not hold / inconclusive on synthetic per-prompt frames; the prompt is
the bootstrap unit, the 10-prompt rule applies per benchmark, and Holm counts them."""
from __future__ import annotations

import polars as pl
import pytest

from orchestrator.report.claims import check_claims
from orchestrator.report.claims.project import BASE
from orchestrator.report.routers import PROMPT_NODE

N = 12
NOISE = [0.1 * ((-1) ** i) * (i % 3) for i in range(N)]
BENCHES = ("gsm8k", "mt_bench")
SW, DA, MB = "switching(k=2)", "depth_adaptive(d=2)", "merged@16"


def _pp(cells, n=N, wall=None, invocation=None):
    """Per-prompt rows from {method: tau or (tau, noise shift)} on both benchmarks; 20 calls each."""
    rows = []
    for method, spec in cells.items():
        tau, k = spec if isinstance(spec, tuple) else (spec, 0)
        for bench in BENCHES:
            for i in range(n):
                tok = int(round((tau + NOISE[(i + k) % N]) * 20))
                rows.append({"backbone": "hass", "method": method, "benchmark": bench, "temperature": 0.0,
                             "prompt_id": f"p{i}", "new_tokens": tok, "verifier_calls": 20,
                             "routing_choice": -1,
                             "out_tokens": tok + 1, "wall_time_s": (wall or {}).get(method, 1.0),
                             "invocation": (invocation or {}).get(method, "A")})
    return pl.DataFrame(rows)


def _rows(cl, claim):
    return cl.filter(pl.col("claim") == claim)


def test_base_router_is_the_studys_text_router():
    assert BASE == PROMPT_NODE == "confidence(prompt, node)"


@pytest.mark.parametrize("tau,expected", [(3.0, "holds"), (2.0, "does not hold"), ((2.5, 3), "inconclusive")])
def test_switching_beats_confidence_routing(tau, expected):
    cl = check_claims(_pp({BASE: 2.5, SW: tau, "switching(k=2, to merged)": tau}), None, None)
    r = _rows(cl, "switching")
    assert r.height == 2 and set(r["verdict"]) == {expected}
    assert r["comparison"][0] == f"{SW} - {BASE}, tau gain, average" and r["prompts"][0] == N
    assert "verdict_holm" in cl.columns and "proposes" in r["study"][0] and r["study_consistent"][0] is None


def test_switching_needs_ten_prompts_per_benchmark():
    r = _rows(check_claims(_pp({BASE: 2.5, SW: 3.0}, n=6), None, None), "switching").row(0, named=True)
    assert r["verdict"] == "inconclusive (n=6 < 10 prompts)" and r["estimate"] == pytest.approx(0.5)


@pytest.mark.parametrize("wall,inv,expected", [
    ({SW: 1.0, BASE: 1.5}, None, "holds"), ({SW: 1.5, BASE: 1.0}, None, "does not hold"),
    ({SW: 1.0, BASE: 1.0}, None, "inconclusive"),
    ({SW: 1.0, BASE: 1.5}, {SW: "B"}, "inconclusive (timed in different grid invocations)")])
def test_switching_wall_clock_cost(wall, inv, expected):
    cl = check_claims(_pp({BASE: (2.5, 0), SW: (2.5, 5)}, wall=wall, invocation=inv), None, None)
    r = _rows(cl, "switching-speed").row(0, named=True)
    assert r["verdict"] == expected and "tokens/s" in r["comparison"]


@pytest.mark.parametrize("da,expected", [(3.0, "holds"), (2.0, "does not hold"), ((2.5, 4), "inconclusive")])
def test_depth_adaptive_beats_budget_matched_merged_and_confidence_routing(da, expected):
    cl = check_claims(_pp({BASE: (2.5, 1), MB: (2.5, 2), "merged": 9.0, DA: da}), None, None)
    m, r = _rows(cl, "depth-adaptive-merged"), _rows(cl, "depth-adaptive-routing")
    assert m.height == 1 and m["verdict"][0] == expected and m["comparison"][0] == f"{DA} - {MB}, average"
    assert r.height == 1 and r["verdict"][0] == expected and BASE in r["comparison"][0]
    # without a budget-matched merged cell the claim says what it needs
    none = _rows(check_claims(_pp({BASE: 2.5, DA: 3.0}), None, None), "depth-adaptive-merged")
    assert "not in this run" in none["verdict"][0] and "budget-matched" in none["verdict"][0]


def _early_steps(early_of, whole_of):
    """BASE traces: 4 calls per prompt on turn 0, each committing early_of(i) tokens; the prompt's
    whole tau (from its per-prompt row) is whole_of(i). Returns (per-prompt frame, step frame)."""
    pp, steps = [], []
    for bench in BENCHES:
        for i in range(N):
            pp.append({"backbone": "hass", "method": BASE, "benchmark": bench, "temperature": 0.0,
                       "prompt_id": f"p{i}", "new_tokens": int(round(whole_of(i) * 10)), "verifier_calls": 10,
                       "routing_choice": 0, "out_tokens": 1, "wall_time_s": 1.0, "invocation": "A"})
            steps += [{"backbone": "hass", "method": BASE, "benchmark": bench, "temperature": 0.0,
                       "strategy": "confidence", "prompt_id": f"p{i}", "turn": 0, "step": s,
                       "committed": early_of(i) if s < 3 else 1,
                       "depth_accept": [True], "accepted_draft_entropy": [0.5], "rejected_draft_entropy": 1.0}
                      for s in range(4)]
    sw = [r | {"method": SW} for r in pp]
    return pl.DataFrame(pp + sw), pl.DataFrame(steps)


ZERO = {1, 4, 5, 8, 9, 12}  # a 0/1 pattern with exactly zero covariance with 1..12


@pytest.mark.parametrize("whole_of,expected", [
    (lambda i: 1.0 + 0.2 * (i + 1) + (0.1 if i % 2 else 0.0), "holds"),
    (lambda i: 4.0 - 0.2 * (i + 1), "does not hold"),
    (lambda i: 2.0 + (1.0 if i + 1 in ZERO else 0.0), "inconclusive")])
def test_early_acceptance_predicts_the_whole_generation(whole_of, expected):
    pp, steps = _early_steps(lambda i: i + 1, whole_of)
    r = _rows(check_claims(pp, steps, None), "switching-early").row(0, named=True)
    assert r["verdict"] == expected and r["prompts"] == N and "Pearson r" in r["comparison"]
    if expected == "inconclusive":
        assert r["estimate"] == pytest.approx(0.0, abs=1e-9)
    else:
        assert abs(r["estimate"]) > 0.9


# ---------------------------------------------------------------- hedge, the online router
# (claims/project.py)
HEDGE = "hedge(step)"


@pytest.mark.parametrize("tau,expected", [(3.0, "holds"), (2.0, "does not hold"), ((2.5, 3), "inconclusive")])
def test_hedge_is_compared_with_the_home_specialist_per_benchmark_the_post_hoc_router_and_merged(tau,
        expected):
    """hedge against the matched specialist on each benchmark (math on gsm8k, chat on mt_bench), against
    TAPS's post hoc router and against merged trees on average, and in tokens/s against merged:
    exploratory rows, Holm-adjusted with the project's own claims."""
    from orchestrator.report.routers import POSTHOC

    cells = {HEDGE: tau, "math": 2.5, "chat": 2.5, POSTHOC: 2.5, "merged": 2.5}
    wall = {HEDGE: {3.0: 0.5, 2.0: 2.0}.get(tau, 1.0) if not isinstance(tau, tuple) else 1.0, "merged": 1.0}
    cl = check_claims(_pp(cells, wall=wall), None, None)
    home = _rows(cl, "hedge-home")
    assert home.height == 2 and set(home["verdict"]) == {expected}, home
    assert sorted(home["comparison"]) == [f"{HEDGE} - chat (matched specialist) on mt_bench (tau)",
                                          f"{HEDGE} - math (matched specialist) on gsm8k (tau)"]
    for claim, what in (("hedge-posthoc", f"{HEDGE} - {POSTHOC}, average (tau)"),
                        ("hedge-merged", f"{HEDGE} - merged, average (tau)"),
                        ("hedge-speed", f"{HEDGE} - merged, tokens/s, average")):
        (r,) = _rows(cl, claim).iter_rows(named=True)
        assert r["comparison"] == what and r["verdict"] == expected and r["family"] == "exploratory", r
        assert r["verdict_holm"] in (expected, "inconclusive (Holm)") and "own online router" in r["study"]


NH, UCB = "hedge(normalhedge, acceptance, ties=stay)", "hedge(ucb, bandit, ties=stay)"


@pytest.mark.parametrize("tau,expected", [(3.0, "holds"), (2.0, "does not hold")])
def test_hedge_is_compared_with_the_bandit_and_the_hindsight_oracle(tau, expected):
    """Each full-information learner against the bandit (UCB) and against the hindsight oracle; the
    bandit is not compared with itself; at T=1 the oracle's rows carry ‡ (it picks between samples)."""
    from orchestrator.report.routers import LOSSY_MARK, ORACLE

    pp = _pp({NH: tau, UCB: 2.5, ORACLE: 2.5, "math": 2.5, "chat": 2.5})
    cl = check_claims(pp, None, None)
    (r,) = _rows(cl, "hedge-bandit").iter_rows(named=True)
    assert r["comparison"] == f"{NH} - {UCB}, average (tau)" and r["verdict"] == expected
    oracle = _rows(cl, "hedge-oracle")
    assert sorted(oracle["comparison"]) == [f"{NH} - {ORACLE}, average (tau)",
                                            f"{UCB} - {ORACLE}, average (tau)"]
    hot = _rows(check_claims(pp.with_columns(pl.lit(1.0).alias("temperature")), None, None), "hedge-oracle")
    assert all(c.endswith(f"{ORACLE} {LOSSY_MARK}, average (tau)")
               for c in hot["comparison"]), hot["comparison"]


def test_the_hindsight_oracle_keeps_each_prompts_better_specialist_and_pays_both():
    from orchestrator.report.routers import ORACLE, oracle_rows, with_posthoc

    pp = _pp({"math": (2.5, 0), "chat": (2.5, 1), HEDGE: 2.5}).with_columns(
        pl.col("method").alias("drafter"),
        pl.when(pl.col("method") == HEDGE).then(pl.lit("hedge")).otherwise(pl.lit("single"))
        .alias("strategy"))
    rows = oracle_rows(pp)
    assert rows.height == 2 * N and set(rows["method"]) == {ORACLE} and set(rows["strategy"]) == {"oracle"}
    wide = pp.pivot(on="method", index=["benchmark", "prompt_id"], values="new_tokens")
    best = wide.select("benchmark", "prompt_id", pl.max_horizontal("math", "chat").alias("best"))
    got = rows.join(best, on=["benchmark", "prompt_id"])
    assert (got["new_tokens"] == got["best"]).all() and (rows["wall_time_s"] == 2.0).all()
    assert set(rows["routing_choice"]) == {0, 1}
    assert ORACLE in set(with_posthoc(pp, None)["method"])  # a run with hedge cells gets it
    assert ORACLE not in set(with_posthoc(pp.filter(pl.col("strategy") != "hedge"), None)["method"])


def test_every_t1_verdict_row_on_the_post_hoc_router_carries_the_lossy_mark():
    """RQ3a, RQ3b, merged-best and hedge-posthoc at T=1 compare with the post hoc router, which picks
    between finished samples: the comparison carries ‡, the verdict table and the summary grid say
    what it means; at T=0 nothing is marked."""
    from orchestrator.report.routers import LOSSY_MARK, NOT_LOSSLESS, POSTHOC
    from orchestrator.report.summary import claims_grid
    from orchestrator.report.verdicts import verdict_table

    pp = _pp({POSTHOC: 2.7, "merged": 2.8, "math": 2.5, "chat": 2.3, HEDGE: 2.5})
    for temp in (0.0, 1.0):
        cl = check_claims(pp.with_columns(pl.lit(temp).alias("temperature")), None, None)
        on = cl.filter(pl.col("comparison").str.contains(POSTHOC, literal=True))
        assert set(on["claim"]) >= {"RQ3a", "RQ3b", "merged-best", "hedge-posthoc"}, set(on["claim"])
        marked = [LOSSY_MARK in c for c in on["comparison"]]
        assert all(marked) if temp else not any(marked), on["comparison"].to_list()
        assert (NOT_LOSSLESS in verdict_table(cl)) == bool(temp)
        grid = claims_grid(cl.filter(pl.col("claim") == "RQ3a"))
        assert grid[f"hass T={temp:g}"][0].endswith(LOSSY_MARK) == bool(temp)


def test_hedge_claims_are_listed_as_not_run_without_hedge_cells():
    cl = check_claims(_pp({"math": 2.5, "chat": 2.5}), None, None)
    for claim in ("hedge-home", "hedge-posthoc", "hedge-merged", "hedge-speed"):
        (r,) = _rows(cl, claim).iter_rows(named=True)
        assert r["verdict"].startswith("inconclusive (not in this run: needs hedge"), r


def test_the_summary_grid_says_why_a_verdict_is_inconclusive_when_its_interval_excludes_zero():
    """`+0.50 [+0.45, +0.55] inconclusive` alone would read as a contradiction: the grid shows the reason
    (too few prompts) beside it; a multi-row cell counts such rows and names the reason."""
    from orchestrator.report.summary import claims_grid

    cl = check_claims(_pp({BASE: 2.5, SW: 3.0, "math": 2.0, "chat": 3.0}, n=6), None, None)
    grid = claims_grid(cl.filter(pl.col("claim").is_in(["switching", "RQ1-math", "RQ1-chat"])))
    cells = dict(zip(grid["claim"], grid["hass T=0"]))
    assert cells["switching"].endswith("inconclusive (n=6 < 10 prompts)"), cells
    assert cells["RQ1-chat"].endswith("inconclusive (n=6 < 10 prompts)"), cells  # one benchmark: one row
    wide = check_claims(_pp({"math": 2.0, "chat": 3.0, "mixed_full": 3.5}, n=6), None, None)
    rq2 = claims_grid(wide.filter(pl.col("claim") == "RQ2"))["hass T=0"][0]  # one row per benchmark
    assert rq2 == "inconclusive 2/2; 2 inconclusive with an interval excluding 0 (n < 10 prompts)", rq2


def test_the_verdict_table_has_one_row_per_comparison_with_its_interval_and_both_verdicts(tmp_path):
    """experiments/verdicts.py: from a report's tables/claims.csv, every checked comparison with its
    estimate [95% CI], the raw and the Holm verdict (with the reason) and the study's statement; the
    claims the run could not check listed with what they need; a run without a report: one error."""
    import subprocess
    import sys
    from pathlib import Path

    from orchestrator.report.verdicts import verdict_table

    cl = check_claims(_pp({BASE: 2.5, SW: 3.0, "math": 2.0, "chat": 3.0}, n=6), None, None)
    (tmp_path / "report/tables").mkdir(parents=True)
    cl.write_csv(tmp_path / "report/tables/claims.csv")
    root = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, str(root / "experiments/verdicts.py"), "--run", str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("study: ") and r.stdout.endswith(verdict_table(cl))
    row = next(x for x in r.stdout.splitlines() if x.startswith("| switching | exploratory | hass | 0 |"))
    assert "| 6 | +0.50 [+0.50, +0.50] | inconclusive (n=6 < 10 prompts) | same |" in row, row
    assert "acceptance-history switching beats confidence routing" in row
    assert "- `hedge-merged` (hass T=0): needs hedge and merged" in r.stdout
    ran = cl.filter(~pl.col("verdict").str.contains("not in this run", literal=True)).height
    assert sum(x.startswith("| ") for x in r.stdout.splitlines()) == ran + 1  # + the header
    bad = subprocess.run([sys.executable, str(root / "experiments/verdicts.py"), "--run",
                          str(tmp_path / "none")],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.startswith("error: ")
    assert "claims.csv does not exist" in bad.stderr
