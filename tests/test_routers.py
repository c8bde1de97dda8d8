"""The routers by name: the study's post hoc confidence router computed from single-drafter traces,
Table 2 counting prompts per router, method labels of the new cells, and the report saying which
routing row is the headline and that the post hoc one is not deployable."""
from __future__ import annotations

import json

import polars as pl
import pytest

from decoding.runner import write_parquet_atomic
from orchestrator.report.build import build_report
from orchestrator.report.claims import check_claims
from orchestrator.report.labels import ROUTED
from orchestrator.report.routers import (
    HEADS,
    HEADS_LAST,
    NOT_DEPLOYABLE,
    POSTHOC,
    POSTHOC_NODE,
    PROMPT_NODE,
    posthoc_rows,
    table2,
    with_posthoc,
)
from orchestrator.report.tables import method_expr, per_prompt

KEY = {"backbone": "eagle2", "temperature": 0.0}


def _pp(method, tau, n=3, bench="gsm8k", wall=1.0, strategy="single", drafter=None, choice=-1):
    return [KEY | {"method": method, "benchmark": bench, "prompt_id": f"p{i}", "new_tokens": int(tau * 10),
                   "verifier_calls": 10, "wall_time_s": wall, "out_tokens": int(tau * 10) + 1,
                   "routing_choice": choice, "strategy": strategy, "drafter": drafter or method}
                   for i in range(n)]


def _steps(method, conf_of, n=3, bench="gsm8k"):
    """Two steps per prompt: accepted c(v) [conf, conf] then a rejection at conf (NaN at step 2)."""
    return [KEY | {"method": method, "benchmark": bench, "prompt_id": f"p{i}", "strategy": "single",
                   "step": s,
                   "accepted_draft_confidence": [conf_of(i)] * 2,
                   "rejected_draft_confidence": conf_of(i) if s == 0 else float("nan")}
            for i in range(n) for s in range(2)]


def _taps_steps(method, steps, bench="gsm8k", pid="p0"):
    """Hand-built steps: (accepted c(v), first rejected c(v), accepted V, off-path V sum, off-path nodes)."""
    return [KEY | {"method": method, "benchmark": bench, "prompt_id": pid, "strategy": "single", "step": i,
                   "accepted_draft_confidence": c, "rejected_draft_confidence": r,
                   "accepted_path_confidence": v,
                   "offpath_confidence_sum": off, "offpath_nodes": n} for i, (c, r, v, off,
                           n) in enumerate(steps)]


def test_taps_router_scores_every_drafted_node_by_its_path_score_and_picks_otherwise_than_node_scores():
    """Math: confident nodes on its accepted path (c = 0.9 each, V 0.9 then 0.81) but 13 unlikely nodes
    off it (V 0.01 each); chat: c = 0.5 on its one accepted node and on the first rejected child, and
    14 off-path nodes of V 0.5. TAPS's score (mean V over all 15 drafted nodes of each step, accepted
    and rejected weighted by their counts) picks chat; c(v) over accepted + first rejected picks math."""
    pp = pl.DataFrame(_pp("math", 3.0, n=1, wall=1.0) + _pp("chat", 2.0, n=1, wall=2.0)
                      + _pp("mixed_full", 2.5, n=1, wall=4.0))
    steps = pl.DataFrame(_taps_steps("math", [([0.9, 0.9], 0.9, [0.9, 0.81], 13 * 0.01, 13)] * 2)
                         + _taps_steps("chat", [([0.5], 0.5, [0.5], 14 * 0.5, 14)] * 2))
    taps = posthoc_rows(pp, steps, method=POSTHOC)
    node = posthoc_rows(pp, steps, method=POSTHOC_NODE)
    assert taps["method"].to_list() == [POSTHOC] and node["method"].to_list() == [POSTHOC_NODE]
    # chat's whole run
    assert taps["routing_choice"].to_list() == [1] and taps["new_tokens"].to_list() == [20]
    assert node["routing_choice"].to_list() == [0] and node["new_tokens"].to_list() == [30]  # math's
    math_score = (2 * (0.9 + 0.81 + 0.13)) / (2 * 15)  # TAPS's overall_confidence: pooled over all nodes
    assert taps["posthoc_margin"][0] == pytest.approx(math_score - 0.5)
    assert node["posthoc_margin"][0] == pytest.approx(0.4)
    # within eps = 0.01 of each other: the mixed drafter's whole run, by TAPS's score alone
    near = pl.DataFrame(_taps_steps("math", [([0.9], 0.9, [0.9], 14 * 0.5, 14)])
                        + _taps_steps("chat", [([0.2], 0.2, [0.8], 14 * 0.5, 14)]))  # 0.527 vs 0.520
    assert posthoc_rows(pp, near, method=POSTHOC)["new_tokens"].to_list() == [25]
    assert posthoc_rows(pp, near, method=POSTHOC_NODE)["routing_choice"].to_list() == [0]
    # both routers under their own names; traces without the path columns give the node one alone
    assert set(with_posthoc(pp, steps)["method"]) == {"math", "chat", "mixed_full", POSTHOC, POSTHOC_NODE}
    old = steps.drop("accepted_path_confidence", "offpath_confidence_sum", "offpath_nodes")
    assert POSTHOC not in set(with_posthoc(pp, old)["method"])


