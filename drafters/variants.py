"""The study's data variants and the feature caches they read.

Per corpus, ONE seeded permutation of the conversations decides everything: the first ``n``
eligible examples are the training set, the next ``heldout`` ones the held-out slice. ``math``
and ``chat`` use all n of their corpus; ``mixed_half`` the first n/2 of each; ``mixed_full``
all n of each. Mixed variants therefore reference the single-domain caches, never recompute.
"""
from __future__ import annotations

import functools
import random
import warnings

from drafters.corpora import CORPORA, variant_corpora
from drafters.data.sources import SourceOptions, load_corpus
from drafters.data.spec import DataSpec
from drafters.data.templating import tokenize_conversation
from drafters.distill import distilled
from drafters.features import FeatureStore, aux_tag, check_aux_layers, content_key, verifier_features

DEFAULT_SOURCES = SourceOptions()  # the functions' default (frozen: one instance serves every call)


def select_examples(tokenizer, eos_ids, corpus: str, spec: DataSpec,
                    options: SourceOptions = DEFAULT_SOURCES):
    """Tokenized (train, heldout) examples of one corpus, deterministic given spec.seed."""
    train, held = select_conversations(tokenizer, eos_ids, corpus, spec, options)
    return [e for _, e in train], [e for _, e in held]


def select_conversations(tokenizer, eos_ids, corpus: str, spec: DataSpec,
                         options: SourceOptions = DEFAULT_SOURCES):
    """(train, heldout) lists of (conversation, tokenized example), deterministic given spec.seed."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        convs, _ = load_corpus(corpus, options, need=spec.n + spec.heldout)
    order = list(range(len(convs)))
    random.Random(spec.seed).shuffle(order)
    need = spec.n + spec.heldout
    out = []
    for i in order:
        ex = tokenize_conversation(tokenizer, convs[i], spec.max_length, eos_ids)
        if sum(ex.loss_mask[1:]) == 0:
            continue  # no assistant token inside max_length
        out.append((convs[i], ex))
        if len(out) == need:
            break
    if len(out) < need:
        raise ValueError(f"corpus {corpus!r} has only {len(out)} examples with assistant tokens within "
                         f"max_length={spec.max_length}; need n + heldout = {need}")
    return out[: spec.n], out[spec.n :]


def ensure_features(model, tokenizer, eos_ids, verifier: str, corpus: str, spec: DataSpec, root: str,
                    options: SourceOptions = DEFAULT_SOURCES, progress=None, prefetch=None,
                    aux_layers=None, store_for=FeatureStore, shards: tuple[int, int] | None = None) -> dict:
    """Extract (or reuse) the feature caches of one corpus: {"train": key, "heldout": key, ...}.

    A second call with the same content key runs no verifier forward pass. ``prefetch(key)``, if
    given, runs before each cache lookup (e.g. to copy the cache from remote storage). With
    ``spec.self_distill`` (for the corpora ``spec.self_distill_corpora`` names, or every corpus) the
    training examples' assistant turns are the verifier's own answers (the same conversations and user
    turns); the held-out slice stays original, so agreement is comparable.
    ``aux_layers`` (EAGLE-3): the caches also hold those layers' hidden states, under their own keys
    (``<corpus>-<part>-aux2-15-27-<hash>``); without it the keys and contents are EAGLE-2/HASS's.
    ``store_for(root, key)``: the store a cache is written to (e.g. one streaming it to a URI).
    ``shards`` = (i, n): this call computes only part i of n of each cache's shards (data-parallel
    extraction, FeatureStore.extract); the index is written by ``finish_parts`` once all have.
    """
    mode = spec.distills(corpus)  # None: this corpus keeps its original answers
    if shards is not None and mode:
        raise ValueError("self-distilled caches are extracted in one part (every part would distil every "
                         "example)")
    if aux_layers is not None:
        aux_layers = check_aux_layers(model, aux_layers)  # before any work
    train, held = select_conversations(tokenizer, eos_ids, corpus, spec, options)
    train_exs, held_exs = [e for _, e in train], [e for _, e in held]
    train_part = "train"
    if mode:
        train_part = f"train-distill-{mode}-{spec.seed}"
        convs = distilled(model, tokenizer, eos_ids, verifier, corpus, [c for c, _ in train], spec.max_length,
                          mode, spec.seed, root, progress=progress)
        train_exs = [tokenize_conversation(tokenizer, c, spec.max_length, eos_ids) for c in convs]
    # copies to the host without waiting for them: the store's writer thread waits
    compute = functools.partial(verifier_features, model, aux_layers=aux_layers, async_copies=True)
    keys = {}
    for part, label, exs in (("train", train_part, train_exs), ("heldout", "heldout", held_exs)):
        key = content_key(verifier, f"{corpus}-{label}{aux_tag(aux_layers)}", [e.id for e in exs],
                          spec.max_length)
        if prefetch is not None:
            prefetch(key)
        store = store_for(root, key)
        if not store.exists():
            meta = {"verifier": verifier, "corpus": corpus, "part": part, "max_length": spec.max_length,
                    "seed": spec.seed, "self_distill": mode if part == "train" else None}
            if aux_layers is not None:
                meta["aux_layers"] = [int(i) for i in aux_layers]
            what = f"features {corpus}/{part}" + (f" (part {shards[0] + 1} of {shards[1]})" if shards else "")
            store.extract(exs, compute, meta, part=shards,
                          progress=progress and (lambda done, n, w=what: progress(w, done, n)))
        keys[part] = key
        keys[f"{part}_ids"] = [e.id for e in exs]
    return keys


def variant_data(variant: str, root: str, caches: dict, n: int) -> list:
    """[[store_root, key, ids], ...] of a variant, from the per-corpus caches of ensure_features."""
    corpora = variant_corpora(variant)

    def entry(corpus, ids):
        c = caches[corpus]
        return ["online", corpus, ids] if c.get("online") else [root, c["train"], ids]

    if len(corpora) == 1:
        return [entry(corpora[0], None)]
    take = n // 2 if variant == "mixed_half" else n
    return [entry(c, caches[c]["train_ids"][:take]) for c in corpora]


def heldout_data(root: str, caches: dict) -> list:
    return [["online-heldout", c, None] if caches[c].get("online") else [root, caches[c]["heldout"], None]
            for c in CORPORA if c in caches]


def build_vocab(tokenizer, eos_ids, corpora: list[str], spec: DataSpec, size: int, vocab_size: int,
                options: SourceOptions = DEFAULT_SOURCES):
    """The reduced draft vocabulary of a backbone: the ``size`` most frequent target tokens at
    assistant positions of the training examples of every corpus it trains on (the end-of-turn
    ids always in). Returns (sorted ids, stats)."""
    from drafters.vocab import count_targets, select_ids

    counts = sum(count_targets(select_examples(tokenizer, eos_ids, c, spec, options)[0], vocab_size)
                 for c in corpora)
    ids = select_ids(counts, size, eos_ids)
    total = int(counts.sum())
    stats = {"corpora": list(corpora), "size": size, "target_tokens": total,
             "distinct_targets": int((counts > 0).sum()),
             "coverage": float(counts[ids].sum()) / total if total else float("nan")}
    return ids, stats


def online_selection(tokenizer, eos_ids, corpus: str, spec: DataSpec,
                     options: SourceOptions = DEFAULT_SOURCES) -> dict:
    """``online`` mode: only the example selection (ids); features are computed while training."""
    train, held = select_examples(tokenizer, eos_ids, corpus, spec, options)
    return {"online": True, "train_ids": [e.id for e in train], "heldout_ids": [e.id for e in held]}
