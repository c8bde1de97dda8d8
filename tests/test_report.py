"""The report on synthetic traces whose every number is known in advance, and on broken runs."""
from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from decoding.runner import write_parquet_atomic
from orchestrator.report.build import build_report
from orchestrator.report.stats import paired_diff_ci, ratio_ci, verdict
from orchestrator.report.tables import per_prompt, table1

TAU = {("math", "gsm8k"): 3.0, ("chat", "gsm8k"): 2.0, ("math", "mt_bench"): 1.5, ("chat", "mt_bench"): 2.5,
       ("autoregressive", "gsm8k"): 1.0, ("autoregressive", "mt_bench"): 1.0}
N_PROMPTS = 10


def _prompt_rows(method, bench, with_generate=True):
    tau = TAU[(method, bench)]
    calls = 20
    strategy = "autoregressive" if method == "autoregressive" else "single"
    wall = calls * 0.1  # every call takes 0.1 s: tokens/s = (new + 1) / wall
    return [{"prompt_id": f"{bench}/{i}", "turn": 0, "output_token_ids": list(range(int(tau * calls) + 1)),
             "output_text": "x",
             "verifier_calls": calls, "new_tokens": int(tau * calls), "acceptance_length": tau,
             "wall_time_s": wall,
             "mean_tree_size": 0.0 if strategy == "autoregressive" else 15.0, "routing_choice": -1,
             "t_draft_s": 0.0,
             "t_verify_s": wall, "drafter": "-" if strategy == "autoregressive" else method,
             "strategy": strategy,
             "routing_granularity": "step", "merge_dedup": False, "total_tokens": 16, "budget_matched": False,
             "cell_key": f"{method}-{bench}", "unit_key": f"{method}-{bench}",
             # the autoregressive cell times transformers' generate: 21 tokens in 1 s per prompt
             **({"generate_tokens": 21, "generate_wall_time_s": 1.0, "generate_matches": True}
                if with_generate and strategy == "autoregressive" else {})} for i in range(N_PROMPTS)]


def _step_rows(method, bench):
    return [{"prompt_id": f"{bench}/{i}", "turn": 0, "step": 0, "tree_size": 15, "committed": 3,
             "accepted_depth": 2,
             "chosen_drafter": 0, "accepted_owner": 0, "accepted_owner_mask": 1,
             "drafter_mean_confidence": [0.5],
             "drafter_mean_entropy": [1.0], "accepted_draft_entropy": [0.5, 0.5],
             "accepted_verifier_entropy": [0.2, 0.2],
             "rejected_draft_entropy": 1.5, "rejected_verifier_entropy": 0.7, "depth_accept": [True, True,
                     False],
             "t_draft_s": 0.0, "t_verify_s": 0.1, "t_bookkeeping_s": 0.0, "drafter": method,
             "strategy": "single",
             "routing_granularity": "step", "merge_dedup": False, "total_tokens": 16, "budget_matched": False,
             "cell_key": f"{method}-{bench}", "unit_key": f"{method}-{bench}"} for i in range(N_PROMPTS)]


def _make_run(root: Path, with_steps=True, benchmarks=("gsm8k", "mt_bench"), failed=False,
              with_generate=True):
    done = {}
    for (method, bench) in TAU:
        if bench not in benchmarks:
            continue
        bb = "none" if method == "autoregressive" else "hass"
        part = f"backbone={bb}/benchmark={bench}/temperature=0"
        files = [f"traces/prompts/{part}/{method}.parquet"] + ([f"traces/steps/{part}/{method}.parquet"]
                                                               if with_steps and method != "autoregressive"
                                                               else [])
        done[f"eval-{method}-{bench}"] = {"stage": "eval", "name": f"{method}|{bench}", "status": "done",
                                          "files": files}
        rows = _prompt_rows(method, bench, with_generate)
        if not with_generate:  # an old run: no generate timings, and the prompt column was still called "id"
            rows = [{("id" if k == "prompt_id" else k): v for k, v in r.items()} for r in rows]
        write_parquet_atomic(rows, root / "traces/prompts" / part / f"{method}.parquet")
        if with_steps and method != "autoregressive":
            write_parquet_atomic(_step_rows(method, bench),
                                 root / "traces/steps" / part / f"{method}.parquet")
    cells = dict(done)
    if failed:
        cells["k1"] = {"stage": "eval", "name": "hass:single:math|svamp|T=0", "status": "failed",
                       "attempts": 3,
                       "error": "RayActorError: worker died", "files": []}
    (root / "manifest.json").write_text(json.dumps({"cells": cells}))
    (root / "profile.json").write_text(json.dumps({"eval": {"benchmarks": {"gsm8k": 10, "mt_bench": 10,
            "svamp": 10}}}))
    return root


def test_stats_exact_on_known_inputs():
    p, lo, hi = ratio_ci([30] * 5, [10] * 5)
    assert (p, lo, hi) == (3.0, 3.0, 3.0)
    d, lo, hi = paired_diff_ci([30] * 5, [10] * 5, [20] * 5, [10] * 5)
    assert (d, lo, hi) == (1.0, 1.0, 1.0)
    assert verdict(0.1, 0.5) == "holds" and verdict(-0.5, -0.1) == "does not hold" and verdict(-0.1,
            0.2) == "inconclusive"
    # a real interval: the ratio CI covers the point and is not degenerate
    p, lo, hi = ratio_ci([1, 2, 3, 4, 10], [1, 1, 1, 1, 1])
    assert lo < p < hi


