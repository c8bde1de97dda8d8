"""Feature shards: cut before any forward pass, streamed to a store, split between ranks, and read
through a bounded node cache (drafters/features.py, drafters/train/shards.py, workers/shard_cache.py).

Fast and CPU-only: synthetic feature examples (the shard layout is what is checked, not the
verifier's numbers; tests/test_multinode.py extracts with the real verifier and trains on two
nodes over S3). The store "at a URI" here is a file:// URI, read and written through
common.storage as an s3:// one is."""
from __future__ import annotations

import contextlib
import json
import random
import threading

import pytest
import torch

from common import storage
from drafters.data.templating import TokenizedExample
from drafters.feature_stream import StreamingFeatureStore
from drafters.features import (
    FeatureExample,
    FeatureStore,
    extraction_device,
    plan_shards,
    reading_through,
    shard_tokens_for,
    token_bytes,
)
from drafters.train import shards
from drafters.train.backbones import schedule_steps
from drafters.train.config import TrainConfig
from drafters.train.data import batches
from drafters.variants import DataSpec
from workers.artifacts import RemoteDir, localize_data
from workers.shard_cache import ShardCache, budget_bytes

H = 8


def _tokenized(n: int, seed: int = 0) -> list[TokenizedExample]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        L = rng.randrange(6, 40)
        p = rng.randrange(1, L - 2)
        ids = [rng.randrange(3, 60) for _ in range(L)]
        out.append(TokenizedExample(f"ex{i}", ids, [0] * p + [1] * (L - p)))
    return out


class Compute:
    """Synthetic features (a deterministic function of the ids); counts the examples it saw."""

    def __init__(self):
        self.seen: list[str] = []

    def __call__(self, exs):
        self.seen += [e.id for e in exs]
        out = []
        for e in exs:
            L = len(e.input_ids)
            g = torch.Generator().manual_seed(int(e.id[2:]))
            out.append(FeatureExample(e.id, torch.tensor(e.input_ids), torch.tensor(e.loss_mask,
                    dtype=torch.bool),
                                      torch.randn(L, H, generator=g).half(), torch.randint(0, 60, (L,
                                              10)).int(),
                                      torch.rand(L, 10).half()))
        return out


class Seeded(Compute):
    """As Compute, with every tensor a function of the example's id (the same bytes in any part)."""

    def __call__(self, exs):
        self.seen += [e.id for e in exs]
        out = []
        for e in exs:
            L, g = len(e.input_ids), torch.Generator().manual_seed(int(e.id[2:]))
            out.append(FeatureExample(e.id, torch.tensor(e.input_ids), torch.tensor(e.loss_mask,
                    dtype=torch.bool),
                                      torch.randn(L, H, generator=g).half(),
                                      torch.randint(0, 60, (L, 10), generator=g).int(),
                                      torch.rand(L, 10, generator=g).half()))
        return out


# ------------------------------------------------------------------ pure functions


def test_partition_is_balanced_deterministic_and_uses_every_shard_once():
    rng = random.Random(3)
    for _ in range(200):
        tokens = [rng.randrange(1, 5000) for _ in range(rng.randrange(1, 80))]
        world = rng.randrange(1, 9)
        owner = shards.partition(tokens, world)
        assert owner == shards.partition(list(tokens), world)  # deterministic
        assert len(owner) == len(tokens) and set(owner) <= set(range(world))  # each shard once, to one rank
        loads = [sum(t for t, r in zip(tokens, owner) if r == k) for k in range(world)]
        if len(tokens) >= world:
            assert max(loads) - min(loads) <= max(tokens), (tokens, world, loads)  # within one shard
    assert shards.partition([5, 5, 5, 5], 2) == [0, 1, 0, 1]  # ties: the earlier shard, the lower rank
    with pytest.raises(ValueError, match="world must be >= 1"):
        shards.partition([1], 0)


def test_plan_shards_cuts_as_the_writer_always_has():
    exs = _tokenized(57)
    lengths = [len(e.input_ids) for e in exs]
    plan = plan_shards(lengths, 100)
    assert [a for a, _ in plan] == [0] + [b for _, b in plan[:-1]] and plan[-1][1] == len(exs)
    assert all(sum(lengths[a:b]) >= 100 for a, b in plan[:-1])  # every shard but the last is full
    # and closes at the first example that fills it
    assert all(sum(lengths[a : b - 1]) < 100 for a, b in plan)
    with pytest.raises(ValueError, match="shard_tokens must be >= 1"):
        plan_shards(lengths, 0)