def test_table2_counts_the_entropy_router_by_its_last_turn_as_the_study_did():
    """Turn choices [chat, chat, math]: the majority says chat, the study's code records math (the
    last turn's head); the study's matched share sits beside the last-turn count."""
    cell = {"drafter": "math+chat+mixed_full+avg0.5", "strategy": "entropy", "method": HEADS,
            "new_tokens": 20,
            "verifier_calls": 10, "wall_time_s": 1.0, "output_token_ids": [1] * 21, "mean_tree_size": 15.0,
            "t_draft_s": 0.1, "t_verify_s": 0.5}
    rows = [KEY | cell | {"benchmark": "gsm8k", "prompt_id": "p0", "turn": t, "routing_choice": c}
            for t, c in ((2, 0), (0, 1), (1, 1))]  # written out of turn order
    pp = per_prompt(pl.DataFrame(rows).lazy())
    assert pp["routing_choice"].to_list() == [1] and pp["routing_choice_last"].to_list() == [0]
    t = table2(pp)
    mode = t.filter(pl.col("method") == HEADS).row(0, named=True)
    last = t.filter(pl.col("method") == HEADS_LAST).row(0, named=True)
    assert (mode["drafter"], mode["study_matched_share"]) == ("chat", None)
    assert (last["drafter"], last["matched"], last["study_matched_share"]) == ("math", True,
            pytest.approx(0.546))


def test_posthoc_router_routes_each_prompt_to_the_higher_whole_generation_confidence():
    pp = pl.DataFrame(_pp("math", 3.0, wall=1.0) + _pp("chat", 2.0, wall=2.0) + _pp("mixed_full", 2.5,
            wall=4.0))
    # p0: math 0.9 vs chat 0.5 -> math; p1: 0.3 vs 0.6 -> chat; p2: 0.500 vs 0.505 -> a near-tie -> mixed
    math_c, chat_c = {0: 0.9, 1: 0.3, 2: 0.5}, {0: 0.5, 1: 0.6, 2: 0.505}
    steps = pl.DataFrame(_steps("math", math_c.get) + _steps("chat", chat_c.get))
    rows = posthoc_rows(pp, steps, method=POSTHOC_NODE).sort("prompt_id")
    assert rows["method"].unique().to_list() == [POSTHOC_NODE]
    assert rows["routing_choice"].to_list() == [0, 1, 2] and rows["drafter"][0] == "math+chat+mixed_full"
    assert rows["new_tokens"].to_list() == [30, 20, 25]  # each prompt's row is the chosen run's
    assert rows["wall_time_s"].to_list() == [3.0, 3.0, 7.0]  # it paid for every generation it read
    assert rows["posthoc_margin"].to_list() == pytest.approx([0.4, -0.3, -0.005])
    # a near-tie without the mixed checkpoint's run takes the higher specialist, and says so
    rows = posthoc_rows(pl.DataFrame(_pp("math", 3.0) + _pp("chat", 2.0)), steps, method=POSTHOC_NODE)
    rows = rows.sort("prompt_id")
    assert rows["routing_choice"].to_list() == [0, 1, 1]
    assert rows["posthoc_tie_fallback"].to_list() == [False, False, True]
    # traces without the confidence columns (written before them): no post hoc rows
    assert posthoc_rows(pp, steps.drop("rejected_draft_confidence"), method=POSTHOC_NODE).is_empty()
    assert posthoc_rows(pp, steps).is_empty()  # TAPS's router needs the path-score columns


