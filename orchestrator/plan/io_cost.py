"""The dry run's I/O term: a training trial's waits for its cached features and a features task's waits
for its uploads, from the profile's node settings (``resources.node``, NodeIO) through the shard-read
model of orchestrator/plan/feature_io.py. Pure Python.

Per trial (stated): each rank reads its own shards (drafters/train/shards.py), only the tensors its backbone
reads (EAGLE-2 and HASS: no aux layers); a node's object-store bandwidth is shared by the ranks on it
(a trial of W GPUs has min(W, GPUS_PER_NODE) ranks a node), each rank downloads with the runtime's
read-ahead (``READ_AHEAD`` shards ahead on ``STREAMS`` streams, each at most ``STREAM_BYTES_PER_S``).
The first epoch waits what feature_io predicts; later epochs read the share from node disk where every
rank's share on the node fits ``disk_gb`` (waiting only where the disk's throughput is short of the
compute's), else from the store again, waiting as the first did. A features task's shards go to the
store as they finish, behind its compute: it waits only for what its share of the node's bandwidth
cannot carry.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from orchestrator.plan.feature_io import ShardReads, epoch_waits, read_fraction, share_fits, token_bytes

GPUS_PER_NODE = 8  # the deploy files' node type (p4de.24xlarge: 8 x A100 80GB)
SHARD_BYTES = 1 << 30  # about the most bytes a cache's shard holds (drafters.features.SHARD_BYTES)
SHARD_TOKENS = 200_000  # and the most tokens (drafters.features.SHARD_TOKENS)
READ_AHEAD, STREAMS = 4, 4  # the shard cache's defaults (workers/shard_cache.py, TASKSPEC_SHARD_*)
STREAM_BYTES_PER_S = 85e6  # one S3 connection (AWS's S3 performance guidelines: 85-90 MB/s each)


@dataclass(frozen=True)
class TrialIO:
    """A trial's waits for shards over its epochs, and what set them."""

    stall_s: float  # seconds the trial waits for shards, all epochs
    fits: bool  # every rank's share stays on node disk across epochs
    share_bytes: float  # the trial's reads an epoch
    need_bytes_per_s: float  # what its compute consumes from its nodes
    store_bytes_per_s: float  # what its nodes' object-store bandwidth gives it


def share(gpus: float) -> float:
    """The fraction of a node's bandwidth and disk a task of ``gpus`` GPUs has (nodes for more than 8)."""
    return gpus / GPUS_PER_NODE


def trial_io(compute_epoch_s: float, epochs: int, tokens: float, gpus: int, node, hidden: int, n_aux: int,
             reads_aux: bool) -> TrialIO:
    """Waits of a trial computing ``compute_epoch_s`` an epoch over ``tokens`` on ``gpus`` GPUs, reading
    a cache with ``n_aux`` aux layers (``reads_aux``: the backbone reads them) from nodes like ``node``."""
    frac = read_fraction(hidden, n_aux, reads_aux)
    per_token = token_bytes(hidden, n_aux) * frac
    shard_tokens = max(1, min(SHARD_TOKENS, SHARD_BYTES // token_bytes(hidden, n_aux)))
    shards = max(1, math.ceil(tokens / gpus / shard_tokens))
    ranks = min(gpus, GPUS_PER_NODE)
    r = ShardReads(shard_tokens * per_token, shards, compute_epoch_s / shards, node.object_store_gb_s * 1e9,
                   ranks_per_node=ranks, streams=STREAMS, read_ahead=READ_AHEAD,
                   stream_bandwidth=STREAM_BYTES_PER_S)
    first = epoch_waits(r, 1)[0]
    fits = share_fits(r, node.disk_gb * 1e9)
    nbytes = tokens * per_token
    later = max(0.0, nbytes / (node.disk_gb_s * 1e9 * share(gpus)) - compute_epoch_s) if fits else first
    return TrialIO(first + (epochs - 1) * later, fits, nbytes, nbytes / compute_epoch_s if compute_epoch_s
                   else 0.0,
                   min(node.object_store_gb_s * 1e9 * share(gpus), gpus * STREAMS * STREAM_BYTES_PER_S))


def write_wait(compute_s: float, nbytes: float, gpus: float, node) -> float:
    """Seconds a task computing ``compute_s`` waits to upload ``nbytes`` as it goes, on ``gpus`` GPUs'
    share of a node's object-store bandwidth."""
    return max(0.0, nbytes / (node.object_store_gb_s * 1e9 * share(gpus)) - compute_s)