def test_extraction_device_and_shard_size():
    assert extraction_device([], True) == "cpu" and extraction_device([], False) == "cpu"
    assert extraction_device([0], True) == "cuda"
    with pytest.raises(RuntimeError, match=r"holds GPU\(s\) \[1\] but torch sees no CUDA device"):
        extraction_device([1], False)
    # Llama-3-8B (hidden 4096) with EAGLE-3's three aux layers: 32 KiB a token, ~32k tokens a GiB shard
    assert token_bytes(4096, 3) == 32837 and shard_tokens_for(4096, 3) == (1 << 30) // 32837 == 32699
    assert shard_tokens_for(576) == 200_000  # SmolLM2-135M: the old 200k-token cap


def test_shard_cache_budget_from_the_environment():
    assert budget_bytes({}) == 100 * 2**30 and budget_bytes({"TASKSPEC_FEATURE_CACHE_GB": "0.5"}) == 2**29
    for bad in ("x", "0", "-1"):
        with pytest.raises(ValueError, match="TASKSPEC_FEATURE_CACHE_GB"):
            budget_bytes({"TASKSPEC_FEATURE_CACHE_GB": bad})


# ------------------------------------------------------------------ writing


def test_a_resumed_extraction_skips_the_shards_already_stored(tmp_path):
    exs = _tokenized(40)
    first = Compute()
    m = FeatureStore(tmp_path, "c", shard_tokens=120).extract(exs, first, {"corpus": "toy"})
    assert sorted(first.seen) == sorted(e.id for e in exs) and len(m["shards"]) > 3
    assert m["format"] == 2 and "seconds" in m and m["resumed_shards"] == 0
    assert [i for s in m["shards"] for i in s["ids"]] == [e.id for e in exs]
    # a crash before the index: the index and one shard gone
    store = FeatureStore(tmp_path, "c", shard_tokens=120)
    store.manifest_path.unlink()
    lost = m["shards"][2]
    (store.dir / lost["file"]).unlink()
    again = Compute()
    m2 = store.extract(exs, again, {"corpus": "toy"})
    assert again.seen == lost["ids"]  # only the missing shard is computed
    assert m2["shards"] == m["shards"] and m2["resumed_shards"] == len(m["shards"]) - 1
    assert "seconds" not in m2
    # another shard size names other shards: none is taken for another plan's
    other = Compute()
    FeatureStore(tmp_path, "c", shard_tokens=70).extract(exs, other, {"corpus": "toy"})
    assert sorted(other.seen) == sorted(e.id for e in exs)
    got = {e.id: e for e in FeatureStore(tmp_path, "c").iter_examples()}
    ref = {e.id: e for e in Compute()(exs)}
    assert got.keys() == ref.keys() and all(torch.equal(got[k].features, ref[k].features) for k in got)


class _SlowRemote(RemoteDir):
    """A store at a URI that records how many staged shard bytes are on local disk at each upload."""

    def __init__(self, uri, staging):
        super().__init__(uri)
        self.staging, self.on_disk = staging, []

    def put(self, local, name):
        self.on_disk.append(sum(p.stat().st_size for p in self.staging.rglob("*") if p.is_file()))
        super().put(local, name)


def test_a_streamed_cache_keeps_about_two_shards_on_local_disk(tmp_path):
    uri = (tmp_path / "bucket" / "features").as_uri()
    staging = tmp_path / "staging"
    exs = _tokenized(60)
    remote = _SlowRemote(storage.join(uri, "k"), staging)
    store = StreamingFeatureStore(staging, "k", remote, shard_tokens=150)
    assert not store.exists()
    m = store.extract(exs, Compute(), {"corpus": "toy"})
    biggest = max(s["bytes"] for s in m["shards"])
    assert len(m["shards"]) >= 5 and max(remote.on_disk) <= 2 * biggest
    assert 0 < m["staging_peak_bytes"] <= 2 * biggest
    assert not [p for p in staging.rglob("*") if p.is_file()]  # every staged shard deleted once up
    index = len(store.remote.read_text("manifest.json"))
    assert storage.file_sizes(storage.join(uri, "k")) == {**{s["file"]: s["bytes"] for s in m["shards"]},
                                                          "manifest.json": index}
    assert store.exists() and store.manifest()["shards"] == m["shards"]


