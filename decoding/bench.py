"""Benchmark: tokens/s, verifier calls per token and draft/verify split per strategy, with
autoregressive decoding as the baseline measured in the same process on the same prompts."""
from __future__ import annotations

import argparse
import tempfile
import time


def add_bench_args(p: argparse.ArgumentParser) -> None:
    from .cli import add_decode_args

    add_decode_args(p)
    p.add_argument("--benchmarks", default="gsm8k,mt_bench", help="comma list; first turn of each prompt")
    p.add_argument("--n-prompts", type=int, default=2, help="prompts per benchmark")
    p.add_argument("--strategies", default="autoregressive,single,confidence,entropy,merged,merged-dedup")
    p.set_defaults(fn=cmd_bench, max_new_tokens=64)


def cmd_bench(args) -> int:
    import dataclasses

    from drafters.data.records import BenchmarkPrompt
    from drafters.data.sources import load_benchmark

    from .cli import decode_config
    from .engine import SpeculativeDecoder
    from .runner import default_threads, load_proposers
    from .verifiers import eos_token_ids, load_verifier, resolve
    from drafters.data.templating import benchmark_prompt_ids

    default_threads()
    name = resolve(args.verifier).name
    model, tok = load_verifier(args.verifier)
    drafters = list(args.drafter)
    if len(drafters) < 2:
        from drafters.checkpoint import init_drafter, save_checkpoint
        from drafters.config import DrafterConfig

        tmp = tempfile.mkdtemp(prefix="bench-drafters-")
        for s in range(len(drafters), 2):
            cfg = DrafterConfig.for_verifier(model, name, "eagle2", seed=s)
            drafters.append(str(save_checkpoint(init_drafter(cfg), f"{tmp}/random-seed{s}")))
        print(f"note: {2 - len(args.drafter)} randomly initialised drafter(s) used (acceptance ~1: measures overhead)")
    proposers = load_proposers(model, drafters, name)
    prompts: list[BenchmarkPrompt] = []
    for b in args.benchmarks.split(","):
        prompts += load_benchmark(b)[0][: args.n_prompts]
    inputs = [(p.id, benchmark_prompt_ids(tok, p, 0, [])) for p in prompts]
    base = decode_config(args)
    print(f"verifier {name}; {len(inputs)} prompts ({args.benchmarks}); max_new_tokens {base.max_new_tokens}; "
          f"tree top_k={base.tree.top_k} depth={base.tree.depth} total_tokens={base.tree.total_tokens}; T={base.temperature}")
    header = f"{'strategy':<16}{'tok/s':>8}{'speedup':>9}{'tau':>7}{'calls/tok':>10}{'tree':>7}{'draft%':>8}{'verify%':>8}"
    print(header)
    ar_tps = None
    for spec in args.strategies.split(","):
        strat, dedup = (spec[:-6], True) if spec.endswith("-dedup") else (spec, False)
        n = {"autoregressive": 0, "single": 1}.get(strat, 2)
        cfg = dataclasses.replace(base, strategy=strat, merge_dedup=dedup)
        dec = SpeculativeDecoder(model, proposers[:n], cfg, eos_token_ids(model, tok))
        toks = calls = 0
        t_draft = t_verify = tree = 0.0
        t0 = time.perf_counter()
        for pid, ids in inputs:
            r = dec.generate(ids, seed_key=pid)
            toks += len(r.output_token_ids)
            calls += r.verifier_calls
            t_draft += sum(s["t_draft_s"] for s in r.steps)
            t_verify += sum(s["t_verify_s"] for s in r.steps)
            tree += sum(s["tree_size"] for s in r.steps)
        wall = time.perf_counter() - t0
        tps = toks / wall
        ar_tps = tps if strat == "autoregressive" else ar_tps
        speed = f"{tps / ar_tps:.2f}x" if ar_tps else "-"
        new = toks - len(inputs)  # the prefill's token is not committed by a verifier call
        print(f"{spec:<16}{tps:8.1f}{speed:>9}{new / max(calls, 1):7.2f}{calls / max(toks, 1):10.3f}"
              f"{tree / max(calls, 1):7.1f}{100 * t_draft / wall:8.1f}{100 * t_verify / wall:8.1f}")
    return 0