def test_tables_and_claims_are_exact_on_synthetic_traces(tmp_path):
    run = _make_run(tmp_path / "run")
    build_report(run)
    t1 = pl.read_parquet(run / "report/tables/table1_acceptance.parquet")
    for (method, bench), tau in TAU.items():
        row = t1.filter((pl.col("method") == method) & (pl.col("benchmark") == bench)).row(0, named=True)
        assert row["tau"] == pytest.approx(tau)
        assert row["tau_lo"] == pytest.approx(tau) and row["tau_hi"] == pytest.approx(tau)
        assert row["prompts"] == N_PROMPTS
    sp = pl.read_parquet(run / "report/tables/speed.parquet")
    math_g = sp.filter((pl.col("method") == "math") & (pl.col("benchmark") == "gsm8k")).row(0, named=True)
    assert math_g["tokens_per_s"] == pytest.approx(61 / 2.0)
    assert math_g["speedup"] == pytest.approx(61 / 2.0 / 21)
    assert math_g["vs_autoregressive"] == pytest.approx(61 / 21)
    assert math_g["baseline"] == "generate (transformers)"
    gen = sp.filter((pl.col("method") == "generate (transformers)") & (pl.col("benchmark") == "gsm8k")).row(0,
            named=True)
    assert gen["tokens_per_s"] == pytest.approx(21.0) and gen["speedup"] == pytest.approx(1.0)
    assert math_g["calls_per_token"] == pytest.approx(20 / 61)
    assert math_g["mean_tree_size"] == pytest.approx(15.0)
    ent = pl.read_parquet(run / "report/tables/table3_4_entropy.parquet")
    assert ent["draft_diff"].to_list() == pytest.approx([1.0] * ent.height)
    dep = pl.read_parquet(run / "report/tables/table5_8_depth.parquet").filter(pl.col("method") == "math")
    rates = dep.group_by("depth").agg(pl.col("accept_rate").mean()).sort("depth")["accept_rate"].to_list()
    assert rates == [1.0, 1.0, 0.0]
    claims = pl.read_parquet(run / "report/tables/claims.parquet")
    v = {(r["claim"], r["comparison"]): r for r in claims.iter_rows(named=True)}
    rq1m = v[("RQ1-math", "math - chat specialist on gsm8k (tau)")]
    rq1c = v[("RQ1-chat", "chat - math specialist on mt_bench (tau)")]
    assert rq1m["estimate"] == pytest.approx(1.0) and rq1m["verdict"] == "holds"
    assert rq1c["estimate"] == pytest.approx(1.0) and rq1c["verdict"] == "holds"
    assert rq1m["verdict_holm"] == "holds"
    assert rq1m["study"] == "Table 1 (hass, T=0, gsm8k): MathInstruct 70k 5.02 vs ShareGPT 70k 4.09"
    csv = pl.read_csv(run / "report/tables/claims.csv")
    assert {"verdict", "verdict_holm", "p_value", "p_holm", "study", "study_consistent",
            "wording"} <= set(csv.columns)
    assert set(csv["claim"]) >= {"RQ2-reversal", "Fig6", "merged-best", "backbones", "depth-slope", "speed"}
    ent_claim = [r for r in claims.iter_rows(named=True) if r["claim"] == "entropy"][0]
    assert ent_claim["estimate"] == pytest.approx(1.0) and ent_claim["verdict"] == "holds"
    md = (run / "report/report.md").read_text()
    assert "Table 1" in md and "holds" in md and (run / "report/report.html").is_file()
    assert any(p.suffix == ".png" for p in (run / "report").iterdir())


def test_partial_runs_say_what_is_missing(tmp_path):
    run = _make_run(tmp_path / "run", with_steps=False, benchmarks=("gsm8k",), failed=True,
                    with_generate=False)
    build_report(run)
    sp = pl.read_parquet(run / "report/tables/speed.parquet")  # traces without generate timings: the own loop
    assert set(sp["baseline"]) == {"autoregressive"}
    t1 = pl.read_parquet(run / "report/tables/table1_acceptance.parquet")  # old "id" column read as prompt_id
    assert set(t1["prompts"]) == {N_PROMPTS}
    md = (run / "report/report.md").read_text()
    assert "FAILED eval: `hass:single:math|svamp|T=0`" in md
    assert "benchmark `mt_bench` has no rows" in md and "benchmark `svamp` has no rows" in md
    empty = tmp_path / "empty"
    empty.mkdir()
    build_report(empty)
    assert "No prompt traces found" in (empty / "report/report.md").read_text()


def test_only_manifest_recorded_traces_are_read(tmp_path):
    """A rerun with changed settings into the same directory leaves the old files behind; the
    manifest records only the new ones, so no row is counted twice and the old ones are listed."""
    run = _make_run(tmp_path / "run")
    part = "backbone=hass/benchmark=gsm8k/temperature=0"
    stale = _prompt_rows("math", "gsm8k")
    for r in stale:
        r["new_tokens"] = 0  # an old configuration with a different outcome
    write_parquet_atomic(stale, run / "traces/prompts" / part / "old-math.parquet")
    build_report(run)
    t1 = pl.read_parquet(run / "report/tables/table1_acceptance.parquet")
    row = t1.filter((pl.col("method") == "math") & (pl.col("benchmark") == "gsm8k")).row(0, named=True)
    assert row["prompts"] == N_PROMPTS and row["tau"] == pytest.approx(TAU[("math", "gsm8k")])
    md = (run / "report/report.md").read_text()
    assert "not recorded by the manifest" in md and "old-math.parquet" in md