def test_table2_counts_prompts_per_router_by_name():
    three = {"strategy": "posthoc", "drafter": "math+chat+mixed_full"}
    pp = pl.DataFrame(
        _pp(POSTHOC, 3.0, n=4, choice=0, **three)
        + [r | {"prompt_id": "q"} for r in _pp(POSTHOC, 3.0, n=1, choice=2, **three)]
        + _pp(HEADS, 2.0, n=5, strategy="entropy", drafter="math+chat+mixed_full+avg0.5", choice=3)
        + _pp("math", 3.0, n=5))  # a single drafter is not a router
    t = table2(pp)
    assert set(t["method"]) == {POSTHOC, HEADS}
    ph = {r["drafter"]: r for r in t.filter(pl.col("method") == POSTHOC).to_dicts()}
    assert (ph["math"]["prompts"], ph["math"]["of"], ph["math"]["prompt_share"]) == (4, 5, 0.8)
    assert ph["math"]["matched"] and not ph["mixed_full"]["matched"]
    assert ph["math"]["study_matched_share"] == pytest.approx(0.908)  # the study's Table 2, EAGLE-2 GSM8K
    hd = t.filter(pl.col("method") == HEADS).row(0, named=True)
    assert (hd["drafter"], hd["prompts"], hd["matched"]) == ("avg0.5", 5, False)


def test_rq4_pairs_the_studys_two_routers_reading_choices_by_name():
    """Post hoc confidence picks the matched specialist (index 0 = math on gsm8k, 1 = chat on
    mt_bench); the 4-head entropy router picks the mixed head (index 2) half the time."""
    rows = []
    for bench, right in (("gsm8k", 0), ("mt_bench", 1)):
        rows += _pp(POSTHOC, 3.0, n=12, bench=bench, strategy="posthoc", drafter="math+chat+mixed_full",
                    choice=right)
        rows += [r | {"routing_choice": right if i % 2 else 2} for i, r in enumerate(
            _pp(HEADS, 2.0, n=12, bench=bench, strategy="entropy", drafter="math+chat+mixed_full+avg0.5"))]
    cl = check_claims(pl.DataFrame(rows), None, None)
    r = cl.filter((pl.col("claim") == "RQ4") & pl.col("comparison").str.contains(ROUTED, literal=True))
    assert r.height == 1 and r["estimate"][0] == pytest.approx(0.5) and r["verdict"][0] == "holds"
    assert "Table 2" in r["study"][0]


def test_rq4_in_the_study_family_counts_each_prompts_last_turn_head_the_majority_row_is_exploratory():
    """Two turns per prompt on 12 gsm8k and 12 mt_bench prompts. The 4-head entropy router picks the
    matched specialist at the first turn and the mixed head (index 2) at the second, so its last-turn
    head (the study's code's count) is never matched while its majority (a tie, to the first turn's)
    always is: post hoc confidence (always matched) beats HEADS_LAST by 1 (holds, study family) and
    ties HEADS (0, exploratory). Ties in the majority go to the first drafter in turn order, here the
    matched one at index 0 / 1 on its benchmark."""
    rows = []
    for bench, right in (("gsm8k", 0), ("mt_bench", 1)):
        rows += _pp(POSTHOC, 3.0, n=12, bench=bench, strategy="posthoc", drafter="math+chat+mixed_full",
                    choice=right)
        rows += [r | {"turn": t, "routing_choice": right if t == 0 else 2, "output_token_ids": [1] * 21,
                      "mean_tree_size": 15.0, "t_draft_s": 0.1, "t_verify_s": 0.5}
                 for r in _pp(HEADS, 2.0, n=12, bench=bench, strategy="entropy",
                              drafter="math+chat+mixed_full+avg0.5") for t in (0, 1)]
    heads = per_prompt(pl.DataFrame([r for r in rows if r["method"] == HEADS]).lazy())
    assert set(heads["routing_choice_last"].to_list()) == {2}
    pp = pl.concat([pl.DataFrame([r for r in rows if r["method"] == POSTHOC]), heads], how="diagonal_relaxed")
    cl = check_claims(pp, None, None).filter(pl.col("claim") == "RQ4")
    last = cl.filter(pl.col("comparison").str.starts_with(f"{ROUTED} - {HEADS_LAST}:"))
    mode = cl.filter(pl.col("comparison").str.starts_with(f"{ROUTED} - {HEADS}:"))
    assert last.height == 1 and mode.height == 1
    assert (last["estimate"][0], last["verdict"][0], last["family"][0]) == (pytest.approx(1.0), "holds",
            "study")
    assert mode["estimate"][0] == pytest.approx(0.0) and mode["family"][0] == "exploratory"
    assert "majority" in mode["study_note"][0] and last["verdict_holm"][0] == "holds"