def test_a_failed_upload_stops_the_extraction_before_the_index(tmp_path):
    uri = (tmp_path / "bucket").as_uri()

    class Failing(RemoteDir):
        n = 0

        def put(self, local, name):
            Failing.n += 1
            if Failing.n == 3:
                raise OSError("injected: the store refused the upload")
            super().put(local, name)

    store = StreamingFeatureStore(tmp_path / "staging", "k", Failing(storage.join(uri, "k")),
                                  shard_tokens=150)
    with pytest.raises(OSError, match="injected"):
        store.extract(_tokenized(60), Compute(), {})
    assert not store.exists() and not [p for p in (tmp_path / "staging").rglob("*") if p.is_file()]
    done = Compute()  # the rerun computes only the shards that did not get up
    m = StreamingFeatureStore(tmp_path / "staging", "k", RemoteDir(storage.join(uri, "k")), 150).extract(
        _tokenized(60), done, {})
    assert 0 < len(done.seen) < 60 and m["resumed_shards"] >= 2


def test_parts_extract_disjoint_shards_and_the_index_is_written_once_all_have(tmp_path):
    """Data-parallel extraction: n parts (one per device) each compute a contiguous run of the plan's
    shards into one cache, in place or streamed to a URI; the index, written once every part has
    recorded, is the one-task extraction's (timings aside) and the shards are the same bytes."""
    exs = _tokenized(60)
    whole = FeatureStore(tmp_path / "one", "k", shard_tokens=100).extract(exs, Seeded(), {"corpus": "toy"})
    n = len(whole["shards"])
    assert n >= 8
    uri = (tmp_path / "bucket").as_uri()
    for store_of in (lambda: FeatureStore(tmp_path / "parts", "k", shard_tokens=100),
                     lambda: StreamingFeatureStore(tmp_path / "staging", "k", RemoteDir(storage.join(uri,
                             "k")), 100)):
        seen = []
        for i in (2, 0, 1):  # in any order, each on its own device
            c = Seeded()
            rec = store_of().extract(exs, c, {"corpus": "toy"}, part=(i, 3))
            want = whole["shards"][i * n // 3:(i + 1) * n // 3]
            assert [s["file"] for s in rec["shards"]] == [s["file"] for s in want]
            assert c.seen == [x for s in rec["shards"] for x in s["ids"]]  # only its own shards computed
            seen += c.seen
            assert not store_of().exists()  # no index until every part has recorded
        assert sorted(seen) == sorted(e.id for e in exs)
        m = store_of().finish_parts(3)
        assert store_of().exists() and store_of().manifest() == m
        drop = ("seconds", "staging_peak_bytes")
        assert {k: v for k, v in m.items() if k not in drop} == {k: v for k, v in whole.items()
                                                                 if k not in drop}
        assert m["seconds"] > 0
    for s in whole["shards"]:
        want = (tmp_path / "one" / "k" / s["file"]).read_bytes()
        assert (tmp_path / "parts" / "k" / s["file"]).read_bytes() == want == (tmp_path / "bucket" / "k" / s[
                "file"]).read_bytes()
    # a part that has not recorded, or parts of another plan, leave no index
    half = FeatureStore(tmp_path / "half", "k", shard_tokens=100)
    half.extract(exs, Seeded(), {}, part=(0, 2))
    with pytest.raises(RuntimeError, match=r"parts \[1\] of 2 have not recorded"):
        half.finish_parts(2)
    FeatureStore(tmp_path / "half", "k", shard_tokens=70).extract(exs, Seeded(), {}, part=(1, 2))
    with pytest.raises(RuntimeError, match="do not make one plan's shards"):
        half.finish_parts(2)
    assert not half.exists()
    # a part restarted after a crash computes only the shards it had not written
    again = Seeded()
    (tmp_path / "parts" / "k" / whole["shards"][0]["file"]).unlink()
    rec = FeatureStore(tmp_path / "parts", "k", shard_tokens=100).extract(exs, again, {}, part=(0, 3))
    assert again.seen == whole["shards"][0]["ids"] and rec["resumed"] == n // 3 - 1
    with pytest.raises(ValueError, match="0 <= i < n"):
        FeatureStore(tmp_path / "x", "k").extract(exs, Seeded(), {}, part=(3, 3))


# ------------------------------------------------------------------ reading


@pytest.fixture
def cache(tmp_path):
    """A 'train' cache of 120 examples in ~40 shards, and a 2-shard 'held' one, in one root."""
    root = tmp_path / "features"
    m = FeatureStore(root, "train", shard_tokens=60).extract(_tokenized(120), Compute(), {})
    FeatureStore(root, "held", shard_tokens=120).extract(_tokenized(8, seed=5), Compute(), {})
    return str(root), m


class Recorder:
    """An opener that reads shards in place and records which (drafters.features.reading_through)."""

    def __init__(self):
        self.opened = []

    def open(self, store_dir, file, nbytes=None):
        self.opened.append((store_dir.name, file))
        return contextlib.nullcontext(store_dir / file)


def _rank_batches(data, world, rank, bs=3, seed=1, **kw):
    rec = Recorder()
    with reading_through(rec):
        got = [b.lengths.tolist() for b in batches(data, bs, seed, bucket=True, rank=rank, world=world, **kw)]
    return got, rec.opened


def test_each_rank_reads_only_its_own_shards_with_equal_steps(cache):
    root, m = cache
    data = [[root, "train", None]]
    plan = shards.rank_plan(data, 3, 3)
    assert plan.sharded and plan.padded <= shards.MAX_PAD * 120, plan.describe()
    toks = [sum(u.tokens for u in plan.mine(r)) for r in range(3)]
    assert max(toks) - min(toks) <= max(s["tokens"] for s in m["shards"])
    cfg = TrainConfig(verifier="v", backbone="hass", variant="math", out_dir="x", train_data=data,
                      batch_size=3,
                      epochs=2)
    assert schedule_steps(cfg, 3) == 2 * plan.steps
    seen, lengths = {}, {}
    for rank in range(3):
        for epoch in (1, 2):
            got, opened = _rank_batches(data, 3, rank, seed=epoch)
            assert len(got) == plan.steps  # the same number of micro-batches on every rank
            assert {f for _, f in opened} == {u.file for u in plan.mine(rank)}  # its own shards only
            seen.setdefault(epoch, []).extend({f for _, f in opened})
            lengths[rank, epoch] = got
        assert _rank_batches(data, 3, rank, seed=1)[0] == lengths[rank, 1]  # deterministic
        assert lengths[rank, 1] != lengths[rank, 2]  # reshuffled each epoch
        # every own example in the epoch, the few batches a short rank lacks taken again from its own
        own = sum(u.tokens for u in plan.mine(rank))
        assert own <= sum(map(sum, lengths[rank, 1])) <= own + max(s["tokens"] for s in m["shards"])
    for epoch in (1, 2):  # every shard read in each epoch, by one rank
        assert sorted(seen[epoch]) == sorted(s["file"] for s in m["shards"])
    # a resume inside the epoch: the rank's later batches, the same limit
    got, _ = _rank_batches(data, 3, 1, seed=1)
    assert _rank_batches(data, 3, 1, seed=1, skip=2)[0] == got[2:]


def test_subsets_split_by_the_index_and_small_caches_keep_the_interleaved_plan(cache):
    root, m = cache
    half = [i for s in m["shards"] for i in s["ids"]][:60]  # mixed_half: the first half of the selection
    plan = shards.rank_plan([[root, "train", half], [root, "held", None]], 2, 3)
    assert plan.sharded and sum(u.examples for u in plan.units) == 60 + 8
    assert {i for u in plan.units if u.key == "train" for i in u.ids} == set(half)
    small = shards.rank_plan([[root, "held", None]], 4, 3)  # 2 shards for 4 ranks
    assert not small.sharded and "2 shards for 4 ranks" in small.reason
    # every rank reads the whole cache and takes every world-th batch, as before
    got = [_rank_batches([[root, "held", None]], 2, r)[0] for r in range(2)]
    every = {s["file"] for s in FeatureStore(root, "held").manifest()["shards"]}
    assert len(got[0]) + len(got[1]) == 3 and {f for _, f in _rank_batches([[root, "held", None]], 2,
            1)[1]} == every
    old = FeatureStore(root, "train").manifest()  # an index written before it listed ids
    for s in old["shards"]:
        del s["ids"], s["lengths"], s["bytes"]
    FeatureStore(root, "train").manifest_path.write_text(json.dumps(old))
    assert not shards.rank_plan([[root, "train", half]], 2, 3).sharded
    assert shards.rank_plan([[root, "train", None]], 2, 3).sharded  # a whole old cache still splits


@pytest.fixture
def remote_cache(cache, tmp_path, monkeypatch):
    """The cache at a file:// URI, this 'node' with its own staging dir."""
    root, m = cache
    uri = (tmp_path / "bucket" / "features").as_uri()
    storage.sync(root, uri)
    monkeypatch.setenv("TASKSPEC_STAGING", str(tmp_path / "node"))
    return uri, m


def test_the_node_cache_downloads_only_what_is_read_and_stays_under_its_budget(remote_cache):
    uri, m = remote_cache
    data = localize_data([[uri, "train", None]])  # the manifest only
    local = storage.node_cache(uri) / "train"
    assert sorted(p.name for p in local.iterdir()) == ["manifest.json"]
    sizes = sorted(s["bytes"] for s in m["shards"])
    budget = sizes[-1] + sizes[-2] + 1  # two of the largest shards, not three
    cache = ShardCache(budget, {str(storage.node_cache(uri)): uri}, rank=1)
    plan = shards.rank_plan(data, 2, 3)
    with reading_through(cache):
        for epoch in (1, 2):
            list(batches(data, 3, epoch, bucket=True, rank=1, world=2))
            assert cache.nbytes() <= budget
    logged = [json.loads(x) for x in (cache.dir / "downloads.jsonl").read_text().splitlines()]
    mine = {u.file for u in plan.mine(1)}
    assert {x["ref"].rsplit("/", 1)[1] for x in logged} == mine  # only rank 1's shards
    assert max(x["held_bytes"] for x in logged) <= budget and len(mine) > 2  # evictions happened
    assert {p.name for p in local.iterdir()} - {"manifest.json"} <= mine
    # a shard larger than the budget is refused with the numbers
    tiny = ShardCache(sizes[0] - 1, {str(storage.node_cache(uri)): uri})
    with reading_through(tiny), pytest.raises(ValueError, match="does not fit the node's shard cache"):
        list(FeatureStore(storage.node_cache(uri), "train").iter_examples())


def test_ranks_on_one_node_share_shards_and_a_held_shard_is_never_evicted(remote_cache):
    uri, m = remote_cache
    data = localize_data([[uri, "train", None]])
    remotes = {str(storage.node_cache(uri)): uri}
    big = ShardCache(10 * sum(s["bytes"] for s in m["shards"]), remotes)
    caches = [ShardCache(big.budget, remotes, rank=r) for r in range(3)]
    errors = []

    def read(c):
        try:
            with reading_through(c):
                list(FeatureStore(data[0][0], "train").iter_examples())
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=read, args=(c,)) for c in caches]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sorted(r for c in caches for r in c.downloaded) == sorted(
        storage.join(uri, "train", s["file"]) for s in m["shards"])  # each shard downloaded once on the node
    # a shard held by one reader survives another's make-room
    first, second = m["shards"][0], m["shards"][1]
    small = ShardCache(first["bytes"] + 1, remotes)
    store = storage.node_cache(uri) / "train"
    with small.open(store, first["file"], first["bytes"]) as held:
        with ShardCache(small.budget, remotes).open(store, second["file"], second["bytes"]):
            assert held.is_file()  # over budget for the moment rather than delete a shard being read


