"""orchestrator/plan/feature_io.py, the shard-read model, worked out by hand (torch-free, fast)."""
from __future__ import annotations

import pytest

from orchestrator.plan import feature_io as io

MB = 1e6


def test_without_read_ahead_every_download_is_on_the_critical_path():
    r = io.ShardReads(shard_bytes=100 * MB, shards=10, compute_s=3.0, node_bandwidth=50 * MB)
    assert io.download_seconds(r) == pytest.approx(2.0)
    assert io.wait_without_read_ahead(r) == pytest.approx(20.0)
    assert io.wait_with_read_ahead(r) == pytest.approx(20.0)  # read_ahead 0: the same
    # four ranks on the node share its bandwidth: each download takes 4x as long
    four = io.ShardReads(100 * MB, 10, 3.0, 50 * MB, ranks_per_node=4)
    assert io.wait_without_read_ahead(four) == pytest.approx(80.0)


def test_read_ahead_waits_for_the_first_group_then_only_the_shortfall():
    # the bandwidth keeps up (2 s a shard against 3 s of training): only the first shard waits
    r = io.ShardReads(100 * MB, 10, 3.0, 50 * MB, streams=1, read_ahead=2)
    assert io.concurrent(r) == 1 and io.wait_with_read_ahead(r) == pytest.approx(2.0)
    # two streams share the rank's bandwidth: the first two shards arrive together after 4 s
    two = io.ShardReads(100 * MB, 10, 3.0, 50 * MB, streams=2, read_ahead=2)
    assert io.concurrent(two) == 2 and io.wait_with_read_ahead(two) == pytest.approx(4.0)
    # it does not keep up (2 s a shard against 0.5 s): the first, then 1.5 s per later shard
    slow = io.ShardReads(100 * MB, 10, 0.5, 50 * MB, streams=1, read_ahead=1)
    assert io.wait_with_read_ahead(slow) == pytest.approx(2.0 + 9 * 1.5)
    assert io.wait_with_read_ahead(slow) < io.wait_without_read_ahead(slow)
    # a per-stream cap: two streams of 30 MB/s under a 100 MB/s node give 60 MB/s
    capped = io.ShardReads(120 * MB, 6, 1.0, 100 * MB, streams=2, read_ahead=3, stream_bandwidth=30 * MB)
    assert io.rank_bandwidth(capped, 2) == pytest.approx(60 * MB)
    assert io.wait_without_read_ahead(capped) == pytest.approx(6 * 4.0)  # one stream: 30 MB/s
    assert io.wait_with_read_ahead(capped) == pytest.approx(2.0 + 5 * 1.0)  # the link never idles
    # the first group arrives together: with 4 streams and the bandwidth keeping up, after 4 downloads
    four = io.ShardReads(100 * MB, 12, 3.0, 50 * MB, streams=4, read_ahead=4)
    assert io.wait_with_read_ahead(four) == pytest.approx(4 * 2.0)
    # a little short (2 s a shard against 1.8 s): the first shard, then 0.2 s per later one, unless
    # the first group takes longer
    short = io.ShardReads(100 * MB, 12, 1.8, 50 * MB, streams=4, read_ahead=4)
    assert io.wait_with_read_ahead(short) == pytest.approx(max(4 * 2.0, 2.0 + 11 * 0.2))
    # k never exceeds the shards there are
    one = io.ShardReads(100 * MB, 1, 1.0, 50 * MB, streams=4, read_ahead=4)
    assert io.concurrent(one) == 1 and io.wait_with_read_ahead(one) == pytest.approx(2.0)
    assert io.wait_with_read_ahead(io.ShardReads(1, 0, 1.0, 1.0, read_ahead=2)) == 0.0


def test_read_ahead_never_waits_longer_than_reading_on_demand():
    for b in (1, 10, 100):
        for c in (0.0, 0.5, 5.0):
            for s in (1, 2, 4):
                r = io.ShardReads(b * MB, 12, c, 20 * MB, streams=s, read_ahead=s)
                assert io.wait_with_read_ahead(r) <= io.wait_without_read_ahead(r) + 1e-9


def test_a_share_that_fits_the_node_is_downloaded_once():
    r = io.ShardReads(100 * MB, 10, 0.5, 50 * MB, ranks_per_node=2, read_ahead=1)
    first = io.wait_with_read_ahead(r)
    assert io.share_fits(r, 2000 * MB) and not io.share_fits(r, 1999 * MB)
    assert io.epoch_waits(r, 3, 2000 * MB) == [first, 0.0, 0.0]
    assert io.epoch_waits(r, 3, 1000 * MB) == [first] * 3
    assert io.epoch_waits(r, 2) == [first, 0.0]


def test_backbones_read_their_own_part_of_a_shard():
    from drafters.features import token_bytes

    assert io.token_bytes(4096, 3) == token_bytes(4096, 3) and io.token_bytes(576) == token_bytes(576)
    # Llama-3-8B: EAGLE-2/HASS read about a quarter of an EAGLE-3 cache's bytes
    assert io.read_fraction(4096, 3, reads_aux=False) == pytest.approx(8261 / 32837)
    assert io.read_fraction(4096, 3, reads_aux=True) == 1.0 and io.read_fraction(4096, 0, False) == 1.0


def test_prediction_and_bad_inputs():
    p = io.predict(io.ShardReads(100 * MB, 10, 3.0, 50 * MB, streams=2, read_ahead=2))
    assert (p.download_s, p.compute_s, p.wait_serial_s, p.wait_ahead_s, p.streams) == pytest.approx(
        (2.0, 30.0, 20.0, 4.0, 2))
    assert "waiting 20.0s without read-ahead, 4.0s with it (2 stream(s)" in p.describe()
    for bad in ({"node_bandwidth": 0}, {"shards": -1}, {"streams": 0}, {"read_ahead": -1},
                {"stream_bandwidth": 0.0}, {"ranks_per_node": 0}):
        with pytest.raises(ValueError):
            io.ShardReads(**{"shard_bytes": 1, "shards": 1, "compute_s": 1, "node_bandwidth": 1, **bad})
