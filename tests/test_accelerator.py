"""The GPU path on a CPU: the decode loop under a stand-in accelerator (tests/accelerator.py).

The verifier and the drafters count as living on ``cuda:0``; every host/device mix raises as on
CUDA, and device -> host reads (syncs) and host -> device copies are counted. Every strategy,
fixed trees and tree auto, T=0 and T=1, multi-turn prompts run through it and give the same tokens
as the same computation off the harness; each decode step stays within a fixed budget of syncs
and copies whatever the tree size and the number of drafters; every timer closes on a sync. The
old decode code (from git) fails under it on the two mixes a reading of the code predicted.
"""
from __future__ import annotations

import contextlib
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from decoding import cpu
from decoding.config import TreeConfig
from decoding.engine import DecodeConfig, SpeculativeDecoder
from decoding.runner import decode_prompt, load_proposers
from decoding.timing import Clock
from tests.accelerator import DeviceMismatch, FakeCuda, on_device

ROOT = Path(__file__).resolve().parents[1]
VERIFIER = "smollm2-135m-instruct"
MAX_NEW = 6
SYNC_BUDGET, COPY_BUDGET = 4, 4  # per decode step, whatever the tree and the number of drafters


# -- the harness itself ------------------------------------------------------------------------
def test_host_device_mixes_raise_as_on_cuda():
    with FakeCuda() as acc:
        d = torch.ones(3).cuda()
        h = torch.ones(3)
        assert d.device == torch.device("cuda", 0) and d.is_cuda and not h.is_cuda and on_device(d + 1)
        with pytest.raises(DeviceMismatch):
            d + h
        with pytest.raises(DeviceMismatch):
            torch.cat([d, h])
        with pytest.raises(DeviceMismatch, match="indices"):
            h[torch.tensor([0, 1], device="cuda")]
        with pytest.raises(TypeError, match="numpy"):
            d.numpy()
        with pytest.raises(RuntimeError, match="generator"):
            torch.rand(2, device="cuda", generator=torch.Generator())
        assert on_device(d * torch.tensor(2.0))  # a 0-dim host tensor is a scalar, as on CUDA
        assert on_device(torch.arange(3, device=d.device)) and not on_device(torch.arange(3))
        assert dict(acc.counts) == {"h2d": 2}  # .cuda() and torch.tensor(..., device="cuda")
        d[torch.tensor([0])]  # host indices into a device tensor: copied over
        int(d[0]), d.tolist(), bool(d[0] > 0), d.cpu()
        assert dict(acc.counts) == {"h2d": 3, "sync": 4}
        lin = torch.nn.Linear(3, 2).to("cuda")
        assert on_device(lin.weight) and on_device(lin(d))
        with pytest.raises(DeviceMismatch):
            lin(h)


# (what a GPU does, the call) for each read or refusal CUDA makes that no Python call shows
HIDDEN = [
    ("sync", "indexing with a 0-dim device integer", lambda d, h: d[d.argmax()]),
    ("sync", "indexing a row with a 0-dim device integer", lambda d, h: d.reshape(1, 4)[0, d.argmax()]),
    ("sync", "boolean-mask indexing", lambda d, h: d[d > 1]),
    ("sync", "boolean-mask assignment", lambda d, h: d.clone().__setitem__(d > 1, 0.0)),
    ("sync", "nonzero", lambda d, h: (d > 1).nonzero()),
    ("sync", "one-argument where", lambda d, h: torch.where(d > 1)),
    ("sync", "masked_select", lambda d, h: d.masked_select(d > 1)),
    ("sync", "unique", lambda d, h: d.unique()),
    ("sync", "repeat_interleave by device counts", lambda d, h: d.repeat_interleave(d.long())),
    ("sync", "torch.tensor of device scalars", lambda d, h: torch.tensor([d[0], d[1]])),
    ("sync", "host.copy_(device)", lambda d, h: h.copy_(d)),
    ("h2d", "device.copy_(host)", lambda d, h: d.clone().copy_(h)),
    ("raise", "index_select with host indices", lambda d, h: d.index_select(0, torch.tensor([0, 1]))),
    ("raise", "gather with host indices", lambda d, h: d.gather(0, torch.tensor([0, 1]))),
    ("raise", "take with host indices", lambda d, h: d.take(torch.tensor([0, 1]))),
    ("raise", "stacking a 0-dim host tensor with device ones", lambda d, h: torch.stack([d[0], h[0]])),
    ("raise", "multinomial with a host generator", lambda d, h: torch.multinomial(d, 1,
            generator=torch.Generator())),
    ("raise", "uniform_ with a host generator", lambda d, h: d.clone().uniform_(generator=torch.Generator())),
    ("raise", "host numbers from a device generator", lambda d, h: torch.rand(2,
            generator=torch.Generator("cuda"))),
]


