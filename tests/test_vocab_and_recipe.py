"""Reduced draft vocabulary and the reference training recipe, on hand-made tensors (no verifier)."""
from __future__ import annotations

import pytest
import torch

from drafters.checkpoint import init_drafter, load_checkpoint, save_checkpoint
from drafters.config import DrafterConfig
from drafters.merge import merge_checkpoints
from drafters.train.backbones import clamp_grads_by_value, compute_loss, lr_factor
from drafters.train.config import TrainConfig
from drafters.train.data import batches
from drafters.train.eagle2 import AlignedBatch, aligned_passes, eagle_losses, noise
from drafters.vocab import DraftHead, count_targets, d2t_of, ids_of, load_vocab, save_vocab, select_ids

V, H = 50, 16
CFG = DrafterConfig(backbone="hass", verifier="toy", hidden_size=H, vocab_size=V, num_attention_heads=4,
                    num_key_value_heads=2, intermediate_size=32, seed=0)
IDS = torch.tensor([0, 2, 3, 7, 11, 20, 31, 49])


class Ex:
    def __init__(self, ids, mask):
        self.input_ids, self.loss_mask = ids, mask


def test_select_ids_most_frequent_targets_with_end_of_turn_always_in(tmp_path):
    exs = [Ex([5, 5, 6, 7, 9], [0, 1, 1, 1, 0]), Ex([6, 6, 8, 1], [1, 1, 1, 0])]  # targets: 5,6,7,6,6,8
    counts = count_targets(exs, 10)
    assert counts.tolist() == [0, 0, 0, 0, 0, 1, 3, 1, 1, 0]  # 9 and 1 sit at non-assistant positions
    ids = select_ids(counts, 3, always=[2])
    assert ids.tolist() == [2, 5, 6]  # 2 forced in; then 6 (3x); then 5/7/8 tie -> the lower id, 5
    ids = select_ids(counts, 4, always=[2])
    assert ids.tolist() == [2, 5, 6, 7]
    assert torch.equal(ids_of(d2t_of(ids)), ids)
    assert d2t_of(ids).tolist() == [2, 4, 4, 4]  # EAGLE-3's offsets: draft i -> verifier i + d2t[i]
    with pytest.raises(ValueError, match="cannot hold"):
        select_ids(counts, 1, always=[0, 2])
    p = save_vocab(ids, tmp_path / "v.safetensors", {"size": 4})
    assert torch.equal(load_vocab(p), ids)


def test_select_ids_ties_break_to_the_lower_id():
    assert select_ids(torch.tensor([0, 2, 2, 2, 0]), 2).tolist() == [1, 2]


def test_draft_head_slices_the_lm_head_and_maps_ids_back():
    lm = torch.nn.Linear(H, V, bias=False)
    head = DraftHead(lm, IDS)
    h = torch.randn(3, H)
    torch.testing.assert_close(head(h), lm(h)[:, IDS])
    assert head.to_verifier(torch.tensor([0, 3, 7])).tolist() == [0, 7, 49]
    full = DraftHead(lm, None)
    torch.testing.assert_close(full(h), lm(h))
    assert full.size == V and head.size == len(IDS)


def test_soft_ce_target_is_q_renormalised_over_the_draft_vocab_and_topk_drops_outside_ids():
    torch.manual_seed(0)
    lm = torch.nn.Linear(H, V, bias=False)
    head = DraftHead(lm, IDS)
    pred, target = torch.randn(1, 2, H), torch.randn(1, 2, H)
    mask = torch.ones(1, 2, dtype=torch.bool)
    top_ids = torch.tensor([[[2, 5, 49], [1, 4, 6]]])  # 5, 1, 4, 6 are outside the draft vocabulary
    top_probs = torch.tensor([[[0.5, 0.3, 0.1], [0.6, 0.2, 0.1]]])
    v, p, t, logp = eagle_losses(pred, target, head, mask, top_ids, top_probs)
    q = lm(target[0]).softmax(-1)[:, IDS]
    q = q / q.sum(-1, keepdim=True)  # restricted and renormalised
    ref_logp = lm(pred[0])[:, IDS].log_softmax(-1)
    torch.testing.assert_close(logp, ref_logp)
    torch.testing.assert_close(p, -(q * ref_logp).sum(-1).mean())
    # top-K: position 0 keeps ids 2 (draft 1) and 49 (draft 7); position 1 keeps nothing
    ref_t = -(0.5 * ref_logp[0, 1] + 0.1 * ref_logp[0, 7] + 0.0) / 2
    torch.testing.assert_close(t, ref_t)


