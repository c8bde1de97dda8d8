"""The bodies of the driver's one-off Ray tasks: a corpus's features, a backbone's initial drafter,
the run's draft vocabulary. Each loads the verifier where it runs and reads and writes through
storage URIs (or paths)."""
from __future__ import annotations

import time
from pathlib import Path

import ray

from common import storage
from common.verifiers import eos_token_ids, resolve
from decoding.verifiers import load_verifier
from drafters.checkpoint import initial_of
from drafters.eagle3 import default_aux_layers
from drafters.features import extraction_device
from drafters.variants import DataSpec, build_vocab, ensure_features, online_selection
from drafters.vocab import save_vocab
from workers import artifacts
from workers.relay import RelaySender


def features_task(verifier, dtype, corpus, spec: DataSpec, root, online=False, relay=None, aux=False,
                  shards=None):
    """Extract one corpus's caches under ``root`` (a path or URI), on the task's GPU when it holds
    one (in the profile's dtype), else on the CPU. With a URI the remote copy is the truth: a cache
    whose manifest is there is done; else its shards are computed and uploaded one by one (local
    disk: about two shards), those already there skipped. Progress goes to the worker log and,
    through ``relay``, to the driver log once a minute. ``aux``: the caches also hold EAGLE-3's
    layers (the reference's three; EAGLE-2/HASS read the rest of them). ``shards`` = (i, n): only
    part i of n of each cache's shards, one part per device (``features_finish_task`` writes the
    indexes once every part is done)."""
    if online:  # fix the selection here; features are computed later, inside training
        model, tok = load_verifier(verifier, dtype=dtype)
        return online_selection(tok, eos_token_ids(model, tok), corpus, spec)
    import torch

    device = extraction_device(ray.get_gpu_ids(), torch.cuda.is_available())
    model, tok = load_verifier(verifier, dtype=dtype, device=device)
    tag = corpus if shards is None else f"{corpus} part {shards[0] + 1}/{shards[1]}"
    t0 = time.time()
    started = {}
    last = [time.time()]
    sender = RelaySender(relay, tag)

    def progress(what: str, done: int, total: int) -> None:  # worker log (dashboard) and the driver log
        now = time.time()
        t = started.setdefault(what, last[0])  # a sub-stage starts when the one before it last reported
        last[0] = now
        eta = (now - t) / done * (total - done) if done else float("nan")
        line = f"{what}: {done}/{total}, elapsed {now - t0:.0f}s, ETA {eta:.0f}s"
        print(f"[features {tag}] {line}", flush=True)
        sender.send(line)

    aux_layers = default_aux_layers(model.config.num_hidden_layers) if aux else None
    print(f"[features {tag}] verifier on {device} in {model.dtype}", flush=True)
    return ensure_features(model, tok, eos_token_ids(model, tok), resolve(verifier).name, corpus,
                           spec, str(storage.node_cache(root)), progress=progress,
                           aux_layers=aux_layers,
                           store_for=artifacts.feature_stores(root, model, aux_layers), shards=shards)


def features_finish_task(root, caches: dict, parts: int) -> dict:
    """The indexes of a corpus's caches under ``root`` extracted in ``parts`` parts (features_task's
    ``shards``), once every part is done: no verifier, only the parts' records at the store."""
    for part in ("train", "heldout"):
        store = artifacts.feature_store_at(root, caches[part])
        if not store.exists():
            store.finish_parts(parts)
    return caches


def initial_task(verifier, dtype, src):
    """(model, config): the initial drafter that the trained checkpoint ``src`` (a path or URI)
    started from, built where the verifier loads (an EAGLE-3 init holds its LM-head rows)."""
    model, _ = load_verifier(verifier, dtype=dtype)
    return initial_of(storage.fetch(src), model.get_output_embeddings().weight)


def vocab_task(verifier, dtype, corpora, spec: DataSpec, size, dest):
    """The reduced draft vocabulary of the run (every backbone trains on these corpora), written
    next to the features and published to ``dest`` (a path or URI)."""
    model, tok = load_verifier(verifier, dtype=dtype)
    ids, stats = build_vocab(tok, eos_token_ids(model, tok), corpora, spec, size,
                             model.config.vocab_size)
    local = storage.node_cache(dest) if storage.is_uri(dest) else Path(dest)
    save_vocab(ids, local, stats)
    storage.publish(local, dest)
    return stats
