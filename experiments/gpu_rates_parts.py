"""The three measurements of the GPU rates script (experiments/gpu_rates.py), each a function of the
built verifier and a time budget, returning its part of the rates file:

- :func:`eval_part` (c): batch-1 speculative decoding steps of the planted verifier with the paper's
  tree, 1, 2 and 4 processes on the one device (experiments/gpu_check_packing.py's workers), and
  transformers' ``generate`` per token in the one-process run;
- :func:`train_part` (b): optimizer steps of each backbone through the project's DeepSpeed runner on
  one rank, micro-batch 1 x each length, beside orchestrator/plan/sizing.py's memory estimate;
- :func:`features_part` (a): the project's extraction code (``verifier_features`` and the feature
  store's shards) at 1,024-token batches: tokens and bytes written per second.

A part stops starting new rows once its budget is spent and says which rows it skipped.
"""
from __future__ import annotations

import contextlib
import inspect
import os
import socket
import tempfile
import time
from pathlib import Path

import torch

from decoding.timing import synchronize

FEATURE_BATCH_TOKENS = 1024


def _cuda(device: str) -> bool:
    return device.startswith("cuda")


def _peak_gib(device: str) -> float | None:
    return torch.cuda.max_memory_allocated() / 2**30 if _cuda(device) else None


def _reset_peak(device: str) -> None:
    if _cuda(device):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


# ---------------------------------------------------------------- (c) the eval step
def packing_counts(ctx, wanted: list[int]) -> tuple[list[int], str]:
    """The process counts whose verifier copies fit the device (90% of it; each copy its weight files
    plus 8% and 0.6 GiB of context), and a note naming those skipped."""
    if not _cuda(ctx.device):
        return wanted, ""
    copy = sum(f.stat().st_size for f in Path(ctx.verifier).glob("*.safetensors")) / 2**30
    total = torch.cuda.get_device_properties(0).total_memory / 2**30
    fits = int(0.9 * total / (1.08 * copy + 0.6))
    skipped = [k for k in wanted if k > fits]
    note = (f"{total:.0f} GiB holds {fits} verifier copies of {copy:.1f} GiB: "
            f"x{', x'.join(map(str, skipped))} "
            "skipped") if skipped else ""
    return [k for k in wanted if k <= fits], note


def eval_part(ctx, budget_s: float, emit) -> dict:
    """Packing rows (one per process count, each printed as it completes) and generate's ms/token."""
    pk = ctx.experiment("gpu_check_packing")
    from orchestrator.plan import packing

    counts, note = packing_counts(ctx, ctx.args.packing)
    inputs = Path(ctx.workdir) / "eval-inputs.json"
    inputs.write_text(__import__("json").dumps(ctx.prompt_ids))
    worker = ["--verifier", ctx.verifier, "--drafter", ctx.drafter, "--device", ctx.device, "--dtype",
              ctx.dtype, "--inputs", str(inputs), "--max-new-tokens", str(ctx.args.max_new_tokens),
              "--tree", *map(str, ctx.tree)]
    out = {"strategy": "single", "tree": list(ctx.tree), "prompts": len(ctx.prompt_ids),
           "max_new_tokens": ctx.args.max_new_tokens, "packing": [], "notes": [note] if note else []}
    t0 = time.perf_counter()
    for k in counts:
        if time.perf_counter() - t0 > budget_s:
            out["notes"].append(f"x{k} not run: the part's {budget_s:.0f} s budget was spent")
            continue
        first = ["--generate"] + (["--batches", ctx.args.batches] if ctx.args.batches else [])
        res = pk.run_packed(k, worker + (first if k == 1 else []), threads=0 if _cuda(ctx.device) else 1)
        row = pk.summarize(k, res)
        if k == 1 and res[0].get("generate_tokens"):
            out["generate_ms_per_token"] = 1e3 * res[0]["generate_s"] / res[0]["generate_tokens"]
        out["packing"].append(row)
        if k == 1 and res[0].get("batched"):
            out["batched"] = res[0]["batched"]
            emit("eval", _batched_line(out["batched"]))
        if len(out["packing"]) > 1:
            fit = packing.fit({"packing": out["packing"], "device": ctx.device_name}, "this run", None,
                              ctx.tree[1])
            out["t_dev_s"] = fit["t_dev_s"]
        emit("eval",
             f"x{k}: {row['step_s'] * 1e3:.1f} ms per step per process, {row['tokens_per_s']:.1f} tokens/s "
                     f"in all, tau {row['tau']:.2f} (planted verifier: not Llama-3's), peak "
                     + (f"{row['peak_gib_per_process']:.1f} GiB each" if row["peak_gib_per_process"] else "-")
                     + (f"; generate {out['generate_ms_per_token']:.1f} ms/token" if k == 1 and
                        "generate_ms_per_token" in out else "")
                     + (f"; t_dev fitted {out['t_dev_s'] * 1e3:.1f} ms" if "t_dev_s" in out else ""))
    return out


