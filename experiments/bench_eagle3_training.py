"""Benchmark: training tokens/s of eagle3 vs eagle2, in-process, on the same cached examples.

python experiments/bench_eagle3_training.py [--n 16] [--max-length 96] [--epochs 2] [--vocab 1024]
    [--repeats 2]

One EAGLE-3 feature cache of the math corpus (the aux layers plus what an EAGLE-2 cache holds): the
eagle2 runs read its LM-head features and ignore the aux layers, so both backbones see the same
examples, batches and draft vocabulary. Each run is drafters.train.loop.train (plain AdamW, fp32,
no DeepSpeed); the rate is the trainer's own ``train_tokens_per_s`` (loss tokens over the epochs'
wall time, held-out evaluation excluded), pooled over the epochs. Runs alternate between the
backbones so that a busy machine slows both alike. The cache and training helpers are
experiments/bench_backbones.py's, which also trains hass and decodes with all three.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from common.verifiers import eos_token_ids
from decoding.verifiers import load_verifier
from drafters.eagle3 import default_aux_layers
from drafters.variants import DataSpec
from experiments.bench_backbones import prepare, train_config, train_one


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--max-length", type=int, default=96)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    model, tok = load_verifier()
    eos = eos_token_ids(model, tok)
    spec = DataSpec(n=args.n, heldout=4, max_length=args.max_length)
    tmp = Path(tempfile.mkdtemp(prefix="bench-e3-"))
    caches, vocab = prepare(model, tok, eos, "smollm2-135m-instruct", spec, args.vocab, tmp)
    aux = list(default_aux_layers(model.config.num_hidden_layers))
    print(f"torch threads {torch.get_num_threads()}; n={args.n} math examples, max_length {args.max_length}, "
          f"batch {args.batch_size}, {args.epochs} epochs, draft vocabulary {args.vocab}, aux layers {aux}")
    rates: dict[str, list[float]] = {"eagle2": [], "eagle3": []}
    for r in range(args.repeats):
        for backbone in ("eagle2", "eagle3"):
            cfg = train_config(backbone, args.epochs, tmp / f"{backbone}-{r}", tmp, caches, vocab, args.n,
                               "smollm2-135m-instruct", lr=5e-3, batch_size=args.batch_size)
            t = train_one(cfg, model)
            rates[backbone].append(t["train_tokens_per_s"])
            print(f"{backbone} run {r}: {t['loss_tokens']} loss tokens in {t['train_seconds']:.1f} s = "
                  f"{t['train_tokens_per_s']:.1f} tokens/s (process CPU {t['process_cpu_s']:.1f} s, held-out "
                  f"evaluation included); held-out top-1 at depth 1 {t['heldout_top1']['depth1']:.3f}",
                  flush=True)
    best = {b: max(v) for b, v in rates.items()}
    print(f"best of {args.repeats}: eagle2 {best['eagle2']:.1f} tokens/s, eagle3 {best['eagle3']:.1f} "
          "tokens/s "
          f"(eagle3 / eagle2 = {best['eagle3'] / best['eagle2']:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