def test_checkpoint_stores_the_map_and_merges_share_it(tmp_path):
    cfg = DrafterConfig(**{**CFG.to_dict(), "draft_vocab_size": len(IDS)})
    a, b = init_drafter(cfg, IDS), init_drafter(DrafterConfig(**{**cfg.to_dict(), "seed": 1}), IDS)
    pa, pb = save_checkpoint(a, tmp_path / "a"), save_checkpoint(b, tmp_path / "b")
    back = load_checkpoint(pa, dtype=torch.bfloat16)
    assert back.d2t.dtype == torch.long and torch.equal(back.draft_ids(), IDS)
    m = load_checkpoint(merge_checkpoints("linear", [str(pa), str(pb)], str(tmp_path / "m"), lam=0.5))
    assert torch.equal(m.draft_ids(), IDS)
    base = save_checkpoint(init_drafter(cfg, IDS), tmp_path / "base")
    t = load_checkpoint(merge_checkpoints("ties", [str(pa), str(pb)], str(tmp_path / "t"), base=str(base)))
    assert torch.equal(t.draft_ids(), IDS)
    other = init_drafter(DrafterConfig(**{**cfg.to_dict(), "seed": 2}), IDS + 0)
    other.d2t[0] += 1  # a different vocabulary of the same size
    po = save_checkpoint(other, tmp_path / "o")
    with pytest.raises(ValueError, match="different draft vocabularies"):
        merge_checkpoints("linear", [str(pa), str(po)], str(tmp_path / "bad"), lam=0.5)
    full = save_checkpoint(init_drafter(CFG), tmp_path / "full")
    with pytest.raises(ValueError, match="draft_vocab_size"):
        merge_checkpoints("linear", [str(pa), str(full)], str(tmp_path / "bad2"), lam=0.5)
    with pytest.raises(ValueError, match="draft_ids must be given"):
        init_drafter(cfg)


# ---------------------------------------------------------------- the reference recipe (#12)

def _batch(T=6, B=1, lengths=None):
    torch.manual_seed(0)
    feats = torch.randn(B, T, H)
    return AlignedBatch(torch.randint(0, V, (B, T)), feats, feats.clone(), torch.randint(0, V, (B, T, 3)),
                        torch.rand(B, T, 3), torch.ones(B, T, dtype=torch.bool),
                        torch.tensor(lengths or [T + 1] * B))


def test_hass_gradient_reaches_k_proj_through_a_later_pass_keys():
    """HASS recomputes keys/values of pass 2 on detached inputs; they keep their graph, so the loss
    of pass 3 sends a gradient into k_proj's output of pass 2 (the old code detached them)."""
    model = init_drafter(CFG)
    embed = torch.nn.Embedding(V, H)
    outs = []
    model.layer.k_proj.register_forward_hook(lambda mod, inp, out: outs.append(out))
    preds = aligned_passes(model, embed, _batch(), 3)
    assert len(outs) == 3
    g = torch.autograd.grad(preds[2].sum(), outs[1], allow_unused=True)[0]
    assert g is not None and float(g.abs().sum()) > 0