def test_units_of_an_earlier_configuration_are_not_read(tmp_path):
    """A rerun that retrains a drafter (e.g. ``--set`` more epochs) gives its cells new eval keys; the
    old units stay recorded done in the manifest, files and all. Only the units the last eval stage
    planned (``Manifest.set_plan``) are read: no DuplicateRows, the new numbers, the old file listed
    as ignored, and an old configuration's failure no longer reported."""
    from orchestrator.manifest import Manifest
    from orchestrator.report.duplicates import DuplicateRows

    run = _make_run(tmp_path / "run", failed=True)
    part = "backbone=hass/benchmark=gsm8k/temperature=0"
    retrained = _prompt_rows("math", "gsm8k")
    for r in retrained:
        r["new_tokens"], r["unit_key"] = 30, "math-gsm8k-retrained"  # tau 30 / 20 calls
    write_parquet_atomic(retrained, run / "traces/prompts" / part / "math-retrained.parquet")
    man = Manifest(run / "manifest.json")
    man.record("eval-math-gsm8k-retrained", "eval", "math|gsm8k", "done",
               files=[f"traces/prompts/{part}/math-retrained.parquet"])
    with pytest.raises(DuplicateRows):  # what the report did before plans: both units read, rows twice
        build_report(run)
    plan = [k for k in man.cells("eval") if k not in ("eval-math-gsm8k", "k1")]
    man.set_plan("eval", plan)
    build_report(run)
    t1 = pl.read_parquet(run / "report/tables/table1_acceptance.parquet")
    row = t1.filter((pl.col("method") == "math") & (pl.col("benchmark") == "gsm8k")).row(0, named=True)
    assert row["prompts"] == N_PROMPTS and row["tau"] == pytest.approx(30 / 20)
    md = (run / "report/report.md").read_text()
    assert "not recorded by the manifest" in md and "math.parquet" in md
    assert "math-retrained.parquet" not in md
    assert "FAILED" not in md  # k1 failed under the earlier configuration only


def _pp(rows):
    """Per-prompt rows (the report's per_prompt frame) from (method, benchmark, [tau per prompt], choice)."""
    out = []
    for method, bench, taus, choice in rows:
        for i, tau in enumerate(taus):
            out.append({"backbone": "hass", "method": method, "benchmark": bench, "temperature": 0.0,
                        "prompt_id": f"p{i}",
                        "new_tokens": int(round(tau * 20)), "verifier_calls": 20, "routing_choice": choice})
    return pl.DataFrame(out)


def _verdict(cl, claim, contains=""):
    r = cl.filter((pl.col("claim") == claim) & pl.col("comparison").str.contains(contains, literal=True))
    assert r.height == 1, cl
    return r.row(0, named=True)


@pytest.mark.parametrize("math_tau,chat_tau,n,expected", [
    (3.0, 2.0, 12, "holds"), (2.0, 3.0, 12, "does not hold"), (2.5, 2.5, 12, "inconclusive"),
    (3.0, 2.0, 5, "inconclusive (n=5 < 10 prompts)")])
def test_rq1_reaches_every_verdict(math_tau, chat_tau, n, expected):
    from orchestrator.report.claims import check_claims

    noise = [0.1 * ((-1) ** i) * (i % 3) for i in range(n)]
    pp = _pp([("math", "gsm8k", [math_tau + e for e in noise], -1), ("chat", "gsm8k", [chat_tau - e
            for e in noise], -1)])
    assert _verdict(check_claims(pp, None, None), "RQ1-math")["verdict"] == expected


def test_rq3a_compares_merged_with_the_studys_router_and_rq4_follows_the_route_pair():
    from orchestrator.report.claims import check_claims
    from orchestrator.report.labels import ROUTED

    n = 12
    rows = [("math", b, [3.0] * n, -1) for b in ("gsm8k", "mt_bench")] + [("chat", b, [2.0] * n, -1)
            for b in ("gsm8k", "mt_bench")]
    rows += [("merged", b, [3.0 + 0.01 * i for i in range(n)], -1) for b in ("gsm8k", "mt_bench")]
    # the post hoc router is worse than merged; step and prompt routing (decoys) are better: RQ3a must use
    # ROUTED
    rows += [(ROUTED, b, [2.0 + 0.01 * i for i in range(n)], 1) for b in ("gsm8k", "mt_bench")]
    rows += [("confidence(step)", "gsm8k", [4.0 + 0.01 * i for i in range(n)], 1),
             ("confidence(step)", "mt_bench", [4.0 + 0.01 * i for i in range(n)], 0),
             ("confidence(prompt)", "gsm8k", [4.0] * n, 0), ("confidence(prompt)", "mt_bench", [4.0] * n, 1)]
    rows += [("entropy(step)", "gsm8k", [2.0] * n, 0), ("entropy(step)", "mt_bench", [2.0] * n, 0)]
    cl = check_claims(_pp(rows), None, None, route_pair=("chat", "math"))  # drafter 0 = chat, 1 = math
    r = _verdict(cl, "RQ3a")
    assert ROUTED in r["comparison"] and r["verdict"] == "holds"  # a decoy (4.0 > merged) would not hold
    # with (chat, math), choice 1 on gsm8k and 0 on mt_bench are both right: confidence 1.0 vs entropy 0.5
    r4 = _verdict(cl, "RQ4", "confidence(step)")
    assert r4["estimate"] == pytest.approx(0.5) and r4["verdict"] == "holds"


