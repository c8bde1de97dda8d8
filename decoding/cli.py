"""python -m decoding {generate,bench,cache}."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from decoding.args import add_decode_args, decode_config


def cmd_generate(args) -> int:
    from tqdm import tqdm

    from common.verifiers import eos_token_ids, resolve
    from decoding.engine import SpeculativeDecoder
    from decoding.runner import (
        check_drafter_files,
        check_prompt_lengths,
        decode_prompt,
        default_threads,
        load_proposers,
        prompt_rows,
        read_prompts,
        write_parquet_atomic,
    )
    from decoding.strategies import make_strategy

    # validate everything cheap before loading any model
    from decoding.verifiers import load_verifier
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
    if args.tree_mode == "auto":
        import dataclasses

        from decoding.autotree import auto_tree, calibration_inputs

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
    print(f"wrote {len(rows)} rows to {args.out}; acceptance length {new / max(calls, 1):.3f} ({new} tokens "
          f"/ {calls} calls)")
    return 0


def cmd_cache(args) -> int:
    from common import caches

    if args.action == "show":
        print(caches.show())
    elif args.action == "warm":
        from decoding.cpu.warm import warm

        return warm(args.verifier, parse_ints(args.threads, "--threads"), args.dtypes.split(","),
                    [b for b in args.drafters.split(",") if b],
                    parse_ints(args.draft_vocabs, "--draft-vocabs") if args.draft_vocabs else [])
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
    c.add_argument("--drafters", default="", help="warm: also the layers of these backbones' drafters, "
                                                  "e.g. eagle2,eagle3 (and in float32 tree auto's verify "
                                                  "costs for the features they read)")
    c.add_argument("--draft-vocabs", default="", help="warm: also the draft head at these reduced vocabulary "
                                                      "sizes, e.g. 1024")
    c.set_defaults(fn=cmd_cache)
    b = sub.add_parser("bench", help="tokens/s and draft/verify split of every strategy vs autoregressive")
    from decoding.bench import add_bench_args

    add_bench_args(b)
    args = p.parse_args(argv)
    try:
        return args.fn(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
