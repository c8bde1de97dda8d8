"""tree auto: the pure choice on constructed calibrations, and (slow) the real measure -> choose
-> decode path on the embedded verifier, which must stay lossless whatever shape it picks."""
from __future__ import annotations

import pytest
import torch

from decoding import cpu
from decoding.autotree import CAL_TREES, Calibration, _cache_key, choose, monotone, tau_of

FLAT = {1: 40.0, 2: 40.0, 4: 41.0, 8: 42.0, 16: 44.0, 32: 50.0, 64: 60.0}  # verify ms: nodes nearly free
STEEP = {1: 40.0, 2: 60.0, 4: 100.0, 8: 180.0, 16: 340.0, 32: 660.0, 64: 1300.0}


def _chain_cal(correct_depth: int, draft_ms: float = 1.0) -> Calibration:
    """k=1 chains of depth 8 where the first ``correct_depth`` tokens are always right."""
    step = [(0, d, -0.1 * d, d <= correct_depth) for d in range(1, 9)]
    return Calibration(steps={1: [step] * 5}, chosen={1: [0] * 5}, draft_ms_level={1: draft_ms},
                       bookkeeping_ms=0.5)


def test_tau_of_reads_sub_trees_off_the_calibration_tree():
    cal = _chain_cal(3)
    assert tau_of(cal.steps[1], cal.chosen[1], 1, 2, False, 1) == 2.0
    assert tau_of(cal.steps[1], cal.chosen[1], 3, 4, False, 1) == 4.0
    assert tau_of(cal.steps[1], cal.chosen[1], 6, 7, False, 1) == 4.0  # depth 4+ is never right
    # merged: the best of both drafters' sub-trees; routing: only the chosen one
    two = [[(0, 1, -0.1, True), (1, 1, -0.1, True), (1, 2, -0.2, True)]]
    assert tau_of(two, [-1], 2, 3, True, 2) == 3.0
    assert tau_of(two, [0], 2, 3, False, 2) == 2.0


def test_choose_goes_deep_when_passes_are_cheap_and_drafts_are_right():
    c = choose(_chain_cal(6), FLAT, merged=False, n_drafters=1)
    assert c.pays and c.tree.top_k == 1 and c.tree.depth == 6 and c.tau == 7.0
    assert c.tokens_per_s > c.ar_tokens_per_s


def test_choose_stays_shallow_when_passes_are_expensive():
    # acceptance falls off with depth (correct prefixes 0..4 in equal shares)
    steps = [[(0, d, -0.1 * d, d <= c) for d in range(1, 9)] for c in (0, 1, 1, 2, 2, 3, 4)]
    cal = Calibration(steps={1: steps}, chosen={1: [0] * len(steps)}, draft_ms_level={1: 1.0})
    deep = choose(cal, FLAT, False, 1).tree.depth
    shallow = choose(cal, STEEP, False, 1).tree.depth
    assert shallow < deep


def test_when_nothing_pays_the_smallest_tree_is_used_and_said():
    c = choose(_chain_cal(0, draft_ms=5.0), FLAT, False, 1)
    assert not c.pays and (c.tree.top_k, c.tree.depth, c.tree.total_tokens) == (1, 1, 2)
    assert "no tree is expected to pay" in c.describe()


@pytest.mark.slow
def test_a_timing_spike_does_not_steer_the_choice():
    # measured on this VM: 7 tokens timed at 58 ms between 6 at 44 and 8 at 45 (one-sided noise)
    spiky = {1: 33.0, 4: 38.7, 6: 44.4, 7: 58.1, 8: 44.9, 16: 61.3, 20: 86.9, 24: 89.0}
    clean = monotone(spiky)
    assert clean[7] == 44.9 and clean[20] == 86.9 and clean[1] == 33.0
    assert all(clean[a] <= clean[b] for a, b in zip(sorted(clean), sorted(clean)[1:]))
    cal = _chain_cal(6, draft_ms=0.5)  # six right draft tokens: a chain of total 7 is the best shape
    assert choose(cal, clean, merged=False, n_drafters=1).tree.total_tokens == 7
    assert choose(cal, spiky, merged=False, n_drafters=1).tree.total_tokens != 7  # what the spike did


