"""Benchmark: every speedup is a ratio to transformers' ``generate`` measured in this process, on
the same prompts, verifier, dtype and threads (greedy at T=0, sampling at the same T otherwise).

Prints, in one run: ``generate``; the project's autoregressive loop; every strategy with the fixed
tree and (``--tree auto``) the fitted one; the oracle ceiling (a chain of the verifier's own
continuation, depths ``--oracle-depths``); and (``--micro``) verify ms per pass against the number
of nodes and draft ms per level of each drafter.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
import time

import torch

from . import cpu_kernel, cpu_matmul
from .drafting import draft_together


def add_bench_args(p: argparse.ArgumentParser) -> None:
    from .cli import add_decode_args

    add_decode_args(p)
    p.add_argument("--benchmarks", default="gsm8k,mt_bench", help="comma list; first turn of each prompt")
    p.add_argument("--n-prompts", type=int, default=2, help="prompts per benchmark")
    p.add_argument("--strategies", default="autoregressive,single,confidence,entropy,merged,merged-dedup")
    p.add_argument("--oracle-depths", default="3,5,8", help="oracle chain depths ('' = none)")
    p.add_argument("--micro", action="store_true", help="also time verify passes by node count and draft levels")
    p.set_defaults(fn=cmd_bench, max_new_tokens=64)


def hf_generate(model, ids: list[int], max_new: int, eos: list[int], temperature: float, seed: int) -> list[int]:
    """transformers' generate: greedy at T=0, else ancestral sampling from the full distribution."""
    from .runner import generate_baseline

    return generate_baseline(model, eos, max_new, temperature, seed)(ids)[0]


def _row(label, toks, wall, base_tps, calls=None, new=None, tree=None, t_draft=None):
    tps = toks / wall
    cols = [f"{label:<26}", f"{tps:8.1f}", f"{tps / base_tps:8.2f}x" if base_tps else f"{'-':>9}"]
    if calls is not None:
        cols += [f"{new / max(calls, 1):7.2f}", f"{tree / max(calls, 1):7.1f}", f"{100 * t_draft / wall:8.1f}"]
    print("".join(cols), flush=True)
    return tps


def _decode_all(dec, inputs):
    toks = calls = 0
    t_draft = tree = 0.0
    t0 = time.perf_counter()
    for pid, ids in inputs:
        r = dec.generate(ids, seed_key=pid)
        toks += len(r.output_token_ids)
        calls += r.verifier_calls
        t_draft += sum(s["t_draft_s"] for s in r.steps)
        tree += sum(s["tree_size"] for s in r.steps)
    return toks, time.perf_counter() - t0, calls, toks - len(inputs), tree, t_draft


def micro(model, proposers, prompt_ids: list[int], cfg, reps: int = 7) -> None:
    """Verify ms per pass against nodes (a chain after a real prompt) and draft ms per level."""
    from .tree import chain_tree
    from .verifier_pass import keep_positions, new_cache, prefill, tree_forward

    cache = new_cache()
    feats, _ = prefill(model, cache, prompt_ids)
    n = len(prompt_ids) - 1
    keep_positions(cache, torch.arange(n))
    base = None
    print(f"verify pass after a {n}-token prefix (median of {reps}):")
    for nodes in (0, 1, 2, 3, 5, 7, 9, 15, 23, 31):
        ts = []
        for _ in range(reps):
            t = chain_tree([list(range(100, 100 + nodes))]) if nodes else chain_tree([])
            t0 = time.perf_counter()
            tree_forward(model, cache, n, prompt_ids[-1], t.tokens, t.parents, t.depths)
            ts.append(time.perf_counter() - t0)
            keep_positions(cache, torch.arange(n))
        ms = 1000 * statistics.median(ts)
        base = base or ms
        print(f"  {nodes + 1:3d} tokens: {ms:7.1f} ms  ({ms / base:.2f}x a one-token step)")
    toks = torch.tensor(prompt_ids)
    for p in proposers:
        for k, depth in ((cfg.top_k, cfg.depth), (1, 1)):
            ts = []
            for _ in range(reps):
                p.reset()
                p.draft(toks, feats[:-1], dataclasses.replace(cfg, top_k=k, depth=1, total_tokens=2), 0.0)  # catch up
                t0 = time.perf_counter()
                p.draft(toks, feats[:-1], dataclasses.replace(cfg, top_k=k, depth=depth, total_tokens=max(cfg.total_tokens, 2)), 0.0)
                ts.append(time.perf_counter() - t0)
            ms = 1000 * statistics.median(ts)
            vocab = p.head.size if hasattr(p, "head") else "full"
            print(f"  draft {p.name} (vocab {vocab}) top_k={k} depth={depth}: {ms:6.1f} ms per tree, {ms / depth:5.1f} ms per level")
    if len(proposers) > 1:  # routing and merged trees: every drafter in lock step, one head matmul per level
        ts = []
        for _ in range(reps):
            for p in proposers:
                p.reset()
            draft_together(proposers, toks, feats[:-1], dataclasses.replace(cfg, depth=1, total_tokens=2), 0.0)
            t0 = time.perf_counter()
            draft_together(proposers, toks, feats[:-1], cfg, 0.0)
            ts.append(time.perf_counter() - t0)
        ms = 1000 * statistics.median(ts)
        print(f"  draft all {len(proposers)} drafters in lock step top_k={cfg.top_k} depth={cfg.depth}: {ms:6.1f} ms "
              f"per step, {ms / cfg.depth:5.1f} ms per level")