# ------------------------------------------------------------------ extraction: the same bytes as before

OLD = "198231a"  # drafters/features.py before asynchronous host copies and the writer thread


def _old_features():
    """drafters/features.py at ``OLD`` (from git), imported inside the package; None without the history."""
    import subprocess
    import sys
    import types
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    try:
        src = subprocess.run(["git", "show", f"{OLD}:drafters/features.py"], cwd=root, capture_output=True,
                             text=True, check=True).stdout
    except (subprocess.CalledProcessError, FileNotFoundError):
        return None
    mod = types.ModuleType("drafters._old_features")
    mod.__package__ = "drafters"
    sys.modules[mod.__name__] = mod  # dataclasses look their module up
    try:
        exec(compile(src, "old:drafters/features.py", "exec"), mod.__dict__)
    finally:
        del sys.modules[mod.__name__]
    return mod


def _tiny_verifier():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    return LlamaForCausalLM(cfg).eval()


@pytest.mark.parametrize("aux", [None, (1, 2, 4)], ids=["eagle2-hass", "eagle3"])
def test_extraction_writes_the_same_bytes_as_before(tmp_path, aux):
    """The verifier's features of the same examples, extracted by the code at OLD (a copy to the host
    per tensor per example, shards serialised in the loop) and by today's (one copy per batch tensor,
    asynchronous where the device allows, a writer thread; streamed to a URI too): the same shard
    files byte for byte and the same index (timings aside), on the CPU."""
    from drafters.features import verifier_features

    old = _old_features()
    if old is None:
        pytest.skip(f"git history ({OLD}) is not available in this checkout")
    model, exs = _tiny_verifier(), _tokenized(16, seed=4)
    meta = {"corpus": "toy"} if aux is None else {"corpus": "toy", "aux_layers": list(aux)}
    before = old.FeatureStore(tmp_path / "old", "k", shard_tokens=70).extract(
        exs, lambda b: old.verifier_features(model, b, batch_tokens=128, aux_layers=aux), meta)
    now = FeatureStore(tmp_path / "new", "k", shard_tokens=70).extract(
        exs, lambda b: verifier_features(model, b, batch_tokens=128, aux_layers=aux, async_copies=True), meta)
    uri = (tmp_path / "bucket").as_uri()
    streamed = StreamingFeatureStore(tmp_path / "staging", "k", RemoteDir(storage.join(uri, "k")),
                                     70).extract(
        exs, lambda b: verifier_features(model, b, batch_tokens=128, aux_layers=aux, async_copies=True), meta)
    assert len(before["shards"]) >= 3
    for m in (now, streamed):
        assert {k: v for k, v in m.items() if k not in ("seconds", "staging_peak_bytes")} == \
            {k: v for k, v in before.items() if k != "seconds"}
    for s in before["shards"]:
        want = (tmp_path / "old" / "k" / s["file"]).read_bytes()
        assert (tmp_path / "new" / "k" / s["file"]).read_bytes() == want
        assert (tmp_path / "bucket" / "k" / s["file"]).read_bytes() == want  # streamed to the URI
    # online mode's features (the trainer's) are the same tensors, waited for or not
    for a, b in zip(old.verifier_features(model, exs[:5], aux_layers=aux), verifier_features(model, exs[:5],
                                                                                               aux_layers=aux)):
        for name in ("input_ids", "loss_mask", "features", "top_ids", "top_probs", "aux"):
            x, y = getattr(a, name), getattr(b, name)
            assert (x is None and y is None) or (torch.equal(x, y) and x.dtype == y.dtype), name


