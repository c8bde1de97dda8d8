"""The speculative decoding loop: draft -> verify -> accept -> commit, one loop for every strategy."""
from __future__ import annotations

import time
import zlib
from dataclasses import dataclass, field

import torch

from .accept import LazyRows, accept_greedy, accept_sampling, entropy, logits_to_probs, sample
from .drafting import Proposer
from .strategies import GRANULARITIES, make_strategy
from .tree import TreeConfig
from .verifier_pass import commit_path, new_cache, prefill, tree_forward


@dataclass(frozen=True)
class DecodeConfig:
    strategy: str = "single"
    temperature: float = 0.0
    max_new_tokens: int = 128
    seed: int = 42
    routing_granularity: str = "step"  # step | turn | prompt (see strategies._Routed)
    routing_decide_steps: int = 1  # turn/prompt granularity: verifier calls whose scores decide the route
    merge_dedup: bool = False  # merged trees: plain concatenation (study) or trie (deduplicated)
    merge_budget: bool = False  # merged trees: rerank the union to tree.total_tokens (budget-matched)
    top_k_sampling: int | None = None  # optional verifier top-k filter (temperature > 0)
    top_p: float | None = None  # optional verifier top-p filter (temperature > 0)
    tree: TreeConfig = field(default_factory=TreeConfig)

    def __post_init__(self):
        if not isinstance(self.temperature, (int, float)) or self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a positive int, got {self.max_new_tokens!r}")
        if self.routing_granularity not in GRANULARITIES:
            raise ValueError(f"routing_granularity must be one of {list(GRANULARITIES)}, got {self.routing_granularity!r}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")


@dataclass
class TurnResult:
    output_token_ids: list[int]
    verifier_calls: int
    new_tokens: int
    wall_time_s: float
    steps: list[dict]
    baseline: tuple | None = None  # (token ids, seconds) of transformers' generate on the same input, if timed

    @property
    def acceptance_length(self) -> float:
        return self.new_tokens / self.verifier_calls if self.verifier_calls else float("nan")


def prompt_seed(seed: int, key: str) -> int:
    """A per-(prompt, turn) seed, so results do not depend on sharding or order."""
    return (seed * 1_000_003 + zlib.crc32(key.encode())) % (2**63)