def cmd_bench(args) -> int:
    import warnings

    from drafters.data.records import BenchmarkPrompt
    from drafters.data.sources import load_benchmark
    from drafters.data.templating import benchmark_prompt_ids

    from .cli import decode_config
    from .engine import SpeculativeDecoder
    from .oracle import OracleChainProposer
    from .runner import default_threads, load_proposers
    from .verifiers import eos_token_ids, load_verifier, resolve

    default_threads()
    name = resolve(args.verifier).name
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, tok = load_verifier(args.verifier)
    eos = eos_token_ids(model, tok)
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
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            prompts += load_benchmark(b)[0][: args.n_prompts]
    inputs = [(p.id, benchmark_prompt_ids(tok, p, 0, [])) for p in prompts]
    base = decode_config(args)
    T = base.temperature
    print(f"verifier {name} ({model.dtype}, {torch.get_num_threads()} threads); {len(inputs)} prompts ({args.benchmarks}); "
          f"max_new_tokens {base.max_new_tokens}; T={T}; tree top_k={base.tree.top_k} depth={base.tree.depth} "
          f"total_tokens={base.tree.total_tokens}; drafters {[p.name for p in proposers]}")
    print(f"{'':<26}{'tok/s':>8}{'vs gen':>9}{'tau':>7}{'tree':>7}{'draft%':>8}")
    # warm-up (first calls allocate), then the baseline
    hf_generate(model, inputs[0][1], 4, eos, T, 0)
    if getattr(model, "cpu_matmul", None):  # stock kernels, for reference; ratios use the row below
        with cpu_matmul.disabled():
            t0 = time.perf_counter()
            n_stock = sum(len(hf_generate(model, ids, base.max_new_tokens, eos, T, args.seed)) for _, ids in inputs)
            stock = n_stock / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    refs = {pid: hf_generate(model, ids, base.max_new_tokens, eos, T, args.seed) for pid, ids in inputs}
    gen_tps = _row("generate (transformers)", sum(len(r) for r in refs.values()), time.perf_counter() - t0, None)
    if getattr(model, "cpu_matmul", None):
        print(f"  (the same generate with stock F.linear: {stock:.1f} tok/s; both runs share the verifier's "
              f"row-aware matmuls, decoding/cpu_matmul.py, so every ratio below is kernel-neutral; "
              f"{cpu_kernel.status()})")
    cal_inputs = None
    for spec in args.strategies.split(","):
        strat, dedup = (spec[:-6], True) if spec.endswith("-dedup") else (spec, False)
        n = {"autoregressive": 0, "single": 1}.get(strat, 2)
        cfg = dataclasses.replace(base, strategy=strat, merge_dedup=dedup)
        shapes = [("", cfg.tree)]
        if args.tree == "auto" and strat != "autoregressive":
            from .autotree import auto_tree, calibration_inputs

            benches = args.benchmarks.split(",")  # held-out prompts of the scored tasks
            cal_inputs = cal_inputs or calibration_inputs(tok, max(1, 2 // len(benches)), benches,
                                                          exclude={p.id for p in prompts})
            choice = auto_tree(model, proposers[:n], strat, eos, cal_inputs, dedup, cfg.routing_granularity)
            print(f"  {spec}: {choice.describe()}")
            shapes.append((" auto", choice.tree))
        for suffix, shape in shapes:
            dec = SpeculativeDecoder(model, proposers[:n], dataclasses.replace(cfg, tree=shape), eos)
            toks, wall, calls, new, tree, t_draft = _decode_all(dec, inputs)
            label = spec + (f"{suffix} {shape.top_k}/{shape.depth}/{shape.total_tokens}" if strat != "autoregressive" else "")
            _row(label, toks, wall, gen_tps, calls, new, tree, t_draft)
    if args.oracle_depths and T == 0:
        from .tree import TreeConfig

        for depth in [int(d) for d in args.oracle_depths.split(",")]:
            toks = calls = new = tree = 0
            wall = 0.0
            for pid, ids in inputs:
                oracle = OracleChainProposer(len(ids), refs[pid])
                cfg = dataclasses.replace(base, strategy="single", tree=TreeConfig(1, depth, depth + 1))
                r = _decode_all(SpeculativeDecoder(model, [oracle], cfg, eos), [(pid, ids)])
                toks, wall, calls, new, tree = toks + r[0], wall + r[1], calls + r[2], new + r[3], tree + r[4]
            _row(f"oracle chain depth {depth}", toks, wall, gen_tps, calls, new, tree, 0.0)
    if args.micro:
        micro(model, proposers, inputs[0][1], base.tree)
    return 0