def test_method_labels_name_every_router_and_new_strategy():
    base = {"drafter": "math+chat", "routing_granularity": "prompt", "merge_dedup": False,
            "budget_matched": False,
            "total_tokens": 16, "tree": "fixed", "route_score": "path", "switch_after": 2,
            "switch_to": "specialist",
            "switch_depth": 2}
    cells = [{"strategy": "confidence"}, {"strategy": "confidence", "route_score": "node"},
             {"strategy": "entropy", "routing_granularity": "turn", "drafter": "math+chat+mixed_full+avg0.5"},
             {"strategy": "switching", "switch_after": 3}, {"strategy": "switching", "switch_to": "merged"},
             {"strategy": "depth_adaptive", "drafter": "mixed_full+math+chat"}]
    df = pl.DataFrame([base | c for c in cells])
    got = df.select(method_expr(df.columns).alias("m"))["m"].to_list()
    assert got == ["confidence(prompt)", PROMPT_NODE, HEADS, "switching(k=3)", "switching(k=2, to merged)",
                   "depth_adaptive(d=2)"]
    # a frame without the new columns reads their defaults (traces written before them)
    old = df.drop("route_score", "switch_after", "switch_to", "switch_depth", "tree")
    assert old.select(method_expr(old.columns).alias("m"))["m"][1] == "confidence(prompt)"


def _write(run, method_cells):
    """A run whose traces hold single math / chat / mixed_full cells with the confidence columns."""
    files = []
    for drafter, tau, conf in method_cells:
        part = "backbone=eagle2/benchmark=gsm8k/temperature=0"
        cell = {"drafter": drafter, "strategy": "single", "routing_granularity": "step", "merge_dedup": False,
                "total_tokens": 16, "budget_matched": False, "cell_key": drafter, "unit_key": drafter}
        prompts = [cell | {"prompt_id": f"p{i}", "turn": 0, "output_token_ids": [1] * 21,
                           "verifier_calls": 10,
                           "new_tokens": int(tau * 10), "wall_time_s": 1.0, "mean_tree_size": 15.0,
                           "routing_choice": 0, "t_draft_s": 0.1, "t_verify_s": 0.5} for i in range(12)]
        steps = [cell | {"prompt_id": f"p{i}", "turn": 0, "step": s, "committed": 2, "chosen_drafter": 0,
                         "accepted_draft_confidence": [conf(i)], "rejected_draft_confidence": conf(i),
                         "accepted_path_confidence": [conf(i)], "offpath_confidence_sum": 14 * conf(i),
                         "offpath_nodes": 14,
                         "accepted_draft_entropy": [0.5], "accepted_verifier_entropy": [0.5],
                         "rejected_draft_entropy": 1.0, "rejected_verifier_entropy": 1.0,
                         "depth_accept": [True, False]} for i in range(12) for s in range(3)]
        for kind, rows in (("prompts", prompts), ("steps", steps)):
            f = f"traces/{kind}/{part}/{drafter}.parquet"
            write_parquet_atomic(rows, run / f)
            files.append(f)
    cells = {"e": {"stage": "eval", "name": "x", "status": "done", "files": files}}
    (run / "manifest.json").write_text(json.dumps({"cells": cells}))
    ev = {"benchmarks": {"gsm8k": 12}, "route_pair": ["math", "chat"], "mixed_variant": "mixed_full"}
    (run / "profile.json").write_text(json.dumps({"eval": ev}))


def test_report_names_the_headline_router_and_marks_the_post_hoc_one(tmp_path):
    run = tmp_path / "run"
    _write(run, [("math", 3.0, lambda i: 0.9 if i < 9 else 0.2), ("chat", 2.0, lambda i: 0.5),
                 ("mixed_full", 2.5, lambda i: 0.5)])
    build_report(run)
    text = (run / "report/report.md").read_text()
    assert f"headline routing row (RQ3a, RQ3b, RQ4) is `{POSTHOC}`" in text and NOT_DEPLOYABLE in text
    assert "## Routers and compositions in this run" in text
    t1 = pl.read_parquet(run / "report/tables/table1_acceptance.parquet")
    ph = t1.filter(pl.col("method") == POSTHOC).row(0, named=True)
    assert ph["prompts"] == 12 and ph["tau"] == pytest.approx((9 * 3.0 + 3 * 2.0) / 12)
    t2 = pl.read_parquet(run / "report/tables/table2_routing.parquet")
    assert dict(zip(t2["drafter"], t2["prompts"])) == {"math": 9, "chat": 3}
