"""Verifier feature cache for drafter training.

Per token: the feature the LM head consumes (post final-norm last hidden state, float16), and the
verifier's top-10 next-token ids and probabilities (HASS distillation). An EAGLE-3 cache
(``aux_layers`` given) also holds the verifier's hidden states at those ``output_hidden_states``
indices, concatenated (float16), captured by hooks on those layers only. Sharded safetensors files
plus a manifest.json (the shard index, written last), under a content key (verifier + corpus +
selected example ids + max length). Shards are cut from the examples' lengths before any forward
pass, so a resumed extraction skips the shards already stored; a cache at a URI is streamed there
shard by shard (StreamingFeatureStore). Readers stream one shard at a time, through a node-local
cache when one is set (``reading_through``).
"""
from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from common.atomic import write_text_atomic
from drafters.data.templating import TokenizedExample

TOPK = 10
AUX = "aux"  # EAGLE-3's aux layers in a shard; every shard also holds SHARD_TENSORS
SHARD_TENSORS = ("features", "input_ids", "lengths", "loss_mask", "top_ids", "top_probs")
SHARD_TOKENS = 200_000  # the most tokens a shard holds
SHARD_BYTES = 1 << 30  # and about the most bytes (a big verifier's shards hold fewer tokens)
FORMAT = 2  # the index lists each shard's ids, lengths and bytes; shard names carry a digest of their ids


@dataclass
class FeatureExample:
    id: str
    input_ids: torch.Tensor  # (L,) long
    loss_mask: torch.Tensor  # (L,) bool
    features: torch.Tensor  # (L, H) verifier features f_0..f_{L-1}
    top_ids: torch.Tensor  # (L, K) verifier top-K next-token ids at each position
    top_probs: torch.Tensor  # (L, K)
    aux: torch.Tensor | None = None  # (L, A*H) EAGLE-3: hidden states of the aux layers, concatenated
    ready: object = None  # a CUDA event: the tensors are being copied to the host until it completes

    def wait(self) -> FeatureExample:
        """The example once its tensors are on the host (verifier_features' ``async_copies``)."""
        if self.ready is not None:
            self.ready.synchronize()
        return self


def content_key(verifier: str, corpus: str, example_ids: list[str], max_length: int) -> str:
    h = hashlib.sha256(json.dumps([verifier, corpus, example_ids, max_length]).encode()).hexdigest()
    return f"{corpus}-{h[:16]}"


def aux_tag(aux_layers) -> str:
    """The cache-key suffix of an EAGLE-3 cache (``-aux2-15-27``); '' for EAGLE-2/HASS's."""
    return "" if aux_layers is None else "-aux" + "-".join(str(int(i)) for i in aux_layers)


def check_aux_layers(model, aux_layers) -> tuple[int, ...]:
    n = model.config.num_hidden_layers
    layers = tuple(aux_layers)
    if not layers or len(set(layers)) != len(layers) or any(
            isinstance(i, bool) or not isinstance(i, int) or not 0 <= i <= n for i in layers):
        raise ValueError(f"aux_layers must be distinct ints in [0, {n}] (output_hidden_states indices of a "
                         f"{n}-layer verifier), got {list(layers)}")
    return layers


@contextlib.contextmanager
def captured_layers(model, aux_layers):
    """{i: hidden state} filled by each forward pass: ``output_hidden_states[i]``, i.e. the input of
    decoder layer i (a pre-hook on that layer only); i = L, the final normed state, is not hooked
    (the caller has it as ``last_hidden_state``)."""
    got, hooks = {}, []
    for i in check_aux_layers(model, aux_layers):
        if i < model.config.num_hidden_layers:
            def hook(mod, args, kwargs, i=i):
                got[i] = args[0] if args else kwargs["hidden_states"]
            hooks.append(model.model.layers[i].register_forward_pre_hook(hook, with_kwargs=True))
    try:
        yield got
    finally:
        for h in hooks:
            h.remove()


