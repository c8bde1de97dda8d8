"""The speculative decoding loop: draft -> verify -> accept -> commit, one loop for every strategy."""
from __future__ import annotations

import zlib
from dataclasses import dataclass

import torch

from decoding.accept import accept_greedy, accept_sampling, entropy, logits_to_probs, sample
from decoding.config import DecodeConfig
from decoding.device import to_device
from decoding.drafting import Proposer, feature_layers
from decoding.rounds import DraftRound, run_round
from decoding.strategies import strategy_for
from decoding.timing import Clock
from decoding.verifier_pass import commit_path, new_cache, prefill, tree_forward


@dataclass
class TurnResult:
    output_token_ids: list[int]
    verifier_calls: int
    new_tokens: int
    wall_time_s: float
    steps: list[dict]
    # (token ids, seconds) of transformers' generate on the same input, if timed
    baseline: tuple | None = None

    @property
    def acceptance_length(self) -> float:
        return self.new_tokens / self.verifier_calls if self.verifier_calls else float("nan")


@dataclass
class VerifyRequest:
    """One step's tree, waiting for its verifier pass: the prompt's cache (``prefix_len`` committed
    tokens), the root (the last committed token, a 1-element tensor on the model's device), the tree."""
    cache: object
    prefix_len: int
    root: torch.Tensor
    tree: object

    def run(self, model, layers) -> tuple:
        """This tree's pass alone: (features (N+1, F), logits (N+1, V))."""
        t = self.tree
        return tree_forward(model, self.cache, self.prefix_len, self.root, t.tokens, t.parents, t.depths,
                            layers)


def run_alone(turn, model, layers):
    """Drive a ``SpeculativeDecoder.turn`` coroutine with each tree's pass and each draft round by
    itself; its TurnResult."""
    clock = Clock(model.device)
    try:
        req = next(turn)
        while True:
            if isinstance(req, DraftRound):
                req = turn.send(run_round(req.calls))
                continue
            v0 = clock.mark()
            f, logits = req.run(model, layers)
            req = turn.send((f, logits, v0, clock.mark()))
    except StopIteration as done:
        return done.value


def prompt_seed(seed: int, key: str) -> int:
    """A per-(prompt, turn) seed, so results do not depend on sharding or order."""
    return (seed * 1_000_003 + zlib.crc32(key.encode())) % (2**63)