@pytest.mark.slow
def test_verify_costs_are_cached_per_verifier_pass(verifier):
    """Costs timed through transformers' forward must not price lean passes (they cost ~8% less)."""
    model, _ = verifier
    lean_key = _cache_key(model)
    with cpu.lean_disabled(model):
        hf_key = _cache_key(model)
    assert lean_key.endswith("|lean") and hf_key.endswith("|hf")


# breadth (make test-full): tree auto on the real verifier end to end is the README job's tree-auto cells
# (tests/test_grid.py: lossless T=0 outputs checked); its timing path is tests/test_accelerator.py's
@pytest.mark.full
def test_auto_tree_on_the_real_verifier_picks_a_shape_and_stays_lossless(verifier, eos, random_proposers,
        bench_prompts):
    from decoding.autotree import auto_tree, calibration_inputs
    from decoding.engine import DecodeConfig, SpeculativeDecoder
    from drafters.data.templating import benchmark_prompt_ids

    model, tok = verifier
    choice = auto_tree(model, random_proposers[:1], "single", eos, calibration_inputs(tok)[:1],
                       max_new_tokens=12)
    assert {r[0] for r in choice.table} == set(CAL_TREES)  # every candidate top_k was calibrated
    assert choice.table and "tree auto:" in choice.describe()
    assert not choice.pays  # random drafters never pay: the smallest tree
    ids = benchmark_prompt_ids(tok, bench_prompts["gsm8k"][0], 0, [])
    ref = model.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False, eos_token_id=eos,
                         pad_token_id=eos[0])
    dec = SpeculativeDecoder(model, random_proposers[:1], DecodeConfig(max_new_tokens=16, tree=choice.tree),
                             eos)
    assert dec.generate(ids).output_token_ids == ref[0, len(ids):].tolist()


def test_calibration_prompts_come_from_the_scored_task_and_are_never_scored(verifier):
    import warnings

    from decoding.autotree import calibration_inputs
    from drafters.data.sources import load_benchmark
    from drafters.data.templating import benchmark_prompt_ids

    tok = verifier[1]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        svamp = load_benchmark("svamp")[0]
    ids = {tuple(benchmark_prompt_ids(tok, p, 0, [])): p.id for p in svamp}
    scored = {p.id for p in svamp[-3:]}  # a seeded draw may well contain the last prompts
    cal = calibration_inputs(tok, 2, ("svamp",), exclude=scored)
    assert [ids[tuple(c)] for c in cal] == [svamp[-5].id, svamp[-4].id]  # the last held-out ones, in order
    # a benchmark scored in full has nothing held out: its last prompts are used anyway
    everything = calibration_inputs(tok, 1, ("svamp",), exclude={p.id for p in svamp})
    assert [ids[tuple(c)] for c in everything] == [svamp[-1].id]


