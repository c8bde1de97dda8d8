"""The trainer's data: examples streamed from feature caches (or computed online by the verifier),
planned into batches per epoch, and dealt to ranks.

Per epoch the plan (which examples form which batch, in which order) depends only on the
examples' lengths and loss masks and the epoch's seed, so cached and online mode plan alike and a
rank computes online features for its own batches only. Cached data that splits by shards is
planned per rank from its own shards instead (drafters/train/shards.py).
"""
from __future__ import annotations

import random

import torch

from drafters.data.templating import TokenizedExample
from drafters.features import FeatureExample, FeatureStore, expect_shards
from drafters.train.config import ONLINE_ROOTS
from drafters.train.eagle2 import collate
from drafters.train.shards import rank_plan
from drafters.variants import DataSpec


class OnlineFeatures:
    """``online`` mode: features computed by the verifier inside the training worker, batch by
    batch, never cached (for verifiers whose full cache would be terabytes). The selection
    (tokenized examples, no verifier pass) is known up front, so batches and ranks are assigned
    before any feature is computed and each rank runs the verifier only on its own batches."""

    def __init__(self, model, tokenizer, spec: DataSpec, aux_layers=None):
        from common.verifiers import eos_token_ids

        self.model = model
        self.tok = tokenizer
        self.spec = spec
        self.aux_layers = aux_layers
        self.eos = eos_token_ids(model, tokenizer)
        self._examples: dict[str, dict] = {}

    def examples(self, corpus: str, ids, part: str = "train") -> list[TokenizedExample]:
        """The selected examples of ``corpus`` (in selection order, as the cache stores them)."""
        from drafters.variants import select_examples

        if corpus not in self._examples:
            train, held = select_examples(self.tok, self.eos, corpus, self.spec)
            self._examples[corpus] = {"train": train, "heldout": held}
        keep = None if ids is None else set(ids)
        return [e for e in self._examples[corpus][part] if keep is None or e.id in keep]

    def features(self, examples: list[TokenizedExample]) -> list[FeatureExample]:
        """One verifier pass over ``examples`` (the only place online mode runs the verifier)."""
        from drafters.features import verifier_features

        return verifier_features(self.model, examples, aux_layers=self.aux_layers)

    def iter_examples(self, corpus: str, ids, part: str = "train", chunk: int = 8, features: bool = True):
        exs = self.examples(corpus, ids, part)
        if not features:
            yield from exs
            return
        for j in range(0, len(exs), chunk):
            yield from self.features(exs[j : j + chunk])


def _source(root, key, ids, online: OnlineFeatures | None, features: bool = True, file: str | None = None):
    if root in ONLINE_ROOTS:
        if online is None:
            raise ValueError("train_data has 'online' entries but no online feature source was given")
        part = "heldout" if root == "online-heldout" else "train"
        return online.iter_examples(key, ids, part, features=features)
    return FeatureStore(root, key).iter_examples(None if ids is None else set(ids),
                                                 None if file is None else {file})


def iter_examples(data: list, seed: int | None, buffer: int = 256, online: OnlineFeatures | None = None,
                  features: bool = True):
    """Stream examples from feature stores (or the online source); shard order and a shuffle
    buffer seeded per epoch, so memory stays at about one shard plus the buffer. ``features=False``:
    online entries yield their tokenized examples (no verifier pass); the order depends only on
    the examples' count, so it is the same either way and the same as the cache's. An entry may
    name one shard of its cache (``[root, key, ids, file]``: a rank's own shard, drafters/train/shards.py).
    The shards the pass opens are announced first, in order (``expect_shards``: a node cache fetches
    the next ones while these are read)."""
    rng = random.Random(seed) if seed is not None else None
    sources = list(data)
    if rng:
        rng.shuffle(sources)
    expect_shards([r for root, key, ids, *file in sources if root not in ONLINE_ROOTS  # (to fetch them ahead)
                   for r in FeatureStore(root, key).reads(None if ids is None else set(ids), set(file)
                                                          or None)])
    buf = []
    for root, key, ids, *file in sources:
        for e in _source(root, key, ids, online, features, *file):
            if rng is None:
                yield e
                continue
            buf.append(e)
            if len(buf) >= buffer:
                yield buf.pop(rng.randrange(len(buf)))
    if rng:
        rng.shuffle(buf)
    yield from buf