def test_extraction_copies_to_the_host_without_waiting_for_the_device(tmp_path):
    """On the CUDA stand-in (tests/accelerator.py): the code at OLD waited for the device once per
    tensor per example; today's synchronous form once per tensor per batch, and the extraction's
    asynchronous form not at all: its copies are non-blocking and the shard writer waits on each
    batch's event (one wait a batch). The same shard bytes either way."""
    from drafters.features import verifier_features
    from tests.accelerator import FakeCuda

    old = _old_features()
    model, exs = _tiny_verifier(), _tokenized(12, seed=4)
    counts = {}
    with FakeCuda() as acc:
        acc.place(model)
        for name, fn in (("old", old and (lambda b: old.verifier_features(model, b, batch_tokens=128))),
                         ("sync", lambda b: verifier_features(model, b, batch_tokens=128)),
                         ("async", lambda b: verifier_features(model, b, batch_tokens=128,
                                                               async_copies=True))):
            if fn is None:
                continue
            acc.reset()
            fn(exs)
            counts[name] = dict(acc.counts)
            acc.reset()
            store_class = old.FeatureStore if name == "old" else FeatureStore
            store_class(tmp_path / name, "k", shard_tokens=70).extract(exs, fn, {})
            counts[name + " extract"] = acc.counts["sync"]
    # (the verifier's own forward reads its attention mask on the host: the same syncs in every form)
    forward = counts["async"].get("sync", 0)
    assert counts["async"]["d2h_async"] == counts["sync"]["sync"] - forward == 3 * counts["async"]["h2d"] // 2
    assert not counts["sync"].get("d2h_async") and counts["async extract"] < counts["sync extract"]
    if "old" in counts:
        assert counts["old"]["sync"] - forward == 3 * len(exs) > counts["sync"]["sync"] - forward
        for s in FeatureStore(tmp_path / "old", "k").manifest()["shards"]:
            for name in ("sync", "async"):
                got = (tmp_path / name / "k" / s["file"]).read_bytes()
                assert got == (tmp_path / "old" / "k" / s["file"]).read_bytes()
    print(counts)


