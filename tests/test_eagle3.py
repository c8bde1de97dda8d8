"""The EAGLE-3 drafter on the real verifier's three-layer features: its config refuses what cannot
work, the unrolled training forward equals drafting (step 0 and the later steps, with a KV cache),
and 20 optimizer steps of the training-time-test loss lower it and raise step-0 top-1."""
from __future__ import annotations

import pytest
import torch

from drafters.eagle3 import Eagle3Config, default_aux_layers, init_eagle3, load_eagle3, save_eagle3
from drafters.model import KVCache, causal_mask
from drafters.train.eagle3 import ttt_loss, ttt_mask, ttt_unroll
from tests.conftest import VERIFIER
from tests.helpers import eagle3_math_batch

N_DRAFT = 1024


@pytest.fixture(scope="module")
def batch(verifier, eos):
    """Three real GSM8K/MATH training conversations (right-padded to one length), the verifier's
    hidden states of the reference's three layers and its logits."""
    model, tok = verifier
    return eagle3_math_batch(model, tok, eos, default_aux_layers(model.config.num_hidden_layers), N_DRAFT)


def _drafter(verifier, batch, seed=0, **kw):
    model, _ = verifier
    cfg = Eagle3Config.for_verifier(model, VERIFIER, seed=seed, draft_vocab_size=N_DRAFT, **kw)
    return init_eagle3(cfg, batch["vocab"], model.get_output_embeddings().weight)


def test_config_takes_the_reference_layers_and_refuses_bad_ones(verifier):
    model, _ = verifier
    cfg = Eagle3Config.for_verifier(model, VERIFIER)
    assert cfg.aux_layers == (2, 15, 27) and cfg.ttt_steps == 7 and cfg.ttt_decay == 0.8  # SmolLM2: 30 layers
    for bad in ((2, 2, 27), (2, 15, 31), (), (-1, 3, 4)):
        with pytest.raises(ValueError, match="aux_layers"):
            Eagle3Config.for_verifier(model, VERIFIER, aux_layers=bad)
    with pytest.raises(ValueError, match="draft_vocab_size"):
        Eagle3Config.for_verifier(model, VERIFIER, draft_vocab_size=10 ** 6)
    with pytest.raises(ValueError, match="ttt_decay"):
        Eagle3Config.for_verifier(model, VERIFIER, ttt_decay=0.0)


def test_ttt_mask_is_causal_then_diagonal():
    m = ttt_mask(3, 2)
    assert m.shape == (3, 9)
    assert torch.equal(m[:, :3], torch.ones(3, 3, dtype=torch.bool).tril())
    eye = torch.eye(3, dtype=torch.bool)
    assert torch.equal(m[:, 3:6], eye) and torch.equal(m[:, 6:], eye)


def test_unrolled_training_forward_equals_drafting(verifier, batch):
    """Step 0 of the unroll is ``draft_step`` over the sequence; step k of row t is what a drafter
    with a KV cache of rows 0..t drafts k tokens on, feeding back its own hidden state."""
    model, _ = verifier
    embed = model.get_input_embeddings()
    drafter = _drafter(verifier, batch, seed=3).eval()
    ids, aux = batch["ids"][:1], batch["aux"][:1]
    t_len = ids.shape[1] - 1
    with torch.no_grad():
        steps = ttt_unroll(drafter, embed, aux, ids, steps=3)
        logits0, _ = drafter.draft_step(embed(ids[:, 1:]), drafter.fuse(aux[:, :-1]), torch.arange(t_len),
                                        causal_mask(t_len))
        torch.testing.assert_close(steps[0], logits0, rtol=1e-5, atol=1e-5)
        for row in (5, 20):
            cache = KVCache()
            prefix = drafter.fuse(aux[:, : row + 1])
            _, hidden = drafter.draft_step(embed(ids[:, 1: row + 2]), prefix, torch.arange(row + 1),
                                           causal_mask(row + 1), cache=cache)
            h = hidden[:, -1:]
            for k in (1, 2):  # token x_{row+1+k}, rope position row+k, the cache holds every earlier key
                lg, h = drafter.draft_step(embed(ids[:, row + 1 + k: row + 2 + k]), h,
                                           torch.tensor([row + k]),
                                           causal_mask(1, past=len(cache)), cache=cache)
                torch.testing.assert_close(steps[k][:, row], lg[:, 0], rtol=1e-4, atol=1e-4)


def test_ttt_training_lowers_the_loss_and_raises_step0_agreement(verifier, batch, tmp_path):
    model, _ = verifier
    embed = model.get_input_embeddings()
    drafter = _drafter(verifier, batch, seed=0)
    args = (embed, batch["aux"], batch["ids"], batch["logits"], batch["mask"])
    with torch.no_grad():
        loss0, stats0 = ttt_loss(drafter, *args)
    assert len(stats0["loss"]) == 7 and all(n > 0 for n in stats0["rows"])
    opt = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=2e-3)
    torch.manual_seed(0)
    for _ in range(20):
        loss, _ = ttt_loss(drafter, *args)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        loss1, stats1 = ttt_loss(drafter, *args)
    assert float(loss1) < 0.7 * float(loss0), (float(loss0), float(loss1))
    assert stats1["top1"][0] > stats0["top1"][0] + 0.1, (stats0["top1"], stats1["top1"])
    # the checkpoint round trip keeps every weight
    back = load_eagle3(save_eagle3(drafter, tmp_path / "e3"))
    assert back.config == drafter.config
    for k, v in drafter.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k