def _has_targets(e) -> bool:
    m = e.loss_mask[1:]
    return bool(m.any()) if torch.is_tensor(m) else any(m)


def plan_batches(data, batch_size, seed, online: OnlineFeatures | None = None, bucket: bool = False,
                 pool: int = 16):
    """The epoch's batches as lists of examples, before any online feature is computed (online
    entries are tokenized examples here, cached ones FeatureExamples). ``bucket``: take ``pool``
    batches' worth of (already shuffled) examples, sort them by length, cut batches, and yield
    those in a seeded random order, so a batch pads to similar lengths; every example is used
    once per epoch either way. Only lengths and loss masks decide, so both modes plan alike."""
    rng = random.Random(seed)
    group = []

    def flush(exs):
        if not bucket:
            return [exs[i : i + batch_size] for i in range(0, len(exs), batch_size)]
        exs = sorted(exs, key=lambda e: len(e.input_ids))
        out = [exs[i : i + batch_size] for i in range(0, len(exs), batch_size)]
        rng.shuffle(out)
        return out

    cap = batch_size * (pool if bucket else 1)
    for e in iter_examples(data, seed, online=online, features=False):
        if not _has_targets(e):
            continue
        group.append(e)
        if len(group) == cap:
            yield from flush(group)
            group = []
    if group:
        yield from flush(group)


def batches(data, batch_size, seed, online: OnlineFeatures | None = None, bucket: bool = False,
            pool: int = 16, mask_mode: str = "next", rank: int = 0, world: int = 1, skip: int = 0,
            collate_fn=collate):
    """Collated batches of rank ``rank`` of ``world``: batch i of the plan goes to rank i % world
    (the same assignment in cached and online mode), and online features are computed for that
    rank's batches only. ``skip``: the rank's first ``skip`` batches are passed over unbuilt (a
    resume inside an epoch). With a plan of N batches the first N % world ranks get one more than
    the others; the training loop drops that remainder (every rank steps N // world times, see
    drafters/train/loop.py), since a rank that steps alone waits forever in its gradient all-reduce.
    Cached data that splits by shards (drafters/train/shards.py ``rank_plan``) is planned otherwise: the
    rank reads and batches only its own shards, for the step count every rank shares."""
    cached = world > 1 and not any(e[0] in ONLINE_ROOTS for e in data)
    plan = rank_plan(data, world, batch_size) if cached else None
    if plan is not None and plan.sharded:
        groups = _own_groups(plan.data(rank), plan.steps, batch_size, seed, bucket, pool)
        rank, world = 0, 1
    else:
        groups = plan_batches(data, batch_size, seed, online, bucket, pool)
    for i, group in enumerate(groups):
        if i % world != rank:
            continue
        if skip:
            skip -= 1
            continue
        need = [j for j, e in enumerate(group) if isinstance(e, TokenizedExample)]  # online: no features yet
        if need:
            computed = online.features([group[j] for j in need])
            group = list(group)
            for j, f in zip(need, computed):
                group[j] = f
        yield collate_fn(group, mask_mode=mask_mode)


def _own_groups(data, steps: int, batch_size: int, seed, bucket: bool, pool: int):
    """``steps`` batches of a rank's own shards: its plan, then (a rank with fewer batches than the
    others) its plan again in another order, for the batches it lacks."""
    made, again = 0, seed  # the first pass: the plan's own seed
    while made < steps:
        before = made
        for group in plan_batches(data, batch_size, again, bucket=bucket, pool=pool):
            if made == steps:
                return
            yield group
            made += 1
        if made == before:  # nothing with a target in these shards
            return
        again = None if again is None else again + 7919


def count_examples(data: list, online_spec: DataSpec | None = None) -> int:
    """Examples a data list holds (from manifests, id lists or, for an online entry without ids,
    the selection size of ``online_spec``); no shard is read and no feature computed."""
    n = 0
    for root, key, ids in data:
        if ids is not None:
            n += len(ids)
        elif root in ONLINE_ROOTS:
            if online_spec is None:
                raise ValueError("an online data entry without ids needs online_spec to be counted")
            # select_examples returns exactly n (train) / heldout examples
            n += online_spec.heldout if root == "online-heldout" else online_spec.n
        else:
            n += int(FeatureStore(root, key).manifest()["examples"])
    return n