def test_verify_costs_from_noisy_timings_serve_this_process_and_are_not_cached(verifier, tmp_path,
        monkeypatch,
                                                                              capsys):
    """Pass timings that alternate 1 and 3 ms (injected clock, real passes) are timed once more,
    then used by this process only; quiet ones are cached. As the matmul tuner's tables."""
    from decoding import autotree, timing
    from decoding.autotree import calibration_inputs, measure_verify_costs

    model, tok = verifier
    monkeypatch.setattr(autotree, "CACHE", tmp_path / "verify_cost.json")
    monkeypatch.setattr(autotree, "_SESSION", {})
    monkeypatch.setattr(autotree, "VERIFY_SIZES", (1, 2))
    monkeypatch.setattr(timing, "MIN_CPU_SHARE", 0.0)  # (whatever else this machine runs meanwhile)
    state = {"t": 0.0, "calls": 0, "durations": None}

    def clock(_dev):
        state["calls"] += 1
        if state["calls"] % 2 == 0:  # a pass's end
            state["t"] += state["durations"][(state["calls"] // 2) % len(state["durations"])]
        return state["t"]

    monkeypatch.setattr(autotree, "synced_now", clock)
    prompt = calibration_inputs(tok)[0]
    state["durations"] = [0.001, 0.003]
    noisy = measure_verify_costs(model, prompt)
    assert state["calls"] == 2 * 2 * 6 * 2  # 2 sizes, each timed twice (6 passes, 2 clock reads each)
    assert "verify costs not cached, timings spread" in capsys.readouterr().err
    assert not autotree.CACHE.exists() and set(noisy) == {1, 2}
    assert measure_verify_costs(model, prompt) == noisy and state["calls"] == 48  # this process: no re-timing
    monkeypatch.setattr(autotree, "_SESSION", {})
    state["durations"] = [0.002]
    assert measure_verify_costs(model, prompt) == pytest.approx({1: 2.0, 2: 2.0})
    assert state["calls"] == 48 + 2 * 6 * 2  # quiet: each size timed once
    assert autotree.CACHE.exists() and "not cached" not in capsys.readouterr().err


def test_verify_costs_time_the_passes_eagle3_drafters_need(verifier, random_eagle3_dirs, tmp_path,
                                                           monkeypatch):
    """With eagle3 drafters, tree auto times passes that capture their aux layers (as decoding runs
    them), cached under a key of their own; with eagle2 ones, passes of the last hidden state."""
    from decoding import autotree, timing, verifier_pass
    from decoding.autotree import calibration_inputs, measure_verify_costs
    from decoding.drafting import feature_layers
    from decoding.runner import load_proposers
    from tests.conftest import VERIFIER

    model, tok = verifier
    monkeypatch.setattr(autotree, "CACHE", tmp_path / "verify_cost.json")
    monkeypatch.setattr(autotree, "_SESSION", {})
    monkeypatch.setattr(autotree, "VERIFY_SIZES", (1, 2))
    monkeypatch.setattr(timing, "MIN_CPU_SHARE", 0.0)  # cached whatever else runs meanwhile
    monkeypatch.setattr(timing, "MAX_SPREAD", float("inf"))
    seen, real = [], verifier_pass.tree_forward

    def spy(*args):
        seen.append(args[7] if len(args) > 7 else None)
        return real(*args)

    monkeypatch.setattr(verifier_pass, "tree_forward", spy)
    layers = feature_layers(load_proposers(model, random_eagle3_dirs[:1], VERIFIER))
    assert layers is not None and len(layers) == 3
    prompt = calibration_inputs(tok)[0]
    with_aux = measure_verify_costs(model, prompt, reps=1, layers=layers)
    assert seen and set(seen) == {layers}
    seen.clear()
    plain = measure_verify_costs(model, prompt, reps=1)
    assert seen and set(seen) == {None}
    stored = autotree.load_json_cache(autotree.CACHE)
    assert autotree._cache_key(model, layers) != autotree._cache_key(model)
    assert set(with_aux) == set(plain) == {1, 2}
    assert {autotree._cache_key(model, layers), autotree._cache_key(model)} <= set(stored)


def test_the_cost_cache_key_of_a_non_cpu_model_builds_no_cpu_kernel(monkeypatch):
    """A GPU worker's tree auto keys its costs by the accelerator, never by the CPU matmul machine
    (whose key builds the C kernel): a model on the meta device must not reach the kernel."""
    from transformers import LlamaConfig, LlamaForCausalLM

    def no_build(*a, **k):
        raise AssertionError("the CPU kernel was asked for on a non-CPU model")

    monkeypatch.setattr(cpu.kernel, "available", no_build)
    monkeypatch.setattr(cpu.matmul, "machine_key", no_build)
    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                             num_hidden_layers=1,
                                             num_attention_heads=4, num_key_value_heads=2))
    key = _cache_key(model)
    assert "|meta|" in key and "torch=" in key
