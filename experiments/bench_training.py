"""Benchmark: feature-extraction and training throughput per backbone on this machine.

python experiments/bench_training.py [--n 32] [--max-length 256] [--steps 6]
Prints verifier tokens/s for extraction and assistant (loss) tokens/s per training step.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    import torch

    from decoding.verifiers import eos_token_ids, load_verifier
    from drafters.checkpoint import init_drafter
    from drafters.config import DrafterConfig
    from drafters.features import verifier_features
    from drafters.losses import collate
    from drafters.trainer import TrainConfig, compute_loss
    from drafters.variants import DataSpec, select_examples

    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--max-length", type=int, default=256)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--batch-size", type=int, default=8)
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    model, tok = load_verifier()
    eos = eos_token_ids(model, tok)
    spec = DataSpec(n=args.n, heldout=1, max_length=args.max_length)
    print(f"torch threads {torch.get_num_threads()}; n={args.n} per corpus, max_length {args.max_length}")
    feats = []
    for corpus in ("mathinstruct", "sharegpt"):
        train, _ = select_examples(tok, eos, corpus, spec)
        t = time.perf_counter()
        fx = verifier_features(model, train)
        dt = time.perf_counter() - t
        ntok = sum(len(e.input_ids) for e in train)
        print(f"feature extraction {corpus}: {ntok} tokens in {dt:.1f}s = {ntok / dt:.0f} tokens/s")
        feats += fx
    for backbone in ("eagle2", "hass"):
        cfg = TrainConfig(verifier="smollm2-135m-instruct", backbone=backbone, variant="math", out_dir=tempfile.mkdtemp(),
                          train_data=[["x", "y", None]], batch_size=args.batch_size, deepspeed=False)
        drafter = init_drafter(DrafterConfig.for_verifier(model, "smollm2-135m-instruct", backbone))
        opt = torch.optim.AdamW(drafter.parameters(), lr=1e-4)
        gen = torch.Generator().manual_seed(0)
        tokens, t0 = 0, None
        for step in range(args.steps + 1):
            batch = collate(feats[(step * args.batch_size) % len(feats):][: args.batch_size])
            if step == 1:
                t0, tokens = time.perf_counter(), 0  # step 0 is warm-up
            loss, _ = compute_loss(cfg, drafter, model.get_input_embeddings(), model.lm_head, batch, gen)
            loss.backward()
            opt.step()
            opt.zero_grad()
            tokens += int(batch.mask.sum())
        dt = time.perf_counter() - t0
        print(f"training {backbone}: {tokens} loss tokens in {dt:.1f}s = {tokens / dt:.0f} loss tokens/s "
              f"({dt / args.steps:.2f}s per step of batch {args.batch_size})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