def _padded_batches(examples: list[TokenizedExample], batch_tokens: int) -> Iterator[list[TokenizedExample]]:
    """Consecutive examples in right-padded mini-batches of at most ``batch_tokens`` (one at least)."""
    i = 0
    while i < len(examples):
        batch = [examples[i]]
        while i + len(batch) < len(examples) and (len(batch) + 1) * max(
                len(e.input_ids) for e in batch + [examples[i + len(batch)]]) <= batch_tokens:
            batch.append(examples[i + len(batch)])
        i += len(batch)
        yield batch


def _to_host(tensors: list, async_copies: bool) -> tuple[list, object]:
    """``tensors`` on the host, and the event to wait for before reading them (None: readable now).
    On CUDA one copy per tensor into pinned memory, ``non_blocking`` with ``async_copies`` (the
    device goes on; the event marks the copies), else waited for here; on the CPU the tensors as they are."""
    if not tensors[0].is_cuda:
        return tensors, None
    host, pinned = [], torch.backends.cuda.is_built()  # (not on tests/accelerator.py's CPU stand-in)
    for t in tensors:
        buf = torch.empty(t.shape, dtype=t.dtype, pin_memory=pinned)
        buf.copy_(t, non_blocking=async_copies)
        host.append(buf)
    if not async_copies:
        return host, None
    ready = torch.cuda.Event()
    ready.record()
    return host, ready


@torch.no_grad()
def verifier_features(model, examples: list[TokenizedExample], batch_tokens: int = 4096,
                      aux_layers=None, async_copies: bool = False) -> list[FeatureExample]:
    """Run the verifier over tokenized examples (one forward each; right-padded mini-batches).
    ``aux_layers``: also each example's hidden states at those layers (EAGLE-3), in that order.
    Each batch's outputs reach the host in one copy per tensor (not one per example); with
    ``async_copies`` (on CUDA) without waiting: the examples' ``ready`` event says when they may be
    read (``FeatureExample.wait``; the shard writer waits), so the device never waits on the host."""
    out = []
    dev = model.device
    n_layers = model.config.num_hidden_layers
    capture = captured_layers(model, aux_layers) if aux_layers is not None else contextlib.nullcontext({})
    with capture as got:
        for batch in _padded_batches(examples, batch_tokens):
            L = max(len(e.input_ids) for e in batch)
            ids = torch.zeros(len(batch), L, dtype=torch.long)
            att = torch.zeros(len(batch), L, dtype=torch.long)
            for b, e in enumerate(batch):
                ids[b, : len(e.input_ids)] = torch.tensor(e.input_ids)
                att[b, : len(e.input_ids)] = 1
            h = model.model(input_ids=ids.to(dev), attention_mask=att.to(dev)).last_hidden_state  # (B, L, H)
            probs = model.lm_head(h).float().softmax(-1)  # (B, L, V)
            top = probs.topk(TOPK, dim=-1)
            outs = [h.to(torch.float16), top.indices.to(torch.int32), top.values.to(torch.float16)]
            if aux_layers is not None:
                fused = torch.cat([h if j == n_layers else got[j] for j in aux_layers], dim=-1)  # (B, L, A*H)
                outs.append(fused.to(torch.float16))
            (feats, tids, tprobs, *aux), ready = _to_host(outs, async_copies)
            for b, e in enumerate(batch):
                n = len(e.input_ids)
                mask = torch.tensor(e.loss_mask[:n], dtype=torch.bool)
                out.append(FeatureExample(e.id, ids[b, :n], mask, feats[b, :n], tids[b, :n], tprobs[b, :n],
                                          aux[0][b, :n] if aux else None, ready))
    return out


def extraction_device(gpu_ids, cuda_available: bool) -> str:
    """Where a features task runs the verifier: ``cuda`` when Ray gave it a GPU (``gpu_ids``,
    ``ray.get_gpu_ids()``), else ``cpu``. A task that holds a GPU torch cannot see is refused:
    running an 8B verifier on the host instead would take days and say nothing."""
    if not gpu_ids:
        return "cpu"
    if not cuda_available:
        raise RuntimeError(f"the features task holds GPU(s) {list(gpu_ids)} but torch sees no CUDA device "
                           "(CUDA_VISIBLE_DEVICES, the driver or the torch build): not extracting on the CPU")
    return "cuda"


