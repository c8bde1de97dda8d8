"""Temperature 1 with EAGLE-3 drafters (issue #40): `SpeculativeDecoder.generate` samples the
verifier's own distribution when its trees come from eagle3 checkpoints, and those trees are accepted;
at temperature 0 the same checkpoints' trees are accepted and the output is greedy `generate`'s.

A briefly trained drafter's trees are almost never accepted at T=1 on a test prompt, so a
distribution test with one has no power. The drafters here are real eagle3 checkpoints (saved, loaded
by `load_proposers`, drafting through `Eagle3Proposer` on the aux-layer features the verifier passes
capture, over a reduced draft vocabulary mapped by `d2t`) whose weights are set by hand to a lookup
table: after a root token t, their depth-1 candidates are chosen children of t. The only way the
root enters an EAGLE-3 drafter is the token embedding in its attention, so (`table_eagle3`):
``fc`` writes one functional of the aux features into hidden dim 0, which ``hidden_norm`` turns into
+-sqrt(H); head 0's queries and keys read that dim into low-frequency rotary pairs, so a position's
score with itself exceeds every other by a margin set to 50 (the sign cancels on the diagonal), i.e.
head 0 attends to the newest position; its values are a projection of the normed root embedding,
which ``o_proj`` maps to a one-hot code per likely root (a pseudo-inverse); the MLP is off
(``down_proj`` = 0) and ``lm_head`` scores each root's children. Depth-2 candidates are arbitrary.

Prompt, exact joint p(t1) p(t2 | t1) and statistic are tests/test_sampling_e2e.py's (MT-Bench #63,
200 seeds, Pearson's chi-square under its upper 1e-5 quantile): t2 comes from the first speculative
step, whose tree holds drafter 0's candidates (the verifier's most likely child c1 of t1 and its
third c3) and, merged, drafter 1's (c3 again and c4), so acceptance (101 of 200 first steps,
single and merged, 2026-12-03),
rejection of every candidate and the residual rule all run, and a merged tree's duplicate candidates
are pooled. The same bound catches a broken rule (resample from q instead of the residual): chi-square
0.7 (single) and 1.4 (merged) for the real rule, 34.3 for the broken one, bound 24.7 (2026-12-03).
"""
from __future__ import annotations

import pytest
import torch

import decoding.engine as engine
from decoding.config import TreeConfig
from decoding.engine import DecodeConfig, SpeculativeDecoder
from decoding.runner import load_proposers
from decoding.verifier_pass import new_cache, prefill
from drafters.eagle3 import Eagle3Config, Eagle3Drafter, init_eagle3, save_eagle3
from tests.conftest import VERIFIER
from tests.test_sampling_e2e import N, _broken_sampling, chi2, exact_joint

pytestmark = pytest.mark.slow
TREE = TreeConfig(top_k=2, depth=2, total_tokens=8)
RANKS = ((0, 2), (2, 3))  # drafter i's depth-1 candidates: these ranks of the verifier's children of t1
MAX_POS = 64  # head 0 attends to the newest position in contexts up to this length
N_DRAFT = 1024  # draft vocabulary: the tables' children and the first other ids (as the trained drafter's)
MARGIN = 50.0  # its score with itself exceeds every other by at least this (pre-softmax)
MAX_NEW_T0 = 16  # tokens decoded at temperature 0


@pytest.fixture(scope="module")
def setup(verifier, tmp_path_factory):
    """ids, the exact joint, the verifier's children of each likely t1 (most likely first) and the
    two table drafters' checkpoints."""
    model, tok = verifier
    ids, pairs, _ = exact_joint(model, tok)
    firsts = list(dict.fromkeys(t for t, _ in pairs))
    kids = {t: [c for (a, c), _ in sorted(pairs.items(), key=lambda kv: -kv[1]) if a == t] for t in firsts}
    with torch.no_grad():
        feats, _ = prefill(model, new_cache(), ids, Eagle3Config.for_verifier(model, VERIFIER).aux_layers)
    root = tmp_path_factory.mktemp("table-e3")
    table = [{t: [kids[t][r] for r in ranks] for t in firsts} for ranks in RANKS]
    dirs = [str(save_eagle3(table_eagle3(model, feats, tab), root / f"table-{i}"))
            for i, tab in enumerate(table)]
    return ids, pairs, table, feats, load_proposers(model, dirs, VERIFIER)