def test_study_numbers_are_data_beside_ours():
    from orchestrator.report.study_tables import STUDY_NUMBERS, study_comparison

    t1 = pl.DataFrame([{"backbone": "hass", "temperature": 0.0, "method": "math", "benchmark": "gsm8k",
                        "tau": 1.7}])
    cmp = study_comparison(t1)
    row = cmp.filter((pl.col("method") == "math") & (pl.col("benchmark") == "gsm8k")
                     & (pl.col("backbone") == "hass")).row(0, named=True)
    assert row["study_tau"] == 5.02 and row["source"] == "paper Table 1 and TAPS README"
    assert row["our_tau"] == pytest.approx(1.7)
    assert cmp.height == len(STUDY_NUMBERS)


def test_report_opens_with_a_one_screen_summary_and_an_appendix(tmp_path):
    run = _make_run(tmp_path / "run", failed=True)
    build_report(run)
    md = (run / "report/report.md").read_text()
    summary = md[md.index("## Summary"): md.index("## Claims of the study: every verdict")]
    order = [md.index(h) for h in ("## Summary", "## Claims of the study", "## Figures", "## Table 1")]
    assert order == sorted(order)
    assert len(summary.splitlines()) <= 50  # one screen
    for part in ("Acceptance length τ", "Speed against `generate (transformers)`",
                 "FAILED eval: `hass:single:math|svamp|T=0`"):
        assert part in summary, part
    assert "inconclusive" not in summary  # the inconclusive verdicts are below the first screen
    summary = md[md.index("## Summary"): md.index("## Figures")]  # with every claim's verdict
    # the shared baseline row sits in the backbone's column, ours beside TAPS's tau (20 tokens / 19 loop
    # indices)
    assert "| autoregressive | 1.0 (1.05) |" in summary
    assert "τ (ours, the headline) = tokens committed" in md and "`tau_taps` is τ as the study's code" in md
    # svamp failed: its rows have 0 prompts under the prompt rule, which is named as the project's
    assert "were paired on a benchmark (the project's rule, not the study's" in summary
    assert "(the study's rule)" not in md
    assert "Holm-Bonferroni, study family" in summary and "Not checked (no cells in this run" in summary
    assert "† RQ3b: the study's own numbers contradict" in summary  # HASS T=0: Mixed 70k+70k 5.18 > 4.80
    assert summary.count("| RQ1-math |") == 1 and "| claim | hass T=0 |" in summary  # one row per claim
    assert "Tables 5–8" not in md and "Table 2 —" not in md  # the long tables moved out
    app = (run / "report/report_appendix.md").read_text()
    for part in ("Table 2 —", "Tables 3–4", "Tables 5–8", "every cell", "The study's numbers beside ours"):
        assert part in app, part
    assert "<details>" in (run / "report/report.html").read_text()


def test_a_failure_later_redone_is_not_listed(tmp_path):
    run = _make_run(tmp_path / "run", failed=True)
    man = json.loads((run / "manifest.json").read_text())
    man["cells"]["missing-then-done"] = {"stage": "eval", "name": "hass:single:math|gsm8k|T=0",
                                         "status": "failed",
                                         "attempts": 1, "error": "missing drafter: hass-math", "files": []}
    man["cells"]["done-later"] = {"stage": "eval", "name": "hass:single:math|gsm8k|T=0", "status": "done",
                                  "attempts": 1, "error": None, "files": []}
    (run / "manifest.json").write_text(json.dumps(man))
    build_report(run)
    md = (run / "report/report.md").read_text()
    assert "missing drafter: hass-math" not in md and "FAILED eval: `hass:single:math|svamp|T=0`" in md


