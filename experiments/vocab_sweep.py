"""Sweep the reduced draft vocabulary size on the embedded verifier.

python experiments/vocab_sweep.py [--sizes 4096,8192,16384,32768,0] [--n 96] [--epochs 2]

For each size (0 = the full vocabulary) one HASS math drafter is trained on the same data and
budget (same init seed, epochs, lr), then measured: held-out top-1 agreement at depths 1-3 (a
verifier token outside the vocabulary counts as a miss), the vocabulary's coverage of assistant
tokens, tau on GSM8K at T=0 (single drafter, tree 4/4/16), draft ms per level, and training
loss tokens/s. Prints a markdown table (docs/study.md's vocabulary sweep).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _parse(argv) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="4096,8192,16384,32768,0")
    ap.add_argument("--n", type=int, default=96)
    ap.add_argument("--max-length", type=int, default=192)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--out", default="runs/vocab-sweep")
    return ap.parse_args(argv)


def _train(model, tok, eos, name: str, size: int, spec, caches: dict, out: Path, args) -> tuple[Path, float,
        float]:
    """One HASS math drafter with a draft vocabulary of ``size`` (0: the full one): its final
    checkpoint, the vocabulary's coverage of assistant tokens, and the training call's seconds."""
    from drafters.train.loop import TrainConfig, train
    from drafters.variants import build_vocab, heldout_data, variant_data
    from drafters.vocab import save_vocab

    feats = str(out / "features")
    vocab_path, coverage = None, 1.0
    if size:
        ids, stats = build_vocab(tok, eos, ["mathinstruct", "sharegpt"], spec, size, model.config.vocab_size)
        vocab_path = str(save_vocab(ids, out / f"vocab-{size}.safetensors", stats))
        coverage = stats["coverage"]
    cfg = TrainConfig(verifier=name, backbone="hass", variant="math", out_dir=str(out / f"hass-math-v{size}"),
                      train_data=variant_data("math", feats, caches, args.n),
                      heldout_data=heldout_data(feats, {"mathinstruct": caches["mathinstruct"]}),
                      epochs=args.epochs, lr=args.lr, warmup_steps=4, deepspeed=False, draft_vocab=vocab_path)
    t0 = time.perf_counter()
    final = train(cfg, model)
    return final, coverage, time.perf_counter() - t0


def _tau(model, prop: list, eos, inputs: list, max_new_tokens: int) -> float:
    """Tokens per verifier call of the single drafter on ``inputs`` at T=0, tree 4/4/16."""
    from decoding.config import DecodeConfig, TreeConfig
    from decoding.engine import SpeculativeDecoder

    dec = SpeculativeDecoder(model, prop, DecodeConfig(strategy="single", max_new_tokens=max_new_tokens,
                                                       tree=TreeConfig(4, 4, 16)), eos)
    calls = new = 0
    for pid, ids_ in inputs:
        r = dec.generate(ids_, seed_key=pid)
        calls, new = calls + r.verifier_calls, new + r.new_tokens
    return new / max(calls, 1)


def _draft_ms_per_level(model, p, ids0: list[int]) -> float:
    """Draft ms per level: one 4/4 tree after the prompt ``ids0``, median of 7."""
    import torch

    from decoding.config import TreeConfig
    from decoding.verifier_pass import new_cache, prefill

    f0, _ = prefill(model, new_cache(), ids0)
    ts = []
    for _ in range(7):
        p.reset()
        p.draft(torch.tensor(ids0), f0[:-1], TreeConfig(4, 1, 2), 0.0)
        t1 = time.perf_counter()
        p.draft(torch.tensor(ids0), f0[:-1], TreeConfig(4, 4, 16), 0.0)
        ts.append(time.perf_counter() - t1)
    return 1000 * statistics.median(ts) / 4


def _print_table(rows: list[dict]) -> None:
    print("\n| draft vocab | coverage of assistant tokens | top-1 d1 | d2 | d3 | tau GSM8K T=0 (4/4/16) | "
          "draft ms/level | train loss tok/s |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['size']} | {100 * r['coverage']:.1f}% | {r['top1_d1']:.3f} | {r['top1_d2']:.3f} | "
              f"{r['top1_d3']:.3f} | "
              f"{r['tau']:.2f} | {r['draft_ms_level']:.1f} | {r['train_tok_s']:.0f} |")


def main(argv=None) -> int:
    import json

    from common.verifiers import eos_token_ids
    from decoding.runner import default_threads, load_proposers
    from decoding.verifiers import load_verifier
    from drafters.data.sources import load_benchmark
    from drafters.data.templating import benchmark_prompt_ids
    from drafters.variants import DataSpec, ensure_features

    args = _parse(argv)
    warnings.simplefilter("ignore")
    default_threads()
    name = "smollm2-135m-instruct"
    model, tok = load_verifier(name)
    eos = eos_token_ids(model, tok)
    out = Path(args.out).resolve()
    spec = DataSpec(n=args.n, heldout=16, max_length=args.max_length)
    caches = {c: ensure_features(model, tok, eos, name, c, spec, str(out / "features"))
              for c in ("mathinstruct", "sharegpt")}
    prompts = load_benchmark("gsm8k")[0][: args.prompts]
    inputs = [(p.id, benchmark_prompt_ids(tok, p, 0, [])) for p in prompts]
    rows = []
    for size in [int(s) for s in args.sizes.split(",")]:
        final, coverage, train_s = _train(model, tok, eos, name, size, spec, caches, out, args)
        hist = json.loads((final / "config.json").read_text())["training"]["history"]
        last = hist[-1]
        prop = load_proposers(model, [str(final)], name)
        tau = _tau(model, prop, eos, inputs, args.max_new_tokens)
        draft_ms = _draft_ms_per_level(model, prop[0], inputs[0][1])
        rows.append({"size": size or model.config.vocab_size, "coverage": coverage,
                     "top1_d1": last["top1_depth1"],
                     "top1_d2": last["top1_depth2"], "top1_d3": last["top1_depth3"], "tau": tau,
                     "draft_ms_level": draft_ms,
                     "train_tok_s": statistics.mean(h["train_tokens_per_s"] for h in hist[1:]),
                     "train_s": train_s})
        print(rows[-1], flush=True)
    _print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