def _batched_line(batched: dict) -> str:
    """One line for the rows of prompts verified B at a time in one process (decoding/batch.py)."""
    rows = batched["rows"]
    peak = batched.get("peak_gib")
    return ("one process verifying B prompts a pass: " + "; ".join(
        f"B={r['batch']} {r['tokens_per_s']:.1f} tokens/s "
        f"({r['tokens_per_s'] / rows[0]['tokens_per_s']:.2f}x B=1, "
        f"{r['same_as_alone']}/{r['runs']} outputs as B=1)" for r in rows)
        + (f"; peak {peak:.1f} GiB" if peak is not None else ""))


# ---------------------------------------------------------------- (b) a training step per backbone
def _one_rank_distributed(device: str) -> None:
    """The environment DeepSpeed's one-rank process group reads (left alone where set)."""
    if not _cuda(device):
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    for k, v in (("MASTER_ADDR", "127.0.0.1"), ("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
        os.environ.setdefault(k, v)


def synthetic_example(i: int, n: int, hidden: int, vocab: int, aux: int, gen: torch.Generator):
    """A FeatureExample of ``n`` tokens, every position a loss position (the shape is what costs)."""
    from drafters.features import TOPK, FeatureExample

    top = torch.rand(n, TOPK, generator=gen).softmax(-1)
    return FeatureExample(
        f"synthetic-{i}", torch.randint(0, vocab, (n,), generator=gen), torch.ones(n, dtype=torch.bool),
        torch.randn(n, hidden, generator=gen).to(torch.float16), torch.randint(0, vocab, (n, TOPK),
                generator=gen,
                                                                               dtype=torch.int32),
        top.to(torch.float16), torch.randn(n, aux * hidden, generator=gen).to(torch.float16) if aux else None)


def aux_layers(n_layers: int) -> tuple[int, ...]:
    """EAGLE-3's aux layers for a verifier of ``n_layers``: the reference's, or on a tiny shape (under
    8 layers, where they collide) the first three hidden states."""
    from drafters.eagle3 import default_aux_layers

    return default_aux_layers(n_layers) if n_layers >= 8 else (0, 1, 2)


def _train_config(ctx, backbone: str, out: str, n_layers: int):
    from drafters.train.config import TrainConfig

    t = ctx.profile.train.for_backbone(backbone)
    return TrainConfig(verifier=ctx.verifier, backbone=backbone, variant="math", out_dir=out,
                       train_data=[["synthetic", "rates", None]], batch_size=1, deepspeed=True,
                       zero_stage=t.zero_stage, precision=t.precision, hass_steps=t.hass_steps, lr=t.lr,
                       draft_vocab=ctx.vocab_file(t.draft_vocab),
                       aux_layers=aux_layers(n_layers) if backbone == "eagle3" else None)


def _time_steps(ctx, model, backbone: str, tokens: int, steps: int) -> dict:
    """ms per optimizer step (after two warm-up steps) and peak memory of one backbone at 1 x tokens."""
    from drafters.train.backbones import backbone as lookup
    from drafters.train.backbones import compute_loss
    from drafters.train.runners import make_runner
    from drafters.vocab import DraftHead, load_vocab

    cfg = _train_config(ctx, backbone, tempfile.mkdtemp(dir=ctx.workdir), model.config.num_hidden_layers)
    bb = lookup(backbone)
    ids = load_vocab(cfg.draft_vocab) if cfg.draft_vocab else None
    dcfg = bb.drafter_config(cfg, model, ids)
    aux = len(getattr(dcfg, "aux_layers", ()) or ())
    gen = torch.Generator().manual_seed(0)
    batch = bb.collate([synthetic_example(0, tokens, ctx.shape["hidden"], model.config.vocab_size, aux, gen)],
                       mask_mode=cfg.loss_mask)
    _reset_peak(ctx.device)
    drafter = bb.init(dcfg, model, ids).to(model.device)
    params = sum(p.numel() for p in drafter.parameters())
    runner = make_runner(drafter, torch.optim.AdamW(drafter.parameters(), lr=cfg.lr), cfg, 1)
    head = DraftHead(model.lm_head, ids)
    embed = model.get_input_embeddings()
    noise = torch.Generator(device=model.device).manual_seed(0)
    times = []
    for _ in range(steps + 2):
        synchronize(ctx.device)
        t = time.perf_counter()
        with runner.autocast():
            loss, _ = compute_loss(cfg, runner.module, embed, head, batch, noise, use_topk=True)
        runner.backward(loss)
        runner.step()
        synchronize(ctx.device)
        times.append(time.perf_counter() - t)
    peak = _peak_gib(ctx.device)
    del runner, drafter
    return {"ms_per_step": 1e3 * sum(times[2:]) / steps, "warmup_ms": 1e3 * times[0], "peak_gib": peak,
            "loss": float(loss.detach()), "params": params}


def _sizing_gib(ctx, backbone: str, tokens: int) -> float:
    from orchestrator.plan.sizing import train_memory

    t = ctx.profile.train.for_backbone(backbone)
    m = train_memory(ctx.shape_constants, backbone, micro_batch=1, max_length=tokens, precision=t.precision,
                     deepspeed=True, zero_stage=t.zero_stage, ranks=1, verifier_dtype=ctx.dtype, online=False,
                     draft_vocab=t.draft_vocab, hass_steps=t.hass_steps)
    return m.total / 2**30


def train_part(ctx, budget_s: float, emit) -> dict:
    """One row per (backbone, tokens): ms per step, peak memory, sizing's estimate (one rank)."""
    _one_rank_distributed(ctx.device)
    model = ctx.load_plain_verifier()
    out = {"micro_batch": 1, "zero_stage": ctx.profile.train.zero_stage, "rows": [], "notes": []}
    t0 = time.perf_counter()
    for backbone in ctx.args.backbones:
        for tokens in ctx.args.train_tokens:
            if time.perf_counter() - t0 > budget_s:
                out["notes"].append(f"{backbone} at {tokens} tokens not run: the part's {budget_s:.0f} s "
                                    "budget "
                                    "was spent")
                continue
            row = {"backbone": backbone, "tokens": tokens, **_time_steps(ctx, model, backbone, tokens,
                                                                         ctx.args.train_steps)}
            row["sizing_gib"] = _sizing_gib(ctx, backbone, tokens)
            row["tokens_per_s"] = tokens / (row["ms_per_step"] / 1e3)
            out["rows"].append(row)
            peak = row["peak_gib"]
            emit("train",
                 f"{backbone} 1 x {tokens}: {row['ms_per_step']:.1f} ms/step ({row['tokens_per_s']:,.0f} "
                          f"tokens/s), peak {'-' if peak is None else f'{peak:.1f} GiB'} vs sizing "
                          f"{row['sizing_gib']:.1f} GiB"
                          + (f" ({(peak - row['sizing_gib']) / row['sizing_gib']:+.0%})" if peak else ""))
    return out


# ---------------------------------------------------------------- (a) feature extraction
def _synthetic_examples(n_examples: int, lengths: list[int], vocab: int):
    from drafters.data.templating import TokenizedExample

    gen = torch.Generator().manual_seed(1)
    out = []
    for i in range(n_examples):
        n = lengths[i % len(lengths)]
        out.append(TokenizedExample(f"x{i}", torch.randint(0, vocab, (n,), generator=gen).tolist(), [1] * n))
    return out


def _copy_modes() -> list[str]:
    """The host-copy forms the extraction code offers: ``sync`` always, ``async`` where
    ``verifier_features`` takes an ``async_copies`` flag."""
    from drafters.features import verifier_features

    return ["sync",
            "async"] if "async_copies" in inspect.signature(verifier_features).parameters else ["sync"]


def _extract_once(ctx, model, examples, aux_layers, mode: str) -> dict:
    from drafters.features import FeatureStore, verifier_features

    kw = {"async_copies": mode == "async"} if mode == "async" else {}
    store = FeatureStore(tempfile.mkdtemp(dir=ctx.workdir), "rates")

    def compute(ex):
        return verifier_features(model, ex, batch_tokens=FEATURE_BATCH_TOKENS, aux_layers=aux_layers, **kw)

    compute(examples[:2])  # warm-up
    synchronize(ctx.device)
    t = time.perf_counter()
    man = store.extract(examples, compute, {"verifier": ctx.verifier})
    dt = time.perf_counter() - t
    written = sum(f.stat().st_size for f in store.dir.glob("*.safetensors"))
    with contextlib.suppress(OSError):
        for f in store.dir.glob("*"):
            f.unlink()
    ntok = sum(len(e.input_ids) for e in examples)
    return {"tokens": ntok, "seconds": dt, "tokens_per_s": ntok / dt, "bytes_per_s": written / dt,
            "shards": len(man.get("shards", []))}


def features_part(ctx, budget_s: float, emit) -> dict:
    """Rows per (features kind: hidden + top-10, with EAGLE-3's aux layers) x (host copies)."""
    model = ctx.load_plain_verifier()
    examples = _synthetic_examples(ctx.args.feature_examples, ctx.args.train_tokens, model.config.vocab_size)
    out = {"batch_tokens": FEATURE_BATCH_TOKENS, "rows": [], "notes": []}
    t0 = time.perf_counter()
    for kind, aux in (("hidden", None), ("eagle3", aux_layers(model.config.num_hidden_layers))):
        for mode in _copy_modes():
            if time.perf_counter() - t0 > budget_s:
                out["notes"].append(f"{kind}/{mode} not run: the part's {budget_s:.0f} s budget was spent")
                continue
            row = {"kind": kind, "copies": mode, **_extract_once(ctx, model, examples, aux, mode)}
            out["rows"].append(row)
            emit("features", f"{kind} ({mode} host copies): {row['tokens_per_s']:,.0f} tokens/s, "
                             f"{row['bytes_per_s'] / 1e6:,.1f} MB/s written ({row['tokens']:,} tokens in "
                             f"{row['seconds']:.1f} s, {row['shards']} shards)")
    return out