def token_bytes(hidden: int, n_aux: int = 0) -> int:
    """Bytes one token takes in a shard: float16 features (+ the aux layers), top-K ids (int32) and
    probabilities (float16), its input id (int64) and loss mask (uint8)."""
    return 2 * hidden * (1 + n_aux) + TOPK * (4 + 2) + 8 + 1


def shard_tokens_for(hidden: int, n_aux: int = 0, target_bytes: int = SHARD_BYTES,
                     cap: int = SHARD_TOKENS) -> int:
    """Tokens per shard: ``cap``, or fewer so that a shard stays near ``target_bytes`` (an 8B
    verifier's EAGLE-3 cache takes 32 KiB a token: 1 GiB is about 32k tokens)."""
    return max(1, min(cap, target_bytes // token_bytes(hidden, n_aux)))


def plan_shards(lengths: list[int], shard_tokens: int) -> list[tuple[int, int]]:
    """[start, stop) example ranges of the shards: a shard closes once it holds >= ``shard_tokens``
    tokens. From lengths alone, so a resumed extraction knows every shard before any forward pass."""
    if shard_tokens < 1:
        raise ValueError(f"shard_tokens must be >= 1, got {shard_tokens}")
    out = []
    start = 0
    n = 0
    for i, L in enumerate(lengths):
        n += L
        if n >= shard_tokens:
            out.append((start, i + 1))
            start, n = i + 1, 0
    if start < len(lengths):
        out.append((start, len(lengths)))
    return out


def part_range(shards: int, part: tuple[int, int] | None) -> tuple[int, int]:
    """[lo, hi) of the plan's shards that part (i, n) computes: n contiguous runs, sizes within one."""
    if part is None:
        return 0, shards
    i, n = part
    if not 0 <= i < n:
        raise ValueError(f"part must be (i, n) with 0 <= i < n, got {part}")
    return i * shards // n, (i + 1) * shards // n


def shard_name(i: int, ids: list[str]) -> str:
    """``shard-00003-<digest of its example ids>.safetensors``: a file of that name at the store
    holds exactly those examples, so a resumed extraction skips it (a shard plan cut otherwise, e.g.
    at another shard size, names its shards otherwise)."""
    return f"shard-{i:05d}-{hashlib.sha256(json.dumps(ids).encode()).hexdigest()[:12]}.safetensors"


def _shard_tensors(buf: list[FeatureExample]) -> dict:
    for e in buf:
        e.wait()
    tensors = {
        "lengths": torch.tensor([len(e.input_ids) for e in buf]),
        "input_ids": torch.cat([e.input_ids for e in buf]),
        "loss_mask": torch.cat([e.loss_mask for e in buf]).to(torch.uint8),
        "features": torch.cat([e.features for e in buf]), "top_ids": torch.cat([e.top_ids for e in buf]),
        "top_probs": torch.cat([e.top_probs for e in buf]),
    }
    if buf[0].aux is not None:  # an EAGLE-3 cache (EAGLE-2/HASS shards are unchanged)
        tensors["aux"] = torch.cat([e.aux for e in buf])
    return tensors


# ---------------------------------------------------------------- reading shards through a node cache
_OPENER: contextvars.ContextVar = contextvars.ContextVar("shard_opener", default=None)
_TENSORS: contextvars.ContextVar = contextvars.ContextVar("shard_tensors", default=None)


@contextlib.contextmanager
def reading_through(opener) -> Iterator[None]:
    """Inside the block, shards are opened through ``opener.open(store_dir, file, nbytes[, tensors=])``
    (a context manager yielding a local path: workers/shard_cache.py downloads a shard of a cache at
    a URI into a bounded node-local cache and holds it while it is read), and an opener with an
    ``expect(shards)`` is told the order in which an epoch will open them (to fetch ahead). Its
    ``close()``, if it has one, runs at the end of the block."""
    token = _OPENER.set(opener)
    try:
        yield
    finally:
        _OPENER.reset(token)
        if hasattr(opener, "close"):
            opener.close()


@contextlib.contextmanager
def reading_tensors(names) -> Iterator[None]:
    """Inside the block, shards are read for ``names`` only (None: every tensor); a shard of a cache
    that holds more (EAGLE-3's ``aux``) is opened for those alone, so a node cache downloads only
    their bytes. drafters/train/loop.py reads a backbone's ``feature_tensors``."""
    token = _TENSORS.set(None if names is None else tuple(sorted(names)))
    try:
        yield
    finally:
        _TENSORS.reset(token)


def expect_shards(shards: list) -> None:
    """Tell the opener (``reading_through``) the shards an epoch opens next, in order:
    [(store dir, file, bytes, tensors), ...] as ``FeatureStore.reads`` lists them."""
    opener = _OPENER.get()
    if opener is not None and hasattr(opener, "expect"):
        opener.expect(shards)


@contextlib.contextmanager
def open_shard(store_dir: Path, file: str, nbytes: int | None = None, tensors=None) -> Iterator[Path]:
    opener = _OPENER.get()
    if opener is not None:
        with opener.open(store_dir, file, nbytes, **({} if tensors is None
                                                     else {"tensors": tensors})) as path:
            yield path
        return
    path = store_dir / file
    if not path.is_file():
        raise FileNotFoundError(f"feature shard {path} is missing (its cache's manifest lists it)")
    yield path


def load_shard(path: Path, names) -> tuple[list[str], dict]:
    """(example ids, {name: tensor}) of a shard file: ``names`` only (those it has), or all (None)."""
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        ids = json.loads(f.metadata()["ids"])
        if names is None:
            return ids, load_file(str(path))
        return ids, {k: f.get_tensor(k) for k in f.keys() if k in names}


class FeatureStore:
    """One cache entry: DIR/<key>/{manifest.json, shard-00000-<digest>.safetensors, ...}. The
    manifest (the shard index: per shard its file, example ids, lengths, tokens and bytes) is
    written last: it is the commit point. Caches written before the index held ids and lengths
    (``format`` absent) are read the same way."""

    def __init__(self, root: str | os.PathLike, key: str, shard_tokens: int = SHARD_TOKENS):
        self.dir = Path(root) / key
        self.key = key
        self.shard_tokens = shard_tokens
        self.extra_meta: dict = {}  # recorded in the manifest too (where and in what dtype it was computed)

    @property
    def manifest_path(self) -> Path:
        return self.dir / "manifest.json"

    def exists(self) -> bool:
        return self.manifest_path.is_file()

    def manifest(self) -> dict:
        return json.loads(self.manifest_path.read_text())

    # where finished files go: here, in place; feature_stream.StreamingFeatureStore: to object storage
    def _finished(self) -> dict[str, int]:
        """{shard file: bytes} already at the store."""
        return {p.name: p.stat().st_size for p in self.dir.glob("shard-*.safetensors")}

    def _commit(self, tmp: Path, name: str) -> None:
        os.replace(tmp, self.dir / name)

    def _drain(self) -> None:
        pass

    def _write_text(self, name: str, text: str) -> None:
        """A small file of the cache (the index, a part's record), written whole or not at all."""
        (self.dir / name).parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(self.dir / name, text)

    def _read_text(self, name: str) -> str | None:
        p = self.dir / name
        return p.read_text() if p.is_file() else None

    def _meta(self, meta: dict) -> dict:
        """What the index records beside the shards: the caller's meta and this store's own."""
        return {**meta, **self.extra_meta}

    def _put_shard(self, name: str, buf: list[FeatureExample]) -> dict:
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.dir / f".{name}.{os.getpid()}.tmp"
        ids = [e.id for e in buf]
        try:
            save_file(_shard_tensors(buf), str(tmp), metadata={"ids": json.dumps(ids)})
            nbytes = tmp.stat().st_size
            self._commit(tmp, name)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return _entry(name, ids, [len(e.input_ids) for e in buf], nbytes)

    def _finish(self, meta: dict, shards: list[dict], seconds: float | None, resumed: int = 0,
                shard_tokens: int | None = None) -> dict:
        """Write the index (``meta``: ``_meta``'s) of ``shards``: the commit point."""
        manifest = {"key": self.key, **meta, "format": FORMAT, "examples": sum(s["examples"] for s in shards),
                    "tokens": sum(s["tokens"] for s in shards),
                    "shard_tokens": shard_tokens or self.shard_tokens, "resumed_shards": resumed,
                    "shards": shards}
        # the extraction rate orchestrator/plan/rates/measured.py reads (not for a resumed one)
        if seconds is not None:
            manifest["seconds"] = seconds
        self._write_text("manifest.json", json.dumps(manifest))
        return manifest

    def finish_parts(self, parts: int) -> dict:
        """The index of a cache extracted in ``parts`` parts (``extract(part=...)``), written once
        every part has recorded its shards and together they are every shard of the plan; its
        ``seconds`` are the parts' summed (device-seconds, as one task's would be)."""
        recs = [self._read_text(f"parts/{i}-of-{parts}.json") for i in range(parts)]
        missing = [i for i, r in enumerate(recs) if r is None]
        if missing:
            raise RuntimeError(f"feature cache {self.key}: parts {missing} of {parts} have not recorded "
                               "their shards")
        recs = [json.loads(r) for r in recs]
        shards = sorted((x for r in recs for x in r["shards"]), key=lambda x: x["file"])
        planned = {r["planned"] for r in recs}
        if len(planned) != 1 or len(shards) != planned.pop() or len({x["file"]
                                                                     for x in shards}) != len(shards):
            raise RuntimeError(f"feature cache {self.key}: its {parts} parts do not make one plan's shards "
                               f"({len(shards)} recorded, planned {sorted({r['planned'] for r in recs})})")
        meta = dict(recs[0]["meta"])
        if "staging_peak_bytes" in meta:
            meta["staging_peak_bytes"] = max(r["meta"]["staging_peak_bytes"] for r in recs)
        seconds = None if any(r["seconds"] is None for r in recs) else sum(r["seconds"] for r in recs)
        return self._finish(meta, shards, seconds, sum(r["resumed"] for r in recs), recs[0]["shard_tokens"])

    def write(self, examples_iter, meta: dict, shard_tokens: int | None = None) -> dict:
        """Consume FeatureExamples, write shards, then the manifest (the commit point)."""
        limit, t0 = shard_tokens or self.shard_tokens, time.perf_counter()
        shards = []
        buf = []
        ntok = 0
        try:
            for e in examples_iter:
                buf.append(e)
                ntok += len(e.input_ids)
                if ntok >= limit:
                    shards.append(self._put_shard(shard_name(len(shards), [x.id for x in buf]), buf))
                    buf, ntok = [], 0
            if buf:
                shards.append(self._put_shard(shard_name(len(shards), [x.id for x in buf]), buf))
        finally:
            self._drain()
        # seconds: the verifier's forward passes included (the iterator computes them)
        return self._finish(self._meta(meta), shards, time.perf_counter() - t0)

    def extract(self, examples: list, compute, meta: dict, progress=None, chunk: int = 16,
                part: tuple[int, int] | None = None) -> dict:
        """Features of tokenized ``examples`` (``compute(list) -> list[FeatureExample]``, ``chunk`` at
        a time), shard by shard as ``plan_shards`` cuts them; a shard already at the store (a resumed
        extraction) is skipped without a forward pass. ``progress(done, total)`` after each chunk.
        A writer thread serialises (and, streaming, hands to the upload) each shard while the next
        is computed: at most two shards in host memory, the one written and the one computed.
        ``part`` = (i, n): data-parallel extraction, one part per device: only the i-th of n
        contiguous runs of the plan's shards, and a record of them (``parts/<i>-of-<n>.json``) in
        place of the index, which ``finish_parts(n)`` writes once every part has recorded."""
        lengths = [len(e.input_ids) for e in examples]
        plan = plan_shards(lengths, self.shard_tokens)
        lo, hi = part_range(len(plan), part)
        first, count = (plan[lo][0], plan[hi - 1][1] - plan[lo][0]) if hi > lo else (0, 0)
        have = self._finished()
        shards = []
        resumed = 0
        t0 = time.perf_counter()
        writer, last = ThreadPoolExecutor(1, thread_name_prefix=f"write-{self.key}"), None
        try:
            for i, (a, b) in list(enumerate(plan))[lo:hi]:
                ids = [e.id for e in examples[a:b]]
                name = shard_name(i, ids)
                if name in have:
                    shards.append(_entry(name, ids, lengths[a:b], have[name]))
                    resumed += 1
                    continue
                buf = []
                for j in range(a, b, chunk):
                    buf += compute(examples[j : min(j + chunk, b)])
                    if progress:
                        progress(min(j + chunk, b) - first, count)
                if last is not None:
                    last.result()  # the previous shard is written (its error stops the extraction here)
                last = writer.submit(self._put_shard, name, buf)  # written while the next one is computed
                shards.append(last)
        finally:
            writer.shutdown(wait=True)
            self._drain()
        shards = [s if isinstance(s, dict) else s.result() for s in shards]
        seconds = None if resumed else time.perf_counter() - t0
        if part is None:
            return self._finish(self._meta(meta), shards, seconds, resumed)
        record = {"part": part[0], "parts": part[1], "planned": len(plan), "shard_tokens": self.shard_tokens,
                  "meta": self._meta(meta), "seconds": seconds, "resumed": resumed, "shards": shards}
        self._write_text(f"parts/{part[0]}-of-{part[1]}.json", json.dumps(record))
        return record

    def reads(self, select: set[str] | None = None, files: set[str] | None = None) -> list[tuple]:
        """The shards ``iter_examples(select, files)`` opens, in order, as (dir, file, bytes, tensors):
        ``tensors`` the ones read (``reading_tensors``) when the shards hold others, else None. A
        shard the index shows to hold none of ``select`` is not opened."""
        m = self.manifest()
        want = _TENSORS.get()
        part = want if want is not None and "aux_layers" in m and AUX not in want else None
        out = []
        for s in m["shards"]:
            if files is not None and s["file"] not in files:
                continue
            if select is not None and "ids" in s and select.isdisjoint(s["ids"]):
                continue
            out.append((self.dir, s["file"], s.get("bytes"), part))
        return out

    def iter_examples(self, select: set[str] | None = None,
                      files: set[str] | None = None) -> Iterator[FeatureExample]:
        """Stream examples shard by shard (only one shard in memory); ``files``: only those shards."""
        want = _TENSORS.get()
        for store_dir, file, nbytes, part in self.reads(select, files):
            with open_shard(store_dir, file, nbytes, part) as path:  # held while it is read
                ids, t = load_shard(path, want)
            offsets = torch.cat([torch.zeros(1, dtype=torch.long), t["lengths"].cumsum(0)])
            for j, eid in enumerate(ids):
                if select is not None and eid not in select:
                    continue
                a, b = int(offsets[j]), int(offsets[j + 1])
                yield FeatureExample(eid, t["input_ids"][a:b], t["loss_mask"][a:b].bool(), t["features"][a:b],
                                     t["top_ids"][a:b], t["top_probs"][a:b],
                                     t["aux"][a:b] if "aux" in t else None)


def _entry(name: str, ids: list[str], lengths: list[int], nbytes: int) -> dict:
    return {"file": name, "examples": len(ids), "tokens": int(sum(lengths)), "bytes": int(nbytes),
            "ids": list(ids), "lengths": [int(n) for n in lengths]}
