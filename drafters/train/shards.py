"""Which feature shards each training rank reads: a balanced partition by tokens, from the index.

With a cache at a URI every rank would otherwise read every shard each epoch to plan its batches.
Here the shards of the data list (the part of each shard the entry selects) are assigned to ranks
by a deterministic greedy partition of their token counts (largest first, to the rank with the
fewest tokens so far), so the ranks' token counts differ by at most one shard's. The partition
depends on the index alone, not on the epoch: a rank reads the same shards every epoch (a node
cache that holds a rank's share downloads it once). Each rank plans its own batches from its own
shards; every rank then takes the same number of micro-batches, the largest rank's count
(DeepSpeed's collectives need equal steps): a rank with fewer starts over on its own shards, in
another order, for the few batches it lacks. No example is left out of an epoch; about one
shard's worth per rank is seen twice (never more than ``MAX_PAD`` of the epoch).

A data list that cannot be split so (fewer shards than ranks, or so few that the repeats would
pass ``MAX_PAD`` of the epoch, or a subset of a cache written before the index listed each
shard's ids) keeps the interleaved plan: every rank reads every shard and takes every world-th
batch (drafters/train/data.py ``batches``).
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

from drafters.features import FeatureStore

MAX_PAD = 0.10  # the share of an epoch's examples the ranks may repeat to take equal steps; more: interleaved


@dataclass(frozen=True)
class Unit:
    """The part of one shard a data entry selects."""

    root: str
    key: str
    file: str
    ids: tuple | None  # the selected ids in it (None: all of the shard)
    examples: int
    tokens: int


def units_of(data: list) -> list[Unit] | None:
    """The shard units of cached entries ``[[root, key, ids or None], ...]``, from their indexes;
    None when one is a subset of a cache whose index does not list each shard's ids."""
    out = []
    for root, key, ids in data:
        sel = None if ids is None else set(ids)
        for s in FeatureStore(root, key).manifest()["shards"]:
            if sel is None:
                out.append(Unit(root, key, s["file"], None, int(s["examples"]), int(s["tokens"])))
                continue
            if "ids" not in s:
                return None
            keep = [(i, n) for i, n in zip(s["ids"], s["lengths"]) if i in sel]
            if keep:
                out.append(Unit(root, key, s["file"], tuple(i for i, _ in keep), len(keep),
                                sum(n for _, n in keep)))
    return out


def partition(tokens: list[int], world: int) -> list[int]:
    """The rank of each item: largest first (ties: the earlier item), each to the rank with the
    fewest tokens so far (ties: the lower rank). Deterministic; every item assigned once; the
    ranks' totals differ by at most the largest item."""
    if world < 1:
        raise ValueError(f"world must be >= 1, got {world}")
    if any(t < 0 for t in tokens):
        raise ValueError("token counts must be >= 0")
    heap = [(0, r) for r in range(world)]
    owner = [0] * len(tokens)
    for i in sorted(range(len(tokens)), key=lambda i: (-tokens[i], i)):
        load, r = heapq.heappop(heap)
        owner[i] = r
        heapq.heappush(heap, (load + tokens[i], r))
    return owner


@dataclass(frozen=True)
class RankPlan:
    """How ``world`` ranks split a data list: ``sharded`` (each rank its own ``units``, ``steps``
    micro-batches each per epoch) or not (``reason``: the interleaved plan, ``steps`` per rank)."""

    world: int
    steps: int
    sharded: bool
    units: tuple = ()
    owner: tuple = ()
    padded: int = 0  # examples the ranks repeat each epoch to take equal steps (about: from counts)
    reason: str = ""

    def mine(self, rank: int) -> list[Unit]:
        return [u for u, r in zip(self.units, self.owner) if r == rank]

    def data(self, rank: int) -> list:
        """Rank ``rank``'s data list: one ``[root, key, ids, file]`` entry per shard it reads."""
        return [[u.root, u.key, None if u.ids is None else list(u.ids), u.file] for u in self.mine(rank)]

    def describe(self) -> str:
        if not self.sharded:
            return f"every rank reads every shard ({self.reason}); {self.steps} micro-batches per rank"
        toks = [sum(u.tokens for u in self.mine(r)) for r in range(self.world)]
        n = [len(self.mine(r)) for r in range(self.world)]
        return (f"shards per rank {n}, tokens per rank {min(toks)}-{max(toks)}; {self.steps} micro-batches "
                f"per rank, about {self.padded} examples repeated per epoch to make the steps equal")


def rank_plan(data: list, world: int, batch_size: int) -> RankPlan:
    """The plan of cached entries for ``world`` ranks (see the module's docstring)."""
    units = units_of(data) if world > 1 else None
    total = sum(u.examples for u in units) if units is not None else None
    if units is None:
        n = 0
        for root, key, ids in data:
            n += len(ids) if ids is not None else int(FeatureStore(root, key).manifest()["examples"])
        why = "one rank" if world == 1 else "a subset of a cache whose index lists no per-shard ids"
        return RankPlan(world, max(1, -(-n // batch_size) // world), False, reason=why)
    owner = partition([u.tokens for u in units], world)
    per = [sum(u.examples for u, r in zip(units, owner) if r == rank) for rank in range(world)]
    steps = max(-(-n // batch_size) for n in per)
    padded = sum((steps - -(-n // batch_size)) * batch_size for n in per)  # whole batches taken again
    interleaved = max(1, -(-total // batch_size) // world)
    if min(per) == 0 or padded > MAX_PAD * total:
        why = (f"{len(units)} shards for {world} ranks" if min(per) == 0 else
               f"equal steps would repeat about {padded} of {total} examples")
        return RankPlan(world, interleaved, False, reason=why)
    return RankPlan(world, steps, True, tuple(units), tuple(owner), padded)