class SpeculativeDecoder:
    """Decode with a verifier, a list of proposers and a strategy (by name)."""

    def __init__(self, model, proposers: list[Proposer], config: DecodeConfig, eos_ids: list[int],
                 prompt_cache: bool = False):
        self.model, self.proposers, self.cfg = model, list(proposers), config
        # prompt_cache: keep the last prompt's prefill (keys/values, features, last logits) and reuse a
        # copy when the same prompt comes again (n samples of one prompt). Off by default: eval and
        # bench time every prefill, as transformers' generate pays it.
        self._prompt = {} if prompt_cache else None
        self.eos = set(eos_ids)
        self.strategy = make_strategy(config.strategy, len(self.proposers), config.routing_granularity, config.merge_dedup,
                                      config.routing_decide_steps, config.merge_budget)
        self.max_positions = getattr(model.config, "max_position_embeddings", None)
        self.observer = None  # optional callback(tree, verifier argmax (N+1,), proposal) per step (tree auto)

    def _next_dist(self, logits: torch.Tensor) -> torch.Tensor:
        if self.cfg.temperature == 0:
            return logits.float().softmax(-1)
        return logits_to_probs(logits, self.cfg.temperature, self.cfg.top_k_sampling, self.cfg.top_p)

    def _first_token(self, logits: torch.Tensor, gen: torch.Generator) -> int:
        if self.cfg.temperature == 0:
            return int(logits.argmax())
        return sample(self._next_dist(logits), gen)

    def _prefill(self, input_ids: list[int]):
        """(cache holding the prompt, its features (n, H), the last position's logits (1, V))."""
        key, memo = tuple(input_ids), self._prompt
        if memo is not None and memo.get("key") == key:
            cache = new_cache()
            for i, (k, v) in enumerate(memo["kv"]):
                cache.update(k.clone(), v.clone(), i)
            return cache, memo["feats"], memo["logits"]
        cache = new_cache()
        feats, logits = prefill(self.model, cache, input_ids)  # (n, H), (1, V)
        if memo is not None:
            kv = [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]
            self._prompt = {"key": key, "kv": kv, "feats": feats, "logits": logits[-1:]}
        return cache, feats, logits[-1:]

    def start_prompt(self) -> None:
        """A new prompt begins (its turns follow): prompt-level routing decides afresh."""
        self.strategy.start_prompt()

    @torch.no_grad()
    def generate(self, input_ids: list[int], seed_key: str = "") -> TurnResult:
        """Generate one assistant turn after ``input_ids`` (a fully templated prompt)."""
        if not input_ids:
            raise ValueError("empty prompt")
        if self.max_positions and len(input_ids) + self.cfg.max_new_tokens + self.cfg.tree.depth + 1 > self.max_positions:
            raise ValueError(f"prompt of {len(input_ids)} tokens + {self.cfg.max_new_tokens} new tokens exceeds the "
                             f"verifier's context of {self.max_positions} positions")
        gen = torch.Generator().manual_seed(prompt_seed(self.cfg.seed, seed_key))
        t_start = time.perf_counter()
        # 0. prefill: the prompt enters the verifier cache; its last logits give the first token
        cache, feats, logits = self._prefill(input_ids)  # cache, (n, H), (1, V)
        # verifier features of every token in the cache, in a buffer with room for the whole turn
        cap = len(input_ids) + self.cfg.max_new_tokens + 1
        features = feats.new_empty(cap, feats.shape[-1])
        features[: len(input_ids)] = feats
        tokens = list(input_ids) + [self._first_token(logits[-1], gen)]
        out = tokens[len(input_ids):]
        for p in self.proposers:
            p.reset()
        self.strategy.start_turn()
        steps, calls, new_tokens = [], 0, 0
        while out[-1] not in self.eos and len(out) < self.cfg.max_new_tokens:
            n = len(tokens) - 1  # tokens in the cache; tokens[n] is the root
            # 1. draft: the strategy asks its drafters for one tree
            t0 = time.perf_counter()
            tok_t = torch.tensor(tokens)
            prop = self.strategy.propose(self.proposers, tok_t, features[:n], self.cfg.tree, self.cfg.temperature)
            tree = prop.tree
            # 2. verify: one verifier pass over [root] + tree nodes
            t1 = time.perf_counter()
            f_tree, l_tree = tree_forward(self.model, cache, n, tokens[n], tree.tokens, tree.parents, tree.depths)
            t2 = time.perf_counter()
            if self.observer is not None:
                self.observer(tree, l_tree.argmax(-1), prop)
            # 3. accept: greedy chain (T = 0: the argmax only) or multi-candidate rejection sampling
            #    (T > 0: q is computed only for the rows the walk visits)
            if self.cfg.temperature == 0:
                acc = accept_greedy(tree.tokens, tree.parents, tree.depths, l_tree.argmax(-1))
            else:
                acc = accept_sampling(tree.tokens, tree.parents, LazyRows(self._next_dist, l_tree), gen)
            # 4. commit: the cache keeps exactly prefix + root + accepted path
            committed = [int(tree.tokens[i - 1]) for i in acc.path] + [acc.next_token]
            committed = committed[: self.cfg.max_new_tokens - len(out)]
            for j, t in enumerate(committed):  # stop at the first end-of-turn token
                if t in self.eos:
                    committed = committed[: j + 1]
                    break
            path = ([0] + acc.path)[: len(committed)]  # [root] + accepted nodes that were committed
            commit_path(cache, n, path)
            features[n : n + len(path)] = f_tree[path]
            tokens += committed
            out += committed
            calls += 1
            new_tokens += len(committed)
            t3 = time.perf_counter()
            steps.append(self._step_record(calls - 1, tree, prop, acc, l_tree, committed, t1 - t0, t2 - t1, t3 - t2))
        wall = time.perf_counter() - t_start
        self.last_cache = cache  # kept for inspection (tests compare it with a fresh prefill)
        return TurnResult(out, calls, new_tokens, wall, steps)

    def _step_record(self, step, tree, prop, acc, l_tree, committed, t_draft, t_verify, t_book) -> dict:
        rows = [0] + acc.path  # the parents of the accepted nodes and of the first rejected one
        if acc.rejected is not None:
            rows.append(int(tree.parents[acc.rejected - 1]) + 1)  # (pooled copies: maybe off the path)
        rows = sorted(set(rows))
        ent_q = dict(zip(rows, entropy(self._next_dist(l_tree[rows])).tolist()))  # verifier entropy there
        par1 = (tree.parents + 1).tolist()  # 1-based parent of each node
        acc_nodes = acc.path
        last = acc_nodes[-1] if acc_nodes else 0
        has_child_below = any(p == last for p in par1)
        depth_accept = [True] * len(acc_nodes) + ([False] if has_child_below else [])
        rej = acc.rejected
        owner = int(tree.owner[acc_nodes[-1] - 1]) if acc_nodes else -1
        return {
            "step": step,
            "tree_size": tree.size,
            "committed": len(committed),
            "accepted_depth": len(acc_nodes),
            "chosen_drafter": prop.chosen,
            "accepted_owner": owner,
            "accepted_owner_mask": int(tree.owner_mask[acc_nodes[-1] - 1]) if acc_nodes else 0,
            "drafter_mean_confidence": prop.mean_confidence,
            "drafter_mean_entropy": prop.mean_entropy,
            "accepted_draft_entropy": [float(tree.draft_entropy[i - 1]) for i in acc_nodes],
            "accepted_verifier_entropy": [float(ent_q[par1[i - 1]]) for i in acc_nodes],
            "rejected_draft_entropy": None if rej is None else float(tree.draft_entropy[rej - 1]),
            "rejected_verifier_entropy": None if rej is None else float(ent_q[par1[rej - 1]]),
            "depth_accept": depth_accept,
            "t_draft_s": t_draft,
            "t_verify_s": t_verify,
            "t_bookkeeping_s": t_book,
        }