@pytest.mark.parametrize("kind,call", [(k, c) for k, _, c in HIDDEN], ids=[n for _, n, _ in HIDDEN])
def test_the_stand_in_sees_what_cuda_does_in_cpp(kind, call):
    """Each call costs a GPU a device -> host read (or a copy, or refuses to run); the stand-in
    counts it (or raises), so a decode loop that uses one shows it in its budget."""
    with FakeCuda() as acc:
        d = torch.tensor([0.5, 1.5, 2.5, 3.5], device="cuda")
        h = torch.zeros(4)
        acc.reset()
        if kind == "raise":
            with pytest.raises((DeviceMismatch, RuntimeError)):
                call(d, h)
            return
        call(d, h)
        assert acc.counts[kind] >= 1, dict(acc.counts)
        # the sync-free forms of the same work cost nothing
        acc.reset()
        i = d.argmax().reshape(1)
        d.index_select(0, i), d[i], torch.where(d > 1, d, torch.zeros_like(d)), torch.stack([d[0], d[1]])
        assert not acc.counts, dict(acc.counts)


def test_timers_must_close_on_a_sync():
    with FakeCuda():
        clock = Clock(torch.device("cuda"))
        a, b = clock.mark(), clock.mark()
        with pytest.raises(RuntimeError):
            clock.seconds(a, b)
        with pytest.raises(RuntimeError, match="sync"):
            a.elapsed_time(b)  # the event itself refuses before a sync
        clock.finish()
        assert clock.seconds(a, b) >= 0