class SpeculativeDecoder:
    """Decode with a verifier, a list of proposers and a strategy (by name).

    Device discipline: the verifier, the drafters and every tree live on the model's device; the
    host keeps the committed token list. They meet at one boundary per step (``_commit``): one read
    of the acceptance walk, one copy of the committed tokens and path indices to the device, one
    read of the step record (hedge's drafter scores ride on it). Routing adds one read (which
    tree), a trie merge one read and one copy; T > 0 one copy of the walk's uniforms."""

    def __init__(self, model, proposers: list[Proposer], config: DecodeConfig, eos_ids: list[int],
                 prompt_cache: bool = False):
        self.model = model
        self.proposers = list(proposers)
        self.cfg = config
        # the verifier features the drafters read: None = the last hidden state (EAGLE-2/HASS), else the
        # hidden states at these output_hidden_states indices (EAGLE-3); a mix is refused here
        self.layers = feature_layers(self.proposers)
        # prompt_cache: keep the last prompt's prefill (keys/values, features, last logits) and reuse a
        # copy when the same prompt comes again (n samples of one prompt). Off by default: eval and
        # bench time every prefill, as transformers' generate pays it.
        self._prompt = {} if prompt_cache else None
        self.eos = set(eos_ids)
        self.strategy = strategy_for(config, len(self.proposers))
        self.strategy.check(self.proposers)
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
        """(cache holding the prompt, its features (n, F), the last position's logits (1, V))."""
        key, memo = tuple(input_ids), self._prompt
        if memo is not None and memo.get("key") == key:
            cache = new_cache()
            for i, (k, v) in enumerate(memo["kv"]):
                cache.update(k.clone(), v.clone(), i)
            return cache, memo["feats"], memo["logits"]
        cache = new_cache()
        feats, logits = prefill(self.model, cache, input_ids, self.layers)  # (n, F), (1, V)
        if memo is not None:
            kv = [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]
            self._prompt = {"key": key, "kv": kv, "feats": feats, "logits": logits[-1:]}
        return cache, feats, logits[-1:]

    def start_prompt(self) -> None:
        """A new prompt begins (its turns follow): prompt-level routing decides afresh."""
        self.strategy.start_prompt()

    def _check_prompt(self, input_ids: list[int]) -> None:
        if not input_ids:
            raise ValueError("empty prompt")
        # the most a turn may fill
        positions = len(input_ids) + self.cfg.max_new_tokens + self.cfg.tree.depth + 1
        if self.max_positions and positions > self.max_positions:
            raise ValueError(f"prompt of {len(input_ids)} tokens + {self.cfg.max_new_tokens} new tokens "
                             "exceeds the "
                             f"verifier's context of {self.max_positions} positions")

    def _begin_turn(self, input_ids: list[int], gen: torch.Generator, seed_key: str = "") -> tuple:
        """0. prefill: the prompt enters the verifier cache; its last logits give the first token; the
        strategy starts its turn (its own draws seeded from the turn's key, never ``gen``).
        Returns (cache, features (cap, F), tokens on the host, the same tokens on the device)."""
        dev = self.model.device
        cache, feats, logits = self._prefill(input_ids)  # cache, (n, F), (1, V)
        # verifier features of every token in the cache, in a buffer with room for the whole turn
        cap = len(input_ids) + self.cfg.max_new_tokens + 1
        features = feats.new_empty(cap, feats.shape[-1])
        features[: len(input_ids)] = feats
        tokens = list(input_ids) + [self._first_token(logits[-1], gen)]
        tok_dev = torch.empty(cap + 1, dtype=torch.long, device=dev)  # the same tokens on the device
        tok_dev[: len(tokens)] = to_device(torch.tensor(tokens), dev)
        for p in self.proposers:
            p.reset()
        self.strategy.seed_turn(prompt_seed(self.cfg.seed, "route:" + seed_key))  # its own draws (hedge)
        self.strategy.start_turn()
        return cache, features, tokens, tok_dev

    @torch.no_grad()
    def generate(self, input_ids: list[int], seed_key: str = "") -> TurnResult:
        """Generate one assistant turn after ``input_ids`` (a fully templated prompt), meeting the
        device once per step (the class docstring's device discipline)."""
        return run_alone(self.turn(input_ids, seed_key), self.model, self.layers)

    @torch.no_grad()
    def turn(self, input_ids: list[int], seed_key: str = ""):
        """``generate`` as a coroutine: yields one :class:`VerifyRequest` per step and is sent back
        (features, logits, pass start mark, pass end mark) of that tree's verifier pass, and before it
        the step's ``rounds.DraftRound``s, each sent back its answers (``rounds.run_round``);
        returns the TurnResult. ``run_alone`` runs each pass and round by itself; decoding/batch.py
        runs those of several prompts' turns together."""
        self._check_prompt(input_ids)
        gen = torch.Generator().manual_seed(prompt_seed(self.cfg.seed, seed_key))
        dev = self.model.device
        clock = Clock(dev)
        t_start = clock.mark()
        cache, features, tokens, tok_dev = self._begin_turn(input_ids, gen, seed_key)  # 0. prefill
        out = tokens[len(input_ids):]
        steps = []
        marks = []
        calls = 0
        new_tokens = 0
        while out[-1] not in self.eos and len(out) < self.cfg.max_new_tokens:
            n = len(tokens) - 1  # tokens in the cache; tokens[n] is the root
            # 1. draft: the strategy asks its drafters for one tree
            t0 = clock.mark()
            prop = yield from self.strategy.propose_steps(self.proposers, tok_dev[: n + 1], features[:n],
                                                          self.cfg.tree, self.cfg.temperature)
            tree = prop.tree.to(dev)
            # 2. verify: one verifier pass over [root] + tree nodes (alone, or with other prompts' trees)
            t1 = clock.mark()
            f_tree, l_tree, v0, v1 = yield VerifyRequest(cache, n, tok_dev[n : n + 1], tree)
            t2 = clock.mark()
            if self.observer is not None:
                self.observer(tree, l_tree.argmax(-1), prop)
            acc, q = self._accept(tree, l_tree, gen)  # 3. accept
            # 4. commit: the cache keeps exactly prefix + root + accepted path
            committed = self._committed(acc, tree, len(out))
            c = len(committed)
            self.strategy.observe(len(acc.path))  # acceptance history (switching), a host value already
            *idx, rows_d = self._commit(cache, features, tok_dev, n, acc, committed, f_tree)
            # 5. feedback: a strategy that scores its drafters on the committed tokens (hedge's passes) runs
            #    them here, timed as drafting; its values ride on the step's one read
            # the turn's last step
            last = committed[-1] in self.eos or len(out) + c >= self.cfg.max_new_tokens
            t3 = clock.mark()
            target = q.index_select(0, rows_d) if q is not None and self.strategy.needs_target else None
            fb = self.strategy.feedback(self.proposers, tok_dev[: n + 1 + c], features[: n + c], n + 1, last,
                                        target)
            t4 = clock.mark()
            record, fb_vals = self._read(idx, tree, prop, l_tree, q, fb)
            if fb is not None:
                self.strategy.learn(fb_vals, c)
            tokens += committed
            out += committed
            calls += 1
            new_tokens += c
            marks.append((t0, t1, v0, v1, t2, t3, t4, clock.mark()))
            steps.append(self._step_record(calls - 1, tree, prop, acc, committed, record, fb_vals))
        t_end = clock.mark()
        self._time_steps(clock, steps, marks)
        self.last_cache = cache  # kept for inspection (tests compare it with a fresh prefill)
        return TurnResult(out, calls, new_tokens, clock.seconds(t_start, t_end), steps)

    def _accept(self, tree, l_tree, gen: torch.Generator) -> tuple:
        """3. accept: greedy chain (T = 0: the argmax only) or multi-candidate rejection sampling
        (T > 0: q at every row, one walk on the device). Returns (the acceptance, q (N+1, V) or None)."""
        if self.cfg.temperature == 0:
            acc = accept_greedy(tree.tokens, tree.parents, tree.depths, l_tree.argmax(-1),
                                max_depth=tree.depth_bound)
            return acc, None
        q = self._next_dist(l_tree)  # (N+1, V)
        return accept_sampling(tree.tokens, tree.parents, q, gen, max_depth=tree.depth_bound), q

    @staticmethod
    def _time_steps(clock: Clock, steps: list[dict], marks: list[tuple]) -> None:
        """Each step's seconds into its record, after one device sync closes every timer of the turn."""
        clock.finish()
        for st, (t0, t1, v0, v1, t2, t3, t4, t5) in zip(steps, marks):
            fb_s = clock.seconds(t3, t4)  # the strategy's feedback passes count as drafting
            # the verifier pass: its own span (shared by the prompts verified with it, decoding/batch.py)
            st.update(t_draft_s=clock.seconds(t0, t1) + fb_s, t_verify_s=clock.seconds(v0, v1),
                      t_feedback_s=fb_s,
                      t_bookkeeping_s=clock.seconds(t2, t3) + clock.seconds(t4, t5))

    def _committed(self, acc, tree, n_out: int) -> list[int]:
        """The accepted tokens plus the verifier's next one, cut at max_new_tokens and at the first
        end-of-turn token."""
        path_tokens = acc.path_tokens if len(acc.path_tokens) == len(acc.path) else \
            tree.tokens[torch.tensor(acc.path, dtype=torch.long) - 1].tolist()  # a rule without path_tokens
        committed = (path_tokens + [acc.next_token])[: self.cfg.max_new_tokens - n_out]
        for j, t in enumerate(committed):  # stop at the first end-of-turn token
            if t in self.eos:
                return committed[: j + 1]
        return committed

    def _commit(self, cache, features, tok_dev, n, acc, committed, f_tree) -> tuple:
        """The step's host -> device boundary: one copy of [committed tokens, committed rows, accepted
        path, first rejected node]; the cache, features and device tokens take them. Returns the
        accepted path and the first rejected node on the device, for ``_read``, and the tree rows of
        the committed tokens' parents (root, accepted nodes), for a strategy's feedback."""
        dev = tok_dev.device
        c = len(committed)
        rows = ([0] + acc.path)[:c]  # [root] + accepted nodes that were committed
        rej = acc.rejected or 0
        ids = committed + rows + acc.path + [rej]
        idx = to_device(torch.tensor(ids, dtype=torch.long), dev)  # the one copy
        tok_c, rows_d, path_d, rej_d = idx.split([c, c, len(acc.path), 1])
        commit_path(cache, n, rows, path_index=rows_d)
        features[n : n + c] = f_tree[rows_d]
        tok_dev[n + 1 : n + 1 + c] = tok_c
        return path_d, rej_d, rows_d

    def _read(self, idx, tree, prop, l_tree, q, feedback) -> tuple[list[float], list[float]]:
        """The step's device -> host boundary: one read of the step record's numbers (entropies,
        owners, drafter stats) and of the strategy's feedback values, if it gave any: (record, feedback)."""
        path_d, rej_d = idx
        dev = path_d.device
        # the record: verifier entropy at the parents of the accepted nodes and of the rejected one;
        # draft entropy and node confidence c(v) of the accepted nodes and of the rejected one; path
        # confidence V of the accepted nodes and its sum over every other drafted node (TAPS's router)
        # (N+1,) node -> parent
        par1 = torch.cat([torch.zeros(1, dtype=torch.long, device=dev), tree.parents + 1])
        ent_rows = torch.cat([par1[path_d], par1[rej_d]])  # (L+1,)
        ent_q = entropy(q[ent_rows] if q is not None else self._next_dist(l_tree[ent_rows]))
        last = path_d[-1:] - 1 if path_d.numel() else None
        conf = tree.node_confidence  # (N,)
        rej_i = (rej_d - 1).clamp(min=0)  # (1,)
        path_v = tree.confidence.double()  # (N,) V, EAGLE-2's path score from the root
        acc_v = path_v[path_d - 1]  # (L,)
        parts = [ent_q, tree.draft_entropy[path_d - 1], conf[path_d - 1], acc_v, path_v.sum() - acc_v.sum()]
        parts += [tree.draft_entropy[rej_i], conf[rej_i]] if tree.size else [torch.zeros(2, device=dev)]
        if last is not None:
            parts += [tree.owner[last], tree.owner_mask[last]]
        if prop.stats is not None:
            parts.append(prop.stats.flatten())
        k = 0 if feedback is None else feedback.numel()
        if k:
            parts.append(feedback.reshape(-1))
        vals = torch.cat([p.double().reshape(-1) for p in parts]).tolist()  # the one read
        return vals[: len(vals) - k], vals[len(vals) - k :]

    def _step_record(self, step, tree, prop, acc, committed, vals: list[float], agreement: list) -> dict:
        L = len(acc.path)
        ent_q, vals = vals[: L + 1], vals[L + 1 :]
        acc_draft_ent = vals[:L]
        acc_conf = vals[L : 2 * L]
        acc_v = vals[2 * L : 3 * L]
        vals = vals[3 * L :]
        offpath_v, vals = vals[0], vals[1:]
        rej_draft_ent = vals[0]
        rej_conf = vals[1]
        vals = vals[2:]
        owner, owner_mask = (int(vals[0]), int(vals[1])) if L else (-1, 0)
        vals = vals[2:] if L else vals
        stats = [vals[i : i + 3] for i in range(0, len(vals), 3)]  # strategies.STAT columns
        rej = acc.rejected
        return {
            "step": step,
            "tree_size": tree.size,
            "committed": len(committed),
            "accepted_depth": L,
            "chosen_drafter": prop.chosen,
            "accepted_owner": owner,
            "accepted_owner_mask": owner_mask,
            "drafter_mean_confidence": [s[0] for s in stats],  # mean path confidence V per drafter
            "drafter_mean_entropy": [s[1] for s in stats],
            "drafter_mean_node_confidence": [s[2] for s in stats],  # mean node confidence c per drafter
            "accepted_draft_entropy": acc_draft_ent,
            "accepted_draft_confidence": acc_conf,  # c(v) of each accepted draft node, root to leaf
            "accepted_verifier_entropy": ent_q[:L],
            # TAPS's router: V of each accepted node, and of every drafted node off the accepted path
            "accepted_path_confidence": acc_v,
            "offpath_confidence_sum": offpath_v,
            "offpath_nodes": tree.size - L,
            "rejected_draft_entropy": None if rej is None else rej_draft_ent,
            "rejected_draft_confidence": None if rej is None else rej_conf,  # c(v) of the first rejected node
            "rejected_verifier_entropy": None if rej is None else ent_q[L],
            # a rejected child exists exactly when the last accepted node has a child
            "depth_accept": [True] * L + ([False] if rej is not None else []),
            # hedge's feedback per drafter: committed tokens its teacher-forced top-1 predicted (agreement),
            # or its counterfactual expected accepted length on the verified path (acceptance)
            "drafter_agreement": agreement,
        }