def test_noise_is_scaled_by_each_example_own_length():
    f = torch.zeros(2, 40, H)
    out = noise(f, torch.Generator().manual_seed(0), torch.tensor([10, 41]))
    # (U - 0.5) * 0.2 * 512 / L: |noise| <= 5.12 for L=10, <= 1.25 for L=41, whatever the padding
    assert 3.0 < float(out[0].abs().max()) <= 5.12 + 1e-5
    assert float(out[1].abs().max()) <= 0.2 * 512 / 41 / 2 + 1e-5


def test_lr_warms_up_then_decays_linearly_to_zero():
    lrs = [lr_factor(s, 10, 2, "linear") for s in range(11)]
    assert lrs[0] == 0.5 and lrs[1] == 1.0 and lrs[2] == 1.0
    assert lrs[6] == pytest.approx(0.5) and lrs[10] == 0.0
    assert all(a >= b for a, b in zip(lrs[1:], lrs[2:]))
    assert lr_factor(7, 10, 2, "constant") == 1.0


def test_gradients_are_clipped_by_value():
    model = init_drafter(CFG)
    clamp_grads_by_value(model, 0.01)
    (model.fc.weight.sum() * 100).backward()
    assert float(model.fc.weight.grad.abs().max()) == pytest.approx(0.01)


def test_hass_top_k_term_only_in_the_second_stage():
    model = init_drafter(CFG)
    embed = torch.nn.Embedding(V, H)
    head = DraftHead(torch.nn.Linear(H, V, bias=False), None)
    cfg = TrainConfig(verifier="toy", backbone="hass", variant="math", out_dir="x", train_data=[["r", "k",
            None]],
                      feature_noise=False)
    b = _batch()
    first, _ = compute_loss(cfg, model, embed, head, b, None, use_topk=False)
    second, _ = compute_loss(cfg, model, embed, head, b, None, use_topk=True)
    assert float(second.detach()) > float(first.detach())  # the top-K CE (> 0) joins the loss


def test_length_buckets_cut_padding_and_keep_every_example():
    class FE:
        def __init__(self, i, n):
            self.id, self.input_ids = str(i), torch.zeros(n, dtype=torch.long)
            self.loss_mask = torch.ones(n, dtype=torch.bool)
            self.features, self.top_ids, self.top_probs = torch.zeros(n, 4), torch.zeros(n, 2,
                    dtype=torch.int32), torch.zeros(n, 2)

    import drafters.train.data as tr

    exs = [FE(i, n) for i, n in enumerate([5, 60, 6, 61, 7, 62, 8, 63] * 4)]
    orig = tr.iter_examples
    tr.iter_examples = lambda data, seed, online=None, **kw: iter(exs)
    try:
        plain = list(batches([], 4, 0, bucket=False))
        bucketed = list(batches([], 4, 0, bucket=True))
    finally:
        tr.iter_examples = orig
    rows = lambda bs: sum(b.mask.numel() for b in bs)  # noqa: E731
    real = lambda bs: sum(int(b.lengths.sum()) - b.lengths.numel() for b in bs)  # noqa: E731
    assert real(plain) == real(bucketed)  # the same examples
    assert rows(bucketed) < 0.7 * rows(plain)


def test_loss_mask_modes_next_and_reference_differ_by_one_position():
    from drafters.train.eagle2 import align

    ids = torch.arange(8)
    feats = torch.randn(8, 4)
    mask = torch.tensor([0, 0, 0, 1, 1, 1, 0, 0])  # an answer of three tokens (its end-of-turn last)
    nxt = align(ids, feats, mask)["mask"]
    ref = align(ids, feats, mask, mask_mode="reference")["mask"]
    # position t: input (f_t, x_{t+1}); next = x_{t+1} is the assistant's; reference = x_t is
    assert nxt.int().tolist() == [0, 0, 1, 1, 1, 0, 0] and ref.int().tolist() == [0, 0, 0, 1, 1, 1, 0]
    with pytest.raises(ValueError, match="loss mask mode"):
        align(ids, feats, mask, mask_mode="shifted")