# -- the old code fails under it ------------------------------------------------------------------
def _old_module(name: str, commit: str = "401e1a4"):
    """decoding/<name>.py as it was before this harness (from git), imported inside the package."""
    try:
        src = subprocess.run(["git", "show", f"{commit}:decoding/{name}.py"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout
    except (subprocess.CalledProcessError, FileNotFoundError):
        pytest.skip("git history of the old decode code is not available in this checkout")
    src = src.replace("from .tree import DraftTree, TreeConfig,",
                      "from .config import TreeConfig\nfrom .tree import DraftTree,")
    mod = types.ModuleType(f"decoding._old_{name}")
    mod.__package__ = "decoding"
    moved = {"decoding.cpu_matmul": cpu.matmul, "decoding.cpu_kernel": cpu.kernel,
             "decoding.lean_pass": cpu.lean_pass}
    sys.modules.update({mod.__name__: mod, **moved})  # dataclasses look their module up; old import paths
    try:
        exec(compile(src, f"old:{name}.py", "exec"), mod.__dict__)
    finally:
        for key in [mod.__name__, *moved]:
            del sys.modules[key]
    return mod


def test_the_old_acceptance_mixed_host_drafts_with_device_logits():
    old = _old_module("accept")
    from decoding.tree import chain_tree

    tree = chain_tree([[5, 6], [7]])  # drafting returned the tree on the host
    with FakeCuda():
        target = torch.tensor([5, 6, 0, 0], device="cuda")  # l_tree.argmax(-1) on the verifier's device
        with pytest.raises(DeviceMismatch):
            old.accept_greedy(tree.tokens, tree.parents, tree.depths, target)
        from decoding.accept import accept_greedy

        new = accept_greedy(tree.tokens.cuda(), tree.parents.cuda(), tree.depths.cuda(), target)
        assert new.path == [1, 3] and new.next_token == 0  # nodes parents-first: 5, 7, 6


@pytest.mark.slow
def test_the_old_drafting_indexed_host_ancestry_with_device_rows(verifier, random_drafter_dirs):
    old = _old_module("drafting")
    model, _ = verifier
    with FakeCuda() as acc:
        acc.place(model)
        props = load_proposers(model, random_drafter_dirs[:1], VERIFIER)
        p = old.FeatureDrafterProposer(props[0].drafter, model.get_input_embeddings(), model.lm_head, "old")
        tokens = torch.arange(100, 121, device="cuda")
        feats = torch.randn(20, model.config.hidden_size, device="cuda")
        with pytest.raises(DeviceMismatch):  # fed_anc[frontier_rows] / torch.cat(cand_par) from depth 3 on
            p.draft(tokens, feats, TreeConfig(3, 4, 12), 0.0)
        # today's drafting stays on the device
        tree = props[0].draft(tokens, feats, TreeConfig(3, 4, 12), 0.0)
        assert all(on_device(getattr(tree, f)) for f in ("tokens", "parents", "depths", "path_logp"))


# -- every strategy, on the stand-in, equals the same computation off it ------------------------------
@contextlib.contextmanager
def _plain_cpu(model):
    """The computation the stand-in runs (F.linear, transformers' forward), on the plain CPU."""
    with cpu.matmul_disabled(), cpu.lean_disabled(model):
        yield


CASES = [  # (strategy, drafters, granularity, dedup, budget)
    ("autoregressive", 0, "step", False, False), ("single", 1, "step", False, False),
    ("confidence", 2, "step", False, False), ("confidence", 2, "prompt", False, False),
    ("entropy", 2, "step", False, False), ("merged", 2, "step", False, False),
    ("merged", 2, "step", True, False), ("merged", 2, "step", False, True),
]


def _decode(model, tok, props, prompt, case, temperature, tree, step_costs=None, acc=None, **fields):
    strategy, n, gran, dedup, budget = case
    cfg = DecodeConfig(strategy=strategy, temperature=temperature, max_new_tokens=MAX_NEW,
                       routing_granularity=gran,
                       merge_dedup=dedup, merge_budget=budget, tree=tree, **fields)
    dec = SpeculativeDecoder(model, props[:n], cfg, [tok.eos_token_id])
    if step_costs is not None:  # counts between one step's verify and the next: exactly one whole step
        dec.observer = lambda *_: step_costs.append(dict(acc.counts))
        turn = dec.turn  # decode_prompt runs each turn's coroutine (decoding/runner.prompt_turns)

        def marked(*a, **kw):  # a turn boundary (its prefill and closing sync are not a step)
            step_costs.append(None)
            return (yield from turn(*a, **kw))

        dec.turn = marked
    return [res.output_token_ids for _, res, _ in decode_prompt(dec, tok, prompt)]


def _per_step(snapshots: list) -> list[dict]:
    keys = ("sync", "h2d")
    return [{k: b.get(k, 0) - a.get(k, 0) for k in keys} for a, b in zip(snapshots, snapshots[1:])
            if a is not None and b is not None]


@pytest.fixture(scope="module")
def mt_prompt(bench_prompts):
    return bench_prompts["mt_bench"][0]  # two turns: prefill and multi-turn


def _case_id(c) -> str:
    return f"{c[0]}-{c[2]}{'-dedup' if c[3] else ''}{'-budget' if c[4] else ''}"


# every case at T=0; at T=1 (the sampling acceptance's syncs) the settings test below (the merged tree
# with top-p, per-turn entropy routing with top-k/top-p) and depth_adaptive; the rest in make test-full
DEVICE_CASES = [pytest.param(c, t, id=f"{_case_id(c)}-{t}",
                             marks=[pytest.mark.full] if t == 1.0 else [])
                for t in (0.0, 1.0) for c in CASES]


@pytest.fixture(scope="module")
def greedy(verifier, mt_prompt):
    """The verifier's greedy tokens for the prompt's turns, off the harness (plain CPU)."""
    model, tok = verifier
    with _plain_cpu(model):
        return _decode(model, tok, [], mt_prompt, CASES[0], 0.0, TreeConfig(3, 3, 10))


def _off_harness(model, tok, dirs, prompt, case, temperature, tree, greedy, got, **fields):
    """What the device run must equal: at T=0 the verifier's greedy tokens (lossless), computed once;
    at T=1, or where a near-tie flips between passes of different shapes, the same computation
    off the harness."""
    if temperature == 0.0 and got == greedy:
        return greedy
    with _plain_cpu(model):
        return _decode(model, tok, load_proposers(model, dirs, VERIFIER), prompt, case, temperature, tree,
                       **fields)


@pytest.mark.slow
@pytest.mark.parametrize("case,temperature", DEVICE_CASES)
def test_every_strategy_runs_on_the_device_within_the_step_budget(verifier, random_drafter_dirs, mt_prompt,
                                                                  greedy,
                                                                   case, temperature):
    model, tok = verifier
    tree = TreeConfig(3, 3, 10)
    snaps: list[dict] = []
    with FakeCuda() as acc:
        acc.place(model)
        props = load_proposers(model, random_drafter_dirs, VERIFIER)
        assert model.device.type == "cuda" and all(on_device(p.drafter.fc.weight) for p in props)
        got = _decode(model, tok, props, mt_prompt, case, temperature, tree, snaps, acc)
    want = _off_harness(model, tok, random_drafter_dirs, mt_prompt, case, temperature, tree, greedy, got)
    assert got == want, f"{case} T={temperature}: the device path changed the output"
    steps = _per_step(snaps)
    assert steps, "no decode step was measured"
    worst = {k: max(s[k] for s in steps) for k in ("sync", "h2d")}
    assert worst["sync"] <= SYNC_BUDGET and worst["h2d"] <= COPY_BUDGET, (case, temperature, worst, acc.where)
    assert acc.counts["timer"] > 0  # step timers were read, each after the turn's closing sync


NEXT = {  # the study's proposed next experiments: (case, DecodeConfig fields)
    "switching-k1": (("switching", 2, "step", False, False), {"switch_after": 1}),
    "switching-merged-dedup": (("switching", 2, "step", True, False), {"switch_after": 1,
            "switch_to": "merged"}),
    "depth_adaptive": (("depth_adaptive", 3, "step", False, False), {"switch_depth": 1}),
    # 3 drafters scored per step
    "hedge-carry": (("hedge", 3, "step", False, False), {"hedge_reset": "carry"}),
    # issue 64: every drafter's rollout on the verified path, scored against the verifier's rows (T > 0)
    "hedge-acceptance": (("hedge", 3, "step", False, False), {"hedge_learner": "normalhedge",
                                                              "hedge_feedback": "acceptance",
                                                              "hedge_ties": "stay"}),
}


# the rest in make test-full
NEXT_DEFAULT = {("switching-merged-dedup", 0.0), ("depth_adaptive", 1.0), ("hedge-carry", 0.0),
                ("hedge-acceptance", 1.0)}


@pytest.mark.slow
@pytest.mark.parametrize("name,temperature", [
    pytest.param(n, t, id=f"{n}-{t}", marks=[] if (n, t) in NEXT_DEFAULT else [pytest.mark.full])
    for t in (0.0, 1.0) for n in NEXT])
def test_new_strategies_run_on_the_device_within_the_step_budget(verifier, random_drafter_dirs, mt_prompt,
                                                                 greedy,
                                                                 name, temperature):
    case, fields = NEXT[name]
    dirs = random_drafter_dirs + random_drafter_dirs[:1]  # three drafters
    _device_run_within_budget(verifier, dirs, mt_prompt, greedy, case, temperature, TreeConfig(3, 3, 10),
                              fields,
                              f"{name} T={temperature}")


def _device_run_within_budget(verifier, dirs, prompt, greedy, case, temperature, tree, fields, name):
    """Decode on the stand-in: the same output as off it, and every step within the budget."""
    model, tok = verifier
    snaps: list[dict] = []
    with FakeCuda() as acc:
        acc.place(model)
        props = load_proposers(model, dirs, VERIFIER)
        got = _decode(model, tok, props, prompt, case, temperature, tree, snaps, acc, **fields)
    want = _off_harness(model, tok, dirs, prompt, case, temperature, tree, greedy, got, **fields)
    assert got == want, f"{name}: the device path changed the output"
    worst = {k: max(s[k] for s in _per_step(snaps)) for k in ("sync", "h2d")}
    assert worst["sync"] <= SYNC_BUDGET and worst["h2d"] <= COPY_BUDGET, (name, worst, acc.where)


@pytest.mark.slow  # (T=1 in make test-full)
@pytest.mark.parametrize("case,temperature", [
    pytest.param(CASES[i], t, id=f"{_case_id(CASES[i])}-{t}", marks=[pytest.mark.full] if t else [])
    for t in (0.0, 1.0) for i in (1, 5)])
def test_eagle3_drafters_run_on_the_device_within_the_step_budget(verifier, random_eagle3_dirs, mt_prompt,
                                                                  greedy,
                                                                  case, temperature):
    """EAGLE-3 drafters, single and merged: the verifier passes capture the aux layers on the device
    and each step holds the budget of the other backbones."""
    _device_run_within_budget(verifier, random_eagle3_dirs, mt_prompt, greedy, case, temperature,
                              TreeConfig(3, 3, 10), {}, f"eagle3 {_case_id(case)} T={temperature}")


# the settings the cases above leave at their defaults: (case, temperature, tree, DecodeConfig fields)
OTHER = {
    "confidence-turn-node-score-paper-tree": (("confidence", 2, "turn", False, False), 0.0, TreeConfig(10, 6,
            60),
                                              {"route_score": "node"}),
    "entropy-turn-top-k-top-p": (("entropy", 2, "turn", False, False), 1.0, TreeConfig(3, 3, 10),
                                 {"top_k_sampling": 20, "top_p": 0.9}),
    "merged-top-p": (("merged", 2, "step", False, False), 1.0, TreeConfig(3, 3, 10), {"top_p": 0.8}),
}


# merged-top-p (82 s in the CI run at 166bb9a) in make test-full: entropy's case filters by top-p too
@pytest.mark.slow
@pytest.mark.parametrize("name", [pytest.param(n, marks=[pytest.mark.full] if n == "merged-top-p" else [])
                                  for n in OTHER])
def test_turn_routing_node_scores_top_k_top_p_and_the_papers_tree_hold_the_budget(verifier,
        random_drafter_dirs,
                                                                                   mt_prompt, greedy, name):
    """The study's tree (total 60, depth 6, top-k 10), per-turn routing, the node score and the
    verifier's top-k/top-p filters: same output as off the stand-in, within the same step budget."""
    case, temperature, tree, fields = OTHER[name]
    _device_run_within_budget(verifier, random_drafter_dirs, mt_prompt, greedy, case, temperature, tree,
                              fields, name)


@pytest.mark.slow
def test_the_budget_does_not_grow_with_the_tree_or_the_drafters(verifier, random_drafter_dirs, bench_prompts,
                                                               monkeypatch):
    """Merged trees of 3 drafters x 24 nodes and of 2 x 6 nodes cost the same syncs and copies. A step's
    count is the same whatever the prompt: one turn of a few steps (every step here rejects or accepts
    as in longer runs; the multi-turn budget is the other device tests' mt_prompt)."""
    monkeypatch.setattr(sys.modules[__name__], "MAX_NEW", 5)
    model, tok = verifier
    one_turn = bench_prompts["gsm8k"][0]
    costs = []
    for dirs, tree in ((random_drafter_dirs, TreeConfig(2, 3, 7)),
                       (random_drafter_dirs + random_drafter_dirs[:1],
                                                                     TreeConfig(4, 5, 25))):
        snaps: list[dict] = []
        with FakeCuda() as acc:
            acc.place(model)
            props = load_proposers(model, dirs, VERIFIER)
            _decode(model, tok, props, one_turn, ("merged", len(dirs), "step", True, False), 1.0, tree,
                    snaps, acc)
        assert len(_per_step(snaps)) >= 2, snaps  # at least two whole steps to compare
        costs.append({k: max(s[k] for s in _per_step(snaps)) for k in ("sync", "h2d")})
    assert costs[0] == costs[1], costs


@pytest.mark.slow
def test_tree_auto_calibrates_and_decodes_on_the_device(verifier, random_drafter_dirs, mt_prompt,
                                                        monkeypatch):
    from decoding import autotree
    from decoding.autotree import auto_tree, calibration_inputs

    # the device path of timing passes and calibration, not the size grid or every calibration tree: 3
    # sizes instead of 16 and two of the three trees (a chain and a branching one, both of choose's
    # branches); most of this test's time, each pass slowed by the harness's per-op checks
    monkeypatch.setattr(autotree, "VERIFY_SIZES", (1, 4, 16))
    monkeypatch.setattr(autotree, "CAL_TREES", {k: autotree.CAL_TREES[k] for k in (1, 4)})
    model, tok = verifier
    with FakeCuda() as acc:
        acc.place(model)
        props = load_proposers(model, random_drafter_dirs, VERIFIER)
        choice = auto_tree(model, props[:1], "single", [tok.eos_token_id], calibration_inputs(tok)[:1],
                           max_new_tokens=8, use_cache=False)
        out = _decode(model, tok, props, mt_prompt, ("single", 1, "step", False, False), 0.0, choice.tree)
    assert out and all(out)


# -- the other device paths: features, a training step of both objectives, a merge -------------------
@pytest.mark.slow
def test_features_training_steps_and_merges_run_on_the_device(verifier, bench_prompts):
    import dataclasses

    from drafters.checkpoint import init_drafter
    from drafters.config import DrafterConfig
    from drafters.data.templating import TokenizedExample, benchmark_prompt_ids
    from drafters.features import verifier_features
    from drafters.merge import linear
    from drafters.train.backbones import compute_loss
    from drafters.train.config import TrainConfig
    from drafters.train.eagle2 import collate
    from drafters.vocab import DraftHead

    model, tok = verifier
    examples = []
    for i, b in enumerate(("gsm8k", "mt_bench")):
        ids = benchmark_prompt_ids(tok, bench_prompts[b][0], 0, [])[:48]
        examples.append(TokenizedExample(f"x{i}", ids, [0] * 24 + [1] * (len(ids) - 24)))
    with FakeCuda() as acc:
        acc.place(model)
        # features come back to the host, one copy per batch tensor
        feats = verifier_features(model, examples)
        assert not any(on_device(f.features) for f in feats)
        batch = collate(feats)  # built on the host, as the trainer's batches() does
        head = DraftHead(model.lm_head, None)
        for backbone in ("eagle2", "hass"):
            cfg0 = DrafterConfig.for_verifier(model, VERIFIER, backbone, seed=0)
            drafter = init_drafter(cfg0).to(model.device).train()
            tcfg = TrainConfig(verifier=VERIFIER, backbone=backbone, variant="math", out_dir="unused",
                               train_data=[["unused", "unused", None]], heldout_data=[])
            loss, parts = compute_loss(tcfg, drafter, model.get_input_embeddings(), head, batch,
                                       torch.Generator(device=model.device).manual_seed(0))  # as train's
            assert on_device(loss) and torch.isfinite(loss.detach().cpu())
            loss.backward()
            assert all(on_device(p.grad) for p in drafter.parameters() if p.grad is not None)
        a = {k: v for k, v in init_drafter(dataclasses.replace(cfg0, seed=0)).to("cuda").state_dict().items()}
        b = {k: v for k, v in init_drafter(dataclasses.replace(cfg0, seed=1)).to("cuda").state_dict().items()}
        merged = linear(a, b, 0.5)
        assert all(on_device(v) for v in merged.values() if v.is_floating_point())


@pytest.mark.slow
def test_checkpoints_and_exports_cross_the_device_boundary(verifier, tmp_path):
    """A drafter on the device is saved (as training saves it), exported, and read back onto the device."""
    from common.verifiers import verifier_config
    from drafters.checkpoint import init_drafter, save_checkpoint
    from drafters.config import DrafterConfig
    from drafters.export import export, load_export

    model, _ = verifier
    with FakeCuda() as acc:
        acc.place(model)
        drafter = init_drafter(DrafterConfig.for_verifier(model, VERIFIER, "eagle2", seed=3)).to(model.device)
        path = save_checkpoint(drafter, tmp_path / "ckpt")  # device weights -> one host copy each
        out = export(path, "eagle", tmp_path / "exported", *verifier_config(VERIFIER))
        back = load_export(out).to(model.device)
        assert on_device(back.fc.weight)
        for k, v in drafter.state_dict().items():
            assert torch.equal(back.state_dict()[k].cpu(), v.cpu()), k
