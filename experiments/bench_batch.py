"""Benchmark: what decoding several prompts in lock step (decoding/batch.py) gives on this machine.

    python experiments/bench_batch.py [--drafter DIR] [--batches 2,4,8] [--n-prompts 4] [--device cuda]

Decodes the first turns of ``--n-prompts`` prompts of each benchmark one at a time, then B at a time
for each ``--batches`` B (one verifier pass per step and one drafter pass per draft level for the B
rows; ``--draft-alone``: each B also with the rows drafting one by one), with the same decoder
(``--strategy``, ``--tree``), and transformers' ``generate`` one prompt at a time: tokens/s over all
prompts, each as a ratio to batch 1 in the same run, and how many outputs equal batch 1's. Without
``--drafter`` the drafter is random (EAGLE-2, seed 0): it accepts almost nothing, so a step is one
verified token. A batched pass reads the weights once for B trees: on a GPU, where a batch-1 step is
host- and launch-bound, that is the point; on a CPU a tree pass is compute-bound already, so expect
less. Timings share the machine with whatever else runs.
"""
from __future__ import annotations

import argparse
import tempfile
import warnings

import torch

from common.verifiers import eos_token_ids, resolve
from decoding.batch import time_batches
from decoding.config import DecodeConfig, TreeConfig
from decoding.engine import SpeculativeDecoder
from decoding.runner import generate_baseline, load_proposers
from decoding.timing import synced_now
from decoding.verifiers import load_verifier
from drafters.checkpoint import init_drafter, save_checkpoint
from drafters.config import DrafterConfig
from drafters.data.sources import load_benchmark
from drafters.data.templating import benchmark_prompt_ids


def _args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--verifier", default="smollm2-135m-instruct")
    p.add_argument("--drafter", default=None, help="a drafter checkpoint (default: a random EAGLE-2 one)")
    p.add_argument("--strategy", default="single", choices=("single", "autoregressive"))
    p.add_argument("--tree", type=int, nargs=3, default=(4, 4, 16), metavar=("TOP_K", "DEPTH", "TOTAL"))
    p.add_argument("--benchmarks", default="gsm8k,mt_bench")
    p.add_argument("--n-prompts", type=int, default=4, help="prompts per benchmark (first turns)")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--batches", default="2,4,8", help="comma list of prompts verified at once")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default=None)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--draft-alone", action="store_true",
                   help="also time each B with the rows drafting one by one (verification still batched)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = _args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, tok = load_verifier(args.verifier, dtype=args.dtype, device=args.device)
        prompts = [p for b in args.benchmarks.split(",") for p in load_benchmark(b)[0][: args.n_prompts]]
    eos, name = eos_token_ids(model, tok), resolve(args.verifier).name
    drafter = args.drafter
    if drafter is None:
        drafter = str(save_checkpoint(init_drafter(DrafterConfig.for_verifier(model, name, "eagle2", seed=0)),
                                      tempfile.mkdtemp() + "/random-eagle2"))
    cfg = DecodeConfig(strategy=args.strategy, max_new_tokens=args.max_new_tokens,
                       tree=TreeConfig(*args.tree))
    dec = SpeculativeDecoder(model, load_proposers(model, [drafter], name), cfg, eos)
    inputs = [(benchmark_prompt_ids(tok, p, 0, []), f"{p.id}/0") for p in prompts]
    dec.generate(inputs[0][0], seed_key="warm-up")
    base = generate_baseline(model, eos, args.max_new_tokens, 0.0, cfg.seed)
    t0 = synced_now(model.device)
    gen_tokens = sum(len(base(ids)[0]) for ids, _ in inputs)
    gen_s = synced_now(model.device) - t0
    print(f"{args.verifier} on {args.device} ({torch.get_num_threads()} threads), {args.strategy} "
          f"{'/'.join(map(str, args.tree))}, {len(inputs)} prompts x {args.max_new_tokens} new tokens")
    print(f"{'batch':>8} {'drafts':>9} {'seconds':>8} {'tokens/s':>9} {'vs batch 1':>10} {'vs generate':>11} "
          f"{'tau':>5} {'same as batch 1':>15}")
    print(f"{'generate':>8} {'':>9} {gen_s:8.1f} {gen_tokens / gen_s:9.1f} {'':>10} {'1.00x':>11}")
    batches = [int(b) for b in args.batches.split(",")]
    rows = time_batches(dec, inputs, batches, lambda: synced_now(model.device), args.draft_alone)
    for r in rows:
        drafts = r["drafts"] if r["batch"] > 1 else ""
        print(f"{r['batch']:>8} {drafts:>9} {r['s']:8.1f} {r['tokens_per_s']:9.1f} "
              f"{r['tokens_per_s'] / rows[0]['tokens_per_s']:9.2f}x "
              f"{r['tokens_per_s'] / (gen_tokens / gen_s):10.2f}x {r['new_tokens'] / r['steps']:5.2f} "
              f"{r['same_as_alone']:>9}/{len(inputs)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
