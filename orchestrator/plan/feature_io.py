"""The I/O model of cached features: how long training ranks wait for feature shards (torch-free).

A rank reads its own shards of a feature cache at a URI (drafters/train/shards.py) through its node's
shard cache (workers/shard_cache.py). Per shard it downloads the tensors its backbone reads, then
trains on them for ``compute_s`` seconds. The node's bandwidth from the object store is shared by
the ranks on the node (each gets ``node_bandwidth / ranks_per_node``), and one stream may be
capped (``stream_bandwidth``). What the shard cache does, and so what this models:

- without read-ahead (``read_ahead`` 0) a rank downloads a shard when it opens it, on one stream:
  every download is on its critical path, ``shards x shard_bytes / bandwidth``;
- with read-ahead ``N`` the rank announces its epoch's shard order; a background pool of
  ``streams`` threads fetches the shard being read and the next ``N``: ``k = min(streams, N + 1,
  shards)`` downloads run at once and share the rank's bandwidth (``d``: a shard's download time at
  the pool's throughput). Where the bandwidth keeps up with training (``d <= compute_s``) the rank
  waits only for the first group (``k`` shards arrive together after ``k x d``); where it does not,
  the link never idles and the rank waits for the first shard and then each later shard's
  shortfall, ``d + (shards - 1) x (d - compute_s)``; the wait is the larger of the two;
- a rank's share that fits its node's budget (every rank on the node counted) stays on node disk:
  later epochs download nothing. One that does not is downloaded again each epoch (least recently
  used eviction over a cycle longer than the cache keeps almost nothing for the next pass).

Pure functions of the numbers given; tests/test_feature_io.py works them out by hand, and
experiments/bench_shard_io.py compares them with waits measured on a throttled S3 server.
"""
from __future__ import annotations

from dataclasses import dataclass

TOPK = 10  # drafters/features.py TOPK: the verifier's top-K ids (int32) and probabilities (float16)


def token_bytes(hidden: int, n_aux: int = 0) -> int:
    """Bytes one token takes in a shard (drafters/features.py ``token_bytes``, kept equal by a test):
    float16 features (+ the aux layers'), top-K ids and probabilities, its input id and loss mask."""
    return 2 * hidden * (1 + n_aux) + TOPK * (4 + 2) + 8 + 1


def read_fraction(hidden: int, n_aux: int, reads_aux: bool) -> float:
    """The part of a shard's bytes a backbone downloads: all of it for EAGLE-3 (``reads_aux``), the
    bytes without the aux layers for EAGLE-2 and HASS (about a quarter of an EAGLE-3 cache)."""
    return 1.0 if reads_aux or n_aux == 0 else token_bytes(hidden) / token_bytes(hidden, n_aux)


@dataclass(frozen=True)
class ShardReads:
    """One rank's reads in one epoch, and what its node gives it."""

    shard_bytes: float  # bytes the rank downloads per shard (its backbone's tensors only)
    shards: int  # shards the rank reads per epoch
    compute_s: float  # seconds the rank trains on one shard
    node_bandwidth: float  # bytes/s from the object store into the node
    ranks_per_node: int = 1  # ranks sharing the node's bandwidth (and its disk budget)
    streams: int = 1  # parallel downloads per rank with read-ahead
    read_ahead: int = 0  # shards fetched ahead of the one being read (0: none)
    stream_bandwidth: float | None = None  # bytes/s one stream gets at most (None: no cap)

    def __post_init__(self):
        if self.shard_bytes < 0 or self.shards < 0 or self.compute_s < 0:
            raise ValueError(f"shard_bytes, shards and compute_s must be >= 0: {self}")
        if not self.node_bandwidth > 0 or (self.stream_bandwidth is not None
                                           and not self.stream_bandwidth > 0):
            raise ValueError(f"bandwidths must be > 0 bytes/s: {self}")
        if self.ranks_per_node < 1 or self.streams < 1 or self.read_ahead < 0:
            raise ValueError(f"ranks_per_node and streams must be >= 1, read_ahead >= 0: {self}")


def concurrent(r: ShardReads) -> int:
    """Downloads a rank runs at once: 1 without read-ahead, else min(streams, read_ahead + 1, shards)."""
    if r.read_ahead == 0:
        return 1
    return max(1, min(r.streams, r.read_ahead + 1, r.shards))


def rank_bandwidth(r: ShardReads, streams: int = 1) -> float:
    """Bytes/s a rank gets with ``streams`` downloads running: its share of the node's bandwidth,
    or the streams' cap if lower."""
    share = r.node_bandwidth / r.ranks_per_node
    return share if r.stream_bandwidth is None else min(share, streams * r.stream_bandwidth)


def download_seconds(r: ShardReads, streams: int = 1) -> float:
    """Seconds per shard at the throughput of ``streams`` parallel downloads (one shard's bytes
    over the rank's bandwidth with that many streams)."""
    return r.shard_bytes / rank_bandwidth(r, streams)


def wait_without_read_ahead(r: ShardReads) -> float:
    """Seconds a rank waits for shards per epoch when every download is on its critical path."""
    return r.shards * download_seconds(r, 1)


def wait_with_read_ahead(r: ShardReads) -> float:
    """Seconds a rank waits per epoch with read-ahead: the first group of ``k`` downloads, or, where
    the bandwidth falls short, the first shard and each later one's download time past its training
    time, whichever is longer (``read_ahead`` 0: as without)."""
    if r.read_ahead == 0:
        return wait_without_read_ahead(r)
    if r.shards == 0:
        return 0.0
    k = concurrent(r)
    d = download_seconds(r, k)
    return max(k * d, d + (r.shards - 1) * max(0.0, d - r.compute_s))


def share_fits(r: ShardReads, budget_bytes: float) -> bool:
    """Whether every rank's share on the node fits the node's shard budget at once (then a share
    downloaded in the first epoch is read from disk in the later ones)."""
    return r.ranks_per_node * r.shards * r.shard_bytes <= budget_bytes


def epoch_waits(r: ShardReads, epochs: int, budget_bytes: float | None = None) -> list[float]:
    """Seconds a rank waits in each of ``epochs`` epochs (with read-ahead as ``r`` sets it): the
    first epoch's, then 0 where the share fits ``budget_bytes`` (None: no bound) or the same again."""
    first = wait_with_read_ahead(r)
    again = 0.0 if budget_bytes is None or share_fits(r, budget_bytes) else first
    return [first] + [again] * max(0, epochs - 1)


@dataclass(frozen=True)
class IOPrediction:
    download_s: float  # one shard alone, one stream
    compute_s: float  # the epoch's training on the rank's shards
    wait_serial_s: float  # the epoch's wait without read-ahead
    wait_ahead_s: float  # the epoch's wait with the read-ahead ``r`` sets
    streams: int  # downloads at once with read-ahead

    def describe(self) -> str:
        share = (self.wait_ahead_s / (self.compute_s + self.wait_ahead_s)
                 if self.compute_s + self.wait_ahead_s else 0)
        return (f"shard download {self.download_s:.2f}s; per epoch: training {self.compute_s:.1f}s, waiting "
                f"{self.wait_serial_s:.1f}s without read-ahead, {self.wait_ahead_s:.1f}s with it "
                f"({self.streams} stream(s); {100 * share:.0f}% of the epoch)")


def predict(r: ShardReads) -> IOPrediction:
    """The epoch's figures for ``r`` (a first epoch, or any epoch whose share is not on disk)."""
    return IOPrediction(download_seconds(r), r.shards * r.compute_s, wait_without_read_ahead(r),
                        wait_with_read_ahead(r), concurrent(r))