def test_the_driver_extracts_in_one_part_a_gpu():
    """orchestrator/plan/rates/taskgraph.py ``feature_parts``: the driver's features tasks per corpus, the
    dry run's split (one a GPU, by tokens); one a corpus on CPUs, online or self-distilled."""
    import dataclasses

    from orchestrator.plan.rates.taskgraph import feature_parts
    from orchestrator.plan.sizing import load_profile

    paper = load_profile("paper")
    assert feature_parts(paper, 32) == {"mathinstruct": 9, "sharegpt": 23}  # 350 vs 900 tokens an example
    assert sum(feature_parts(paper, 64).values()) == 64 and feature_parts(paper, 0) == {"mathinstruct": 1,
                                                                                          "sharegpt": 1}
    for data in ({"feature_mode": "online"}, {"self_distill": "greedy"}):
        p = dataclasses.replace(paper, data=dataclasses.replace(paper.data, **data))
        assert set(feature_parts(p, 32).values()) == {1}
    assert set(feature_parts(load_profile("smoke"), 8).values()) == {1}  # CPU tasks


def test_the_driver_runs_a_corpus_in_parts_then_writes_its_indexes(tmp_path, monkeypatch):
    """The driver's features stage with 3 parts a corpus (as on a GPU cluster), Ray replaced by
    calls in this process and the verifier by synthetic features: each corpus's parts get (i, 3),
    its caches get their indexes only from features_finish_task, and the unit is recorded done."""
    import dataclasses
    import types

    from orchestrator.plan.sizing import load_profile
    from orchestrator.run import driver as drv
    from workers import tasks

    calls = []

    def features_task(verifier, dtype, corpus, spec, root, online, relay, aux, shards):
        assert isinstance(spec, DataSpec)  # crosses Ray as itself, built from the dict the keys hash
        calls.append((corpus, shards))
        out = {}
        for part, exs in (("train", _tokenized(40, seed=1)), ("heldout", _tokenized(6, seed=2))):
            key = f"{corpus}-{part}-k"
            FeatureStore(root, key, shard_tokens=60).extract(exs, Seeded(), {"corpus": corpus}, part=shards)
            out.update({part: key, f"{part}_ids": [e.id for e in exs]})
        return out

    class Remote:  # ray.remote(...)(fn) and Relay, run at once in this process
        def __init__(self, fn=None):
            self.fn = fn

        def __call__(self, fn):
            return Remote(fn)

        def options(self, **kw):
            return self

        def remote(self, *a, **kw):
            return self.fn(*a, **kw) if self.fn else None

    fake_ray = types.SimpleNamespace(remote=lambda **kw: Remote(), get=lambda x: x, kill=lambda x: None)
    monkeypatch.setattr(drv, "ray", fake_ray)
    monkeypatch.setattr(drv, "Relay", Remote())
    monkeypatch.setattr(drv, "wait_relaying", lambda ref, relay, prog: ref)
    monkeypatch.setattr(drv, "feature_parts", lambda p, gpus: {c: 3 for c in ("mathinstruct", "sharegpt")})
    monkeypatch.setattr(tasks, "features_task", features_task)
    monkeypatch.setenv("TASKSPEC_STAGING", str(tmp_path / "staging"))
    p = load_profile("smoke")
    p = dataclasses.replace(p, data=dataclasses.replace(p.data, feature_mode="cached"))
    d = drv.Driver(p, str(tmp_path / "run"))
    d.verifier_name, d.plan = "v", types.SimpleNamespace(gpus=6)
    monkeypatch.setattr(d, "_draft_vocab", lambda corpora: None)
    try:
        caches = d.stage_features()
    finally:
        d.lease.release()
    assert sorted(calls) == [(c, (i, 3)) for c in ("mathinstruct", "sharegpt") for i in range(3)]
    root = tmp_path / "run" / "features"
    for c in ("mathinstruct", "sharegpt"):
        for part in ("train", "heldout"):
            m = FeatureStore(root, caches[c][part]).manifest()
            assert [i for s in m["shards"] for i in s["ids"]] == caches[c][f"{part}_ids"]
            assert (root / caches[c][part] / "parts" / "2-of-3.json").is_file()
    units = d.manifest.cells("features")
    assert len(units) == 2 and all(d.manifest.done(k) for k in units)