@torch.no_grad()
def table_eagle3(model, feats: torch.Tensor, table: dict[int, list[int]]) -> Eagle3Drafter:
    """An eagle3 drafter whose depth-1 candidates after root t are ``table[t]`` in order (see the module
    docstring). ``feats`` (n, 3H): the prompt's aux features, to scale ``fc`` (|hidden dim 0| = 1 at
    the prompt's last position, far above the norm's eps)."""
    kids = {c for cs in table.values() for c in cs}  # padded to N_DRAFT ids (zero rows of lm_head)
    others = [i for i in range(N_DRAFT + len(kids)) if i not in kids]
    vocab = sorted(kids | set(others[: N_DRAFT - len(kids)]))
    cfg = Eagle3Config.for_verifier(model, VERIFIER, draft_vocab_size=N_DRAFT)
    d = init_eagle3(cfg, torch.tensor(vocab))
    layer, h, hd = d.layer, cfg.hidden_size, cfg.head_dim
    for p in d.parameters():
        p.zero_()
    for norm in (layer.input_layernorm, layer.hidden_norm, layer.post_attention_layernorm, d.norm):
        norm.weight.fill_(1.0)
    u = feats.mean(0)
    d.fc.weight[0] = u / float(u @ feats[-1])  # hidden dim 0: one functional of the features
    d.norm.weight[0] = 0.0  # ... which the logits ignore
    inv = 1.0 / cfg.rope_theta ** (torch.arange(0, hd, 2).float() / hd)  # rotary frequencies
    pairs = [j for j in range(hd // 2) if inv[j] * MAX_POS < 2.8]  # cos(k theta) falls over 0 < k < MAX_POS
    k = torch.arange(1, MAX_POS).float()[:, None]
    gap = float((len(pairs) - (k * inv[pairs]).cos().sum(1).abs()).min())  # self score - any other, per c^2
    c = (MARGIN * hd ** 0.5 / gap) ** 0.5 / h ** 0.5  # hidden_norm's dim 0 is +-sqrt(h)
    layer.q_proj.weight[pairs, h] = c
    layer.k_proj.weight[pairs, h] = c
    proj = torch.randn(hd, h, generator=torch.Generator().manual_seed(0))
    layer.v_proj.weight[:hd, :h] = proj  # head 0's value: a projection of the normed token embedding
    roots = list(table)
    emb = model.get_input_embeddings().weight[roots].float()
    codes = proj @ (emb * torch.rsqrt(emb.pow(2).mean(-1, keepdim=True) + cfg.rms_norm_eps)).T  # (hd, R)
    onehot = torch.zeros(h, len(roots))
    onehot[torch.arange(1, len(roots) + 1), torch.arange(len(roots))] = 100.0  # root i -> dim i + 1
    layer.o_proj.weight[:, :hd] = onehot @ torch.linalg.pinv(codes)
    for i, t in enumerate(roots):
        for rank, child in enumerate(table[t]):
            d.lm_head.weight[vocab.index(child), i + 1] = (4.0 - rank) / h ** 0.5
    return d


def _sample(model, eos, setup, strategy):
    """N seeds' first two tokens and how many first speculative steps accepted a drafted token."""
    ids, _, _, _, props = setup
    cfg = DecodeConfig(strategy=strategy, temperature=1.0, max_new_tokens=2, tree=TREE)
    dec = SpeculativeDecoder(model, props[: 1 if strategy == "single" else 2], cfg, eos, prompt_cache=True)
    outs, accepted = [], 0
    for i in range(N):
        res = dec.generate(ids, seed_key=f"s{i}")
        outs.append(tuple(res.output_token_ids[:2]))
        accepted += bool(res.steps[0]["accepted_depth"])
    return outs, accepted


def test_table_drafters_propose_the_tables_children(setup):
    """The construction works: after each likely t1, every drafter's depth-1 candidates are its table's."""
    ids, _, table, feats, props = setup
    for prop, tab in zip(props, table):
        for t, want in tab.items():
            prop.reset()
            tree = prop.draft(torch.tensor(ids + [t]), feats, TREE, 1.0)
            assert tree.tokens[tree.parents == -1].tolist() == want, f"{prop.name} after {t}"


@pytest.mark.parametrize("strategy", ["single", "merged"])
def test_table_trees_are_accepted_and_exact_at_temperature_0(verifier, eos, setup, strategy):
    """T=0 with the same checkpoints: the first step's tree holds the verifier's greedy child of its
    greedy first token (drafter 0's table, rank 0), so a drafted token is accepted, from drafter 0;
    the output is transformers' greedy ``generate``'s token for token (later roots are not in the
    tables: arbitrary candidates, rejected)."""
    model, _ = verifier
    ids = setup[0]
    cfg = DecodeConfig(strategy=strategy, temperature=0.0, max_new_tokens=MAX_NEW_T0, tree=TREE)
    res = SpeculativeDecoder(model, setup[4][: 1 if strategy == "single" else 2], cfg, eos).generate(ids)
    x = torch.tensor([ids])
    ref = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=MAX_NEW_T0)
    assert res.output_token_ids == ref[0, len(ids):].tolist(), f"{strategy}: differs from generate"
    first = res.steps[0]
    assert first["accepted_depth"] >= 1 and first["accepted_owner"] == 0, first


# merged (duplicate candidates pooled) and the broken rule with eagle3 trees: make test-full; the
# default suite keeps single here and both, eagle2, in tests/test_sampling_e2e.py
@pytest.mark.parametrize("strategy", ["single", pytest.param("merged", marks=pytest.mark.full)])
def test_eagle3_trees_are_accepted_and_sample_the_verifier_distribution(verifier, eos, setup, strategy):
    model, _ = verifier
    outs, accepted = _sample(model, eos, setup, strategy)
    stat, bound = chi2(outs, setup[1])
    print(f"{strategy}: {accepted}/{N} first steps accepted a drafted token; "
          f"chi-square {stat:.1f} (bound {bound:.1f})")
    assert 0.3 * N <= accepted <= 0.8 * N, f"{accepted}/{N} accepted: acceptance or rejection barely runs"
    assert stat <= bound, f"{strategy}: chi-square {stat:.1f} > {bound:.1f} against the verifier's joint"


@pytest.mark.full
def test_the_same_bound_catches_a_broken_rule_with_eagle3_trees(verifier, eos, setup, monkeypatch):
    model, _ = verifier
    monkeypatch.setattr(engine, "accept_sampling", _broken_sampling)
    stat, bound = chi2(_sample(model, eos, setup, "single")[0], setup[1])
    print(f"broken rule: chi-square {stat:.1f} (bound {bound:.1f})")
    assert stat > bound, f"the broken rule stayed under the bound ({stat:.1f} <= {bound:.1f}): no power"