def test_compare_runs_pairs_prompts_across_runs(tmp_path, capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location("compare_runs",
                                                  Path(__file__).parents[1] / "experiments/compare_runs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    a = _make_run(tmp_path / "a")
    TAU[("math", "gsm8k")] = 3.5  # the ablation's drafter: +0.5 on every GSM8K prompt
    try:
        b = _make_run(tmp_path / "b")
    finally:
        TAU[("math", "gsm8k")] = 3.0
    assert mod.main(["--run", f"base={a}", "--run", f"better={b}", "--backbone", "hass", "--method",
                     "math"]) == 0
    out = capsys.readouterr().out
    assert "| better | 10 | 3.500" in out and "+0.500 [+0.500, +0.500] (n=10)" in out
    assert "| better | 10 | 1.500" in out  # MT-Bench unchanged
    with pytest.raises(SystemExit, match="no chat cell|no math cell"):
        mod.main(["--run", f"base={a}", "--backbone", "eagle2"])


def test_depth_claim_bootstraps_prompts_and_counts_them():
    """RQ5 pairs depth 1 with the deepest depth each variant reached: a drafter that reaches a depth
    on one prompt only must not shrink n to 1 (it did); every variant has its own row."""
    from orchestrator.report.claims import CLAIMS, Cell
    from orchestrator.report.steps import summarize

    rows = []
    for i in range(12):
        for method in ("math", "chat"):
            deep = method == "math" or i == 0  # chat reaches depth 3 on one prompt only
            da = [True, True, False] if deep else [True, False]
            for _ in range(3):  # 3 steps per prompt: depth 1 accepted, depth 3 rejected when reached
                rows.append({"backbone": "hass", "temperature": 0.0, "strategy": "single", "method": method,
                             "benchmark": "gsm8k", "prompt_id": f"p{i}", "depth_accept": da})
    cell = Cell(pl.DataFrame(), summarize(pl.DataFrame(rows)), "hass", 0.0, [], set(), ["hass"])
    r, c = sorted(CLAIMS["RQ5"].rows(cell), key=lambda r: not r.comparison.startswith("math"))
    assert r.prompts == 12 and r.estimate == pytest.approx(1.0) and r.verdict == "holds"
    assert r.comparison.startswith("math: accept rate depth 1 - depth 3")
    assert c.comparison.startswith("chat: accept rate depth 1 - depth 2") and c.prompts == 12


def test_speed_cells_timed_apart_from_their_baseline_are_flagged(tmp_path):
    """A resumed run mixes invocations: a cell timed in another invocation than the autoregressive
    cell (whose generate timing is the baseline) is marked, and the summary says how many."""
    run = _make_run(tmp_path / "run")
    for f in (run / "traces/prompts").rglob("*.parquet"):
        late = f.name == "math.parquet" and "gsm8k" in str(f)
        rows = pl.read_parquet(f).with_columns(pl.lit("B" if late else "A").alias("invocation"))
        write_parquet_atomic(rows.to_dicts(), f)
    build_report(run)
    sp = pl.read_parquet(run / "report/tables/speed.parquet")
    flag = {(m, b): v for m, b, v in sp.select("method", "benchmark", "same_invocation").iter_rows()}
    assert flag[("math", "gsm8k")] is False and flag[("chat", "gsm8k")] is True and flag[("math",
            "mt_bench")] is True
    assert flag[("generate (transformers)", "gsm8k")] is True
    md = (run / "report/report.md").read_text()
    assert "1 of 6 speed cells were timed in another grid invocation" in md
    plain = _make_run(tmp_path / "old")  # traces from before the tag: unknown, and no line
    build_report(plain)
    assert pl.read_parquet(plain / "report/tables/speed.parquet")["same_invocation"].null_count() > 0
    assert "another grid invocation" not in (plain / "report/report.md").read_text()


def test_a_grid_without_the_autoregressive_cell_still_gets_its_report(tmp_path):
    """No baseline timed (strategies without autoregressive): no speedups, no speed figure, and the
    report is written (it crashed drawing the figure over null speedups)."""
    run = _make_run(tmp_path / "run")
    m = json.loads((run / "manifest.json").read_text())
    m["cells"] = {k: c for k, c in m["cells"].items() if "autoregressive" not in k}
    (run / "manifest.json").write_text(json.dumps(m))
    build_report(run)
    assert (run / "report/report.md").is_file() and not list((run / "report").glob("fig_speed_*.png"))
    assert pl.read_parquet(run / "report/tables/speed.parquet")["speedup"].null_count() > 0


def test_the_drivers_closing_summary_reads_a_run_without_a_baseline(tmp_path, capsys):
    """The driver's last lines (best τ, fastest method) on a run whose speed table has no speedups:
    it printed the fastest method's speedup as a number and died on None."""
    from orchestrator.manifest import Manifest
    from orchestrator.run.summary import print_summary

    run = _make_run(tmp_path / "run")
    m = json.loads((run / "manifest.json").read_text())
    m["cells"] = {k: c for k, c in m["cells"].items() if "autoregressive" not in k}
    (run / "manifest.json").write_text(json.dumps(m))
    build_report(run)
    print_summary(Manifest(run / "manifest.json"), run)
    out = capsys.readouterr().out
    # math and chat tie at 2.25 in this run: ties are listed by name, whatever polars' group order
    assert "summary: 0 failed unit(s)" in out and "hass T=0: best tau chat 2.25, math 2.25" in out
    assert "fastest" not in out


def test_a_claim_without_an_interval_says_so_instead_of_printing_nan():
    from orchestrator.report.claims import CLAIMS, frame
    from orchestrator.report.summary import claims_grid

    nan = float("nan")
    cl = frame([CLAIMS["RQ3a"].row("hass", 0.0, "merged - confidence(step), average", 0.25, nan, nan,
                                   "inconclusive", 1),
                CLAIMS["RQ3b"].row("hass", 0.0, "confidence(step) - best single", 0.1, 0.02, 0.2, "holds",
                                   12)])
    cells = dict(zip(claims_grid(cl)["claim"], claims_grid(cl)["hass T=0"]))
    assert cells["RQ3a"] == "+0.25 [no interval: fewer than 2 prompts] inconclusive"
    assert cells["RQ3b"] == "+0.10 [+0.02, +0.20] holds"
    assert "nan" not in " ".join(cells.values())


def test_a_cell_that_timed_generate_itself_is_divided_by_its_own_runs(tmp_path):
    """eval.paired_baseline: the math cell on GSM8K timed generate next to each of its prompts (at
    42 tok/s, while the autoregressive cell's generate ran at 21): its speedup divides by its own
    runs, the other cells keep the autoregressive cell's baseline; 9 of its 10 outputs equal generate's."""
    run = _make_run(tmp_path / "run")
    f = next((run / "traces/prompts").rglob("benchmark=gsm8k/*/math.parquet"))
    rows = pl.read_parquet(f).with_columns(pl.lit(21).alias("generate_tokens"),
                                           pl.lit(0.5).alias("generate_wall_time_s"),
                                           (pl.col("prompt_id") != "gsm8k/0").alias("generate_matches"))
    write_parquet_atomic(rows.to_dicts(), f)
    build_report(run)
    sp = {(r["method"], r["benchmark"]): r
          for r in pl.read_parquet(run / "report/tables/speed.parquet").to_dicts()}
    math, chat = sp[("math", "gsm8k")], sp[("chat", "gsm8k")]
    tps = 61 / 2.0  # tau 3 over 20 calls of 0.1 s, plus the prefill token
    assert math["paired_baseline"] and math["speedup"] == pytest.approx(tps / 42)
    assert not chat["paired_baseline"] and chat["speedup"] == pytest.approx(41 / 2.0 / 21)
    assert math["outputs_equal_generate"] == pytest.approx(0.9) and chat["outputs_equal_generate"] is None
    assert sp[("autoregressive", "gsm8k")]["outputs_equal_generate"] == 1.0
    assert "paired_baseline" in (run / "report/report_appendix.md").read_text()


def test_the_depth_figure_leaves_out_depths_too_rarely_reached(tmp_path):
    """Pooled over benchmarks, a depth reached fewer than MIN_REACHED times is left off the
    figure (cpu-study: depth 4 reached twice read 0%), and the figure says how many were."""
    from orchestrator.report.figures import MIN_REACHED, depth_points, fig_depth

    rows = [("math", "gsm8k", 1, 0.6, 100), ("math", "svamp", 1, 0.4, 100), ("math", "gsm8k", 2, 0.5, 30),
            ("math", "gsm8k", 4, 0.0, 2), ("chat", "gsm8k", 1, 0.5, MIN_REACHED - 1)]
    dep = pl.DataFrame([dict(backbone="eagle2", method=m, benchmark=b, temperature=0.0, depth=d,
                             accept_rate=r,
                             reached=n) for m, b, d, r, n in rows])
    pts, dropped = depth_points(dep, "eagle2", 0.0)
    assert dropped == 2 and pts.select("method", "depth").rows() == [("math", 1), ("math", 2)]
    assert pts["rate"].to_list() == pytest.approx([0.5, 0.5]) and pts["reached"].to_list() == [200, 30]
    assert fig_depth(dep, "eagle2", 0.0, tmp_path / "f.png").is_file()
    assert fig_depth(dep.filter(pl.col("reached") < 5), "eagle2", 0.0, tmp_path / "g.png") is None


def test_the_speed_figure_marks_the_post_hoc_router_as_not_deployable(tmp_path):
    """The post hoc router decodes with both specialists before it chooses, so its bar is hatched
    grey with a † and a legend line, not red beside the deployable methods."""
    from orchestrator.report.figures import fig_speed, speed_bars
    from orchestrator.report.routers import POSTHOC

    sp = pl.DataFrame({"backbone": ["eagle2"] * 3, "method": ["math", POSTHOC, "merged"],
                       "temperature": [0.0] * 3, "speedup": [1.3, 0.31, 0.8], "baseline": ["generate"] * 3,
                       "benchmark": ["gsm8k"] * 3})
    s = sp.sort("speedup", descending=True)
    bars = {label: (colour, hatch) for label, _, colour, hatch in speed_bars(s)}
    assert bars == {"eagle2:math": ("tab:green", ""), "eagle2:merged": ("tab:red", ""),
                    f"eagle2:{POSTHOC} †": ("lightgrey", "//")}
    assert fig_speed(sp, 0.0, tmp_path / "speed.png").stat().st_size > 0


def test_taps_tau_divides_by_loop_indices_counted_from_zero():
    """TAPS's compute_tau: total new tokens over the sum of each turn's loop index at exit (passes - 1);
    a one-pass turn adds its tokens and 0 to the denominator. Ours divides by passes."""
    cell = {"backbone": "hass", "method": "math", "temperature": 0.0, "benchmark": "gsm8k", "drafter": "math",
            "strategy": "single", "wall_time_s": 1.0, "output_token_ids": [1], "mean_tree_size": 15.0,
            "t_draft_s": 0.0, "t_verify_s": 0.0, "routing_choice": 0}
    turns = [("a", 0, 10, 30), ("a", 1, 5, 12), ("b", 0, 1, 3)]  # (prompt, turn, passes, new tokens)
    pp = per_prompt(pl.DataFrame([cell | {"prompt_id": p, "turn": t, "verifier_calls": c, "new_tokens": n}
                                  for p, t, c, n in turns]).lazy())
    assert dict(zip(pp["prompt_id"], pp["loop_indices"])) == {"a": 13, "b": 0}
    row = table1(pp).row(0, named=True)
    assert row["tau"] == pytest.approx(45 / 16) and row["tau_taps"] == pytest.approx(45 / 13)
    assert row["tau_taps_lo"] <= row["tau_taps"] <= row["tau_taps_hi"]


def _shuffle_traces(src: Path, dst: Path) -> None:
    """The same traces with every file's rows in reverse order (the run directory keeps its name)."""
    import shutil

    shutil.copytree(src, dst)
    for f in (dst / "traces").rglob("*.parquet"):
        df = pl.read_parquet(f)
        df.reverse().write_parquet(f)


def test_the_report_is_the_same_bytes_when_built_twice_from_the_same_traces(tmp_path):
    """Prompts differ from each other (the bootstrap intervals are not degenerate): building twice, and
    building from the same traces with their rows in another order, gives byte-identical reports."""
    run = _make_run(tmp_path / "a" / "run")
    for f in (run / "traces/prompts").rglob("*.parquet"):
        df = pl.read_parquet(f)
        i = pl.int_range(pl.len())
        df.with_columns((pl.col("verifier_calls") + i).alias("verifier_calls"),
                        (pl.col("new_tokens") + i * i % 7).alias("new_tokens")).write_parquet(f)
    _shuffle_traces(run, tmp_path / "b" / "run")

    def build(r):
        build_report(r)
        out = r / "report"
        return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}

    first, again, shuffled = build(run), build(run), build(tmp_path / "b" / "run")
    t1 = pl.read_parquet(run / "report/tables/table1_acceptance.parquet").filter(pl.col("method") == "math")
    assert (t1["tau_hi"] - t1["tau_lo"]).min() > 0  # real intervals, not one value repeated
    assert first.keys() == again.keys() == shuffled.keys()
    for name in first:
        assert first[name] == again[name], f"{name} differs between two builds"
        assert first[name] == shuffled[name], f"{name} differs when the traces' rows come in another order"


def test_a_duplicated_row_is_refused_by_the_report(tmp_path):
    """A prompt row present twice (here: a second recorded unit holding one row of another's) would
    count twice in every sum: the report stops with one line naming the cell, the prompt and the
    units, and so does experiments/report.py (exit 2). The untouched run reports."""
    from experiments.report import main as report_main
    from orchestrator.report.duplicates import DuplicateRows, duplicates
    from orchestrator.report.tables import scan

    run = _make_run(tmp_path / "run")
    build_report(run)
    part = "backbone=hass/benchmark=gsm8k/temperature=0"
    extra = f"traces/prompts/{part}/copy.parquet"
    write_parquet_atomic([{**_prompt_rows("math", "gsm8k")[3], "unit_key": "math-gsm8k-again"}], run / extra)
    man = json.loads((run / "manifest.json").read_text())
    man["cells"]["eval-copy"] = {"stage": "eval", "name": "math|gsm8k", "status": "done", "files": [extra]}
    (run / "manifest.json").write_text(json.dumps(man))
    d = duplicates(scan(run, "prompts", {f for c in man["cells"].values() for f in c["files"]}), "prompts")
    assert d.select("method", "prompt_id", "turn", "copies", "units").to_dicts() == [
        {"method": "math", "prompt_id": "gsm8k/3", "turn": 0, "copies": 2,
         "units": ["math-gsm8k", "math-gsm8k-again"]}]
    with pytest.raises(DuplicateRows) as e:
        build_report(run)
    assert str(e.value).startswith(f"{run / 'traces' / 'prompts'}: 1 duplicated prompts row(s) in 1 "
                                   "place(s), "
                                   "e.g. hass math gsm8k T=0 prompt gsm8k/3 turn 0 x2 (units ['math-gsm8k', "
                                   "'math-gsm8k-again'])")
    assert report_main(["--run", str(run)]) == 2


LAMBDAS = (0.0, 0.25, 0.5, 0.75, 1.0)


def _lambda_run(root: Path) -> Path:
    """HASS at T=0 on gsm8k and mt_bench: both specialists, the mixed drafter and the average at five λ
    (τ known per cell: averaging climbs with λ on gsm8k and falls on mt_bench)."""
    taus = {"math": (3.0, 1.5), "chat": (2.0, 2.5), "mixed_half": (2.6, 2.2)}
    taus |= {f"avg{lam:g}": (2.0 + 0.8 * lam, 2.4 - 0.8 * lam) for lam in LAMBDAS}
    done = {}
    for method, per_bench in taus.items():
        for bench, tau in zip(("gsm8k", "mt_bench"), per_bench):
            part = f"backbone=hass/benchmark={bench}/temperature=0"
            rows = [r | {"new_tokens": int(tau * 20) + i % 3,
                         "output_token_ids": list(range(int(tau * 20) + 1)),
                         "drafter": method, "cell_key": f"{method}-{bench}", "unit_key": f"{method}-{bench}"}
                    for i, r in enumerate(_prompt_rows("math", bench))]
            write_parquet_atomic(rows, root / "traces/prompts" / part / f"{method}.parquet")
            done[f"eval-{method}-{bench}"] = {"stage": "eval", "name": f"{method}|{bench}", "status": "done",
                                              "files": [f"traces/prompts/{part}/{method}.parquet"]}
    (root / "manifest.json").write_text(json.dumps({"cells": done}))
    (root / "profile.json").write_text(json.dumps({"eval": {"benchmarks": {"gsm8k": 10, "mt_bench": 10}},
                                                   "merge": {"lambdas": list(LAMBDAS)}}))
    return root


def test_the_lambda_figure_and_its_table_show_every_lambda_of_the_sweep(tmp_path):
    run = _lambda_run(tmp_path / "run")
    build_report(run)
    out = run / "report"
    md = (out / "report.md").read_text()
    assert "### Figure 6 — weight averaging along λ (hass, T=0)" in md
    assert "![Figure 6, hass, T=0](fig6_lambda_hass_T0.png)" in md
    assert (out / "fig6_lambda_hass_T0.png").stat().st_size
    t = pl.read_csv(out / "tables/fig6_lambda_hass_T0.csv")
    assert t["method"].to_list() == [f"avg{lam:g}" for lam in LAMBDAS] + ["math", "chat", "mixed_half"]
    assert t["lambda"].to_list()[:5] == list(LAMBDAS) and t["lambda"].null_count() == 3
    section = md[md.index("### Figure 6"):]
    t1 = pl.read_parquet(out / "tables/table1_acceptance.parquet")
    # every λ is a row under the figure, τ per benchmark
    for lam, row in zip(LAMBDAS, t.iter_rows(named=True)):
        tau = t1.filter((pl.col("method") == f"avg{lam:g}") & (pl.col("benchmark") == "gsm8k"))["tau"][0]
        assert float(row["gsm8k"].split(" [")[0]) == pytest.approx(tau, abs=0.0051)
        assert f"| avg{lam:g} | {lam} | {row['gsm8k']} | {row['mt_bench']} |" in section, lam
    assert "| math | — | 3.04 [" in section  # references: no λ (null, shown as a dash)
    # RQ3c is checked here (avg0.5 and the singles): the report says what result at scale would overturn it
    assert "**RQ3c at scale**" in md and "Llama-3-8B" in md


def test_the_post_hoc_router_is_marked_not_lossless_at_t1_in_the_summary_and_table_1():
    """At T>0 the post hoc router's output is a choice between two samples made from those samples: not
    a sample of the verifier's distribution. Its T=1 cells carry ‡ with the sentence that says so; its
    T=0 cells and every other method are left unmarked."""
    from orchestrator.report.routers import NOT_LOSSLESS, POSTHOC, lossless
    from orchestrator.report.sections import marked_method
    from orchestrator.report.summary import summary_section

    assert not lossless(POSTHOC, 1.0) and lossless(POSTHOC, 0.0) and lossless("merged", 1.0)
    t1 = pl.DataFrame({"backbone": ["hass"] * 4, "method": [POSTHOC, "merged"] * 2,
                       "benchmark": ["gsm8k"] * 4,
                       "temperature": [0.0, 0.0, 1.0, 1.0], "tau": [3.0, 3.5, 2.0, 2.5], "tau_taps": [3.1,
                               3.6, 2.1, 2.6]})
    sp = pl.DataFrame({"backbone": ["none"], "temperature": [0.0], "method": ["generate (transformers)"],
                       "speedup": [None], "baseline": ["generate (transformers)"]},
                       schema_overrides={"speedup": pl.Float64})
    pp = pl.DataFrame({"benchmark": ["gsm8k"], "prompt_id": ["p0"]})
    md = "\n".join(summary_section(t1, sp, pl.DataFrame(), [], pp))
    assert f"| {POSTHOC} | 3.0 (3.1) | 2.0 (2.1) ‡ |" in md, md
    assert "| merged | 3.5 (3.6) | 2.5 (2.6) |" in md and NOT_LOSSLESS in md
    cold = "\n".join(summary_section(t1.filter(pl.col("temperature") == 0), sp, pl.DataFrame(), [], pp))
    assert "‡" not in cold
    methods = t1.select(marked_method(1.0))["method"].to_list()
    assert methods == [f"{POSTHOC} ‡", "merged"] * 2


def test_the_speed_table_and_figure_average_benchmarks_as_the_tau_averages():
    """1 chat : 3 math, as every tau average: a method at 0.5x on GSM8K and 1.5x on MT-Bench averages
    0.75x (a plain mean would say 1.00x); a method timed on one benchmark keeps its own figure."""
    from orchestrator.report.figures import speed_means
    from orchestrator.report.summary import _speed_section

    sp = pl.DataFrame({"backbone": ["eagle2"] * 4, "temperature": [0.0] * 4,
                       "method": ["math", "math", "chat", "generate (transformers)"],
                       "benchmark": ["gsm8k", "mt_bench", "mt_bench", "gsm8k"],
                       "speedup": [0.5, 1.5, 1.2, 1.0],
                       "baseline": ["generate (transformers)"] * 4, "same_invocation": [True] * 4})
    s = speed_means(sp, 0.0, "generate (transformers)")
    means = dict(zip(s["method"], s["speedup"]))
    assert means == pytest.approx({"math": 0.75, "chat": 1.2})
    md = "".join(_speed_section(sp))
    assert "mean over benchmarks, 1 chat : 3 math" in md
    assert "| eagle2 | 0.0 | chat | 1.2 |" in md and "| eagle2 | 0.0 | math | 0.75 |" in md, md
