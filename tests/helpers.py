"""Test-only proposers (real Proposer implementations with scripted draft trees)."""
from __future__ import annotations

import warnings

import torch

from decoding.config import TreeConfig
from decoding.tree import chain_tree
from drafters.data.sources import load_corpus, subsample
from drafters.data.templating import tokenize_conversation
from drafters.vocab import count_targets, select_ids


class ConstantProposer:
    """Adversarial: always proposes the same (wrong) tokens, whatever the context."""

    def __init__(self, token: int = 1000, owner: int = 0, name: str = "adversarial"):
        self.token, self.owner, self.name = token, owner, name

    def reset(self):
        pass

    def draft(self, tokens, features, cfg: TreeConfig, temperature):
        t = self.token
        return chain_tree([[t] * cfg.depth, [t + 1, t + 2]], self.owner)

    def predict(self, tokens, features, start: int):
        """hedge's feedback: its top-1 guess for each committed token ``tokens[start:]``
        (always ``token``)."""
        return torch.full((tokens.shape[0] - start,), self.token, dtype=torch.long)


class OracleProposer:
    """Knows the verifier's greedy continuation; proposes a wrong branch first, then the truth.

    Exercises deep acceptance, a non-first accepted child and cache compaction over gaps.
    """

    def __init__(self, prompt_len: int, reference: list[int], owner: int = 0, name: str = "oracle",
                 wrong_first: bool = True):
        self.prompt_len, self.ref, self.owner = prompt_len, reference, owner
        self.name, self.wrong_first = name, wrong_first

    def reset(self):
        pass

    def draft(self, tokens, features, cfg: TreeConfig, temperature):
        done = tokens.shape[0] - self.prompt_len  # committed output tokens incl. the root
        truth = self.ref[done : done + cfg.depth]
        wrong = [(t + 7) % 49152 for t in truth[:2]] or [5]
        paths = ([wrong] if self.wrong_first else []) + ([truth] if truth else [])
        return chain_tree(paths, self.owner)

    def predict(self, tokens, features, start: int):
        """hedge's feedback: the reference's tokens at the committed positions ``tokens[start:]``
        (-1 past its end)."""
        a, b = start - self.prompt_len, tokens.shape[0] - self.prompt_len
        ref = self.ref[a:b]
        return torch.tensor(ref + [-1] * (b - a - len(ref)), dtype=torch.long)


def eagle3_math_batch(model, tok, eos, layers, n_draft: int) -> dict:
    """Three real GSM8K/MATH training conversations (right-padded to one length), the verifier's
    hidden states at ``layers`` concatenated, its logits, and an ``n_draft``-token draft vocabulary
    of their targets: what the EAGLE-3 tests train and check on."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        convs, _ = load_corpus("mathinstruct")
    examples = [tokenize_conversation(tok, c, 80, eos) for c in subsample(convs, 3, seed=7)]
    L = max(len(e.input_ids) for e in examples)
    ids, mask, attn = (torch.zeros(len(examples), L, dtype=torch.long) for _ in range(3))
    for i, e in enumerate(examples):
        n = len(e.input_ids)
        ids[i, :n], mask[i, :n], attn[i, :n] = torch.tensor(e.input_ids), torch.tensor(e.loss_mask), 1
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=attn, output_hidden_states=True)
    aux = torch.cat([out.hidden_states[i] for i in layers], dim=-1).float()
    vocab = select_ids(count_targets(examples, model.config.vocab_size), n_draft, always=eos)
    return {"ids": ids, "mask": mask, "aux": aux, "logits": out.logits.float(), "vocab": vocab,
            "layers": layers}
