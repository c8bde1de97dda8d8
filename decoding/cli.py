"""python -m decoding {generate,bench,cache}."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .engine import DecodeConfig
from .hedge import PRIORS, RESETS
from .strategies import GRANULARITIES, SCORES, STRATEGIES, SWITCH_TO
from .tree import TreeConfig


def add_decode_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--verifier", default="smollm2-135m-instruct")
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                   help="the verifier's (and drafters') dtype; default float32 on CPU, the verifier's own "
                        "on GPU. bfloat16 on a CPU halves the bytes a pass streams")
    p.add_argument("--drafter", action="append", default=[], help="drafter checkpoint dir (repeat for routing/merged)")
    p.add_argument("--strategy", default="single", help=f"one of {sorted(STRATEGIES)}")
    p.add_argument("--routing-granularity", default="step", help=f"one of {list(GRANULARITIES)}")
    p.add_argument("--routing-decide-steps", type=int, default=1,
                   help="turn/prompt routing: verifier calls whose mean scores decide the route")
    p.add_argument("--merge-dedup", action="store_true", help="merged trees: verify shared prefixes once (trie)")
    p.add_argument("--merge-budget", action="store_true",
                   help="merged trees: rerank the union to --tree-total-tokens (budget-matched; default: concatenation)")
    p.add_argument("--route-score", default="path",
                   help=f"confidence routing score, one of {list(SCORES)}: mean path confidence or mean node "
                        "confidence (the study's)")
    p.add_argument("--switch-after", type=int, default=2,
                   help="switching: consecutive steps with nothing accepted before switching (1..5)")
    p.add_argument("--switch-to", default="specialist", help=f"switching: one of {list(SWITCH_TO)}")
    p.add_argument("--switch-depth", type=int, default=2,
                   help="depth_adaptive: deepest level from the mixed (first) drafter (1..tree depth - 1)")
    p.add_argument("--hedge-eta", type=float, default=0.5, help="hedge: learning rate (> 0)")
    p.add_argument("--hedge-prior", default="uniform",
                   help=f"hedge: one of {list(PRIORS)} (mixed-first: the first drafter starts ahead)")
    p.add_argument("--hedge-reset", default="turn",
                   help=f"hedge: one of {list(RESETS)} (fresh weights every turn, or carried across a "
                        "prompt's turns)")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--top-k-sampling", type=int, default=None)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--tree-top-k", type=int, default=TreeConfig.top_k)
    p.add_argument("--tree-depth", type=int, default=TreeConfig.depth)
    p.add_argument("--tree-total-tokens", type=int, default=TreeConfig.total_tokens)
    p.add_argument("--tree", choices=["fixed", "auto"], default="fixed",
                   help="auto: measure this machine and the drafters, pick top_k/depth/total_tokens (decoding/autotree.py)")


def decode_config(args) -> DecodeConfig:
    return DecodeConfig(
        strategy=args.strategy, temperature=args.temperature, max_new_tokens=args.max_new_tokens, seed=args.seed,
        routing_granularity=args.routing_granularity, merge_dedup=args.merge_dedup,
        routing_decide_steps=args.routing_decide_steps, merge_budget=args.merge_budget,
        top_k_sampling=args.top_k_sampling, top_p=args.top_p, route_score=args.route_score,
        switch_after=args.switch_after, switch_to=args.switch_to, switch_depth=args.switch_depth,
        hedge_eta=args.hedge_eta, hedge_prior=args.hedge_prior, hedge_reset=args.hedge_reset,
        tree=TreeConfig(args.tree_top_k, args.tree_depth, args.tree_total_tokens),
    )


def cmd_generate(args) -> int:
    from tqdm import tqdm

    from .engine import SpeculativeDecoder
    from .runner import (check_drafter_files, check_prompt_lengths, decode_prompt, default_threads,
                         load_proposers, prompt_rows, read_prompts, write_parquet_atomic)
    from .strategies import make_strategy
    from common.verifiers import eos_token_ids, resolve

    # validate everything cheap before loading any model
    from .verifiers import load_verifier
    cfg = decode_config(args)
    make_strategy(cfg.strategy, len(args.drafter), cfg.routing_granularity, score=cfg.route_score,
                  switch_after=cfg.switch_after, switch_to=cfg.switch_to, switch_depth=cfg.switch_depth,
                  hedge=cfg.hedge)
    prompts = read_prompts(args.prompts)
    name = resolve(args.verifier).name
    check_drafter_files(args.drafter, name)
    for out in [args.out] + ([args.trace_out] if args.trace_out else []):
        if Path(out).exists() and Path(out).is_dir():
            raise ValueError(f"output path {out} is a directory")
    default_threads()
    model, tok = load_verifier(args.verifier, dtype=args.dtype)
    proposers = load_proposers(model, args.drafter, name)
    check_prompt_lengths(tok, model, prompts, cfg)
    if args.tree == "auto":
        import dataclasses

        from .autotree import auto_tree, calibration_inputs

        choice = auto_tree(model, proposers, cfg.strategy, eos_token_ids(model, tok), calibration_inputs(tok),
                           cfg.merge_dedup, cfg.routing_granularity)
        print(choice.describe())
        cfg = dataclasses.replace(cfg, tree=choice.tree)
    decoder = SpeculativeDecoder(model, proposers, cfg, eos_token_ids(model, tok))
    rows, steps = [], []
    extra = {"strategy": cfg.strategy, "temperature": cfg.temperature}
    for prompt in tqdm(prompts, desc=f"decode {cfg.strategy}", unit="prompt"):
        r, s = prompt_rows(prompt, decode_prompt(decoder, tok, prompt), extra)
        rows += r
        steps += s
    write_parquet_atomic(rows, args.out)
    if args.trace_out:
        write_parquet_atomic(steps, args.trace_out)
    calls = sum(r["verifier_calls"] for r in rows)
    new = sum(r["new_tokens"] for r in rows)
    print(f"wrote {len(rows)} rows to {args.out}; acceptance length {new / max(calls, 1):.3f} ({new} tokens / {calls} calls)")
    return 0


def cmd_cache(args) -> int:
    from common import caches

    if args.action == "show":
        print(caches.show())
    elif args.action == "warm":
        from .cpu.warm import warm

        return warm(args.verifier, parse_ints(args.threads, "--threads"), args.dtypes.split(","))
    else:
        gone = caches.clear()
        print(f"removed {', '.join(gone) if gone else 'nothing'} from {caches.cache_dir()}")
    return 0


def parse_ints(text: str, flag: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",")]
    except ValueError:
        out = []
    if not out or min(out) < 1:
        raise ValueError(f"{flag} takes positive integers separated by commas, got {text!r}")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m decoding")
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate", help="speculative decoding over a JSONL prompts file")
    add_decode_args(g)
    g.add_argument("--prompts", required=True)
    g.add_argument("--out", required=True)
    g.add_argument("--trace-out", default=None)
    g.set_defaults(fn=cmd_generate)
    c = sub.add_parser("cache", help="show, clear or warm the per-machine measurement caches (matmul "
                                     "tuner, verify costs, kernel builds)")
    c.add_argument("action", choices=["show", "clear", "warm"])
    c.add_argument("--verifier", default="smollm2-135m-instruct",
                   help="warm: the verifier whose caches to fill")
    c.add_argument("--threads", default=str(os.cpu_count() or 1), help="warm: torch thread counts, e.g. 1,2")
    c.add_argument("--dtypes", default="float32", help="warm: verifier dtypes, e.g. float32,bfloat16")
    c.set_defaults(fn=cmd_cache)
    b = sub.add_parser("bench", help="tokens/s and draft/verify split of every strategy vs autoregressive")
    from .bench import add_bench_args

    add_bench_args(b)
    args = p.parse_args(argv)
    try:
        return args.fn(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
