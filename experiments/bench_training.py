"""Benchmark: feature-extraction and training throughput on this machine, before/after each change.

python experiments/bench_training.py [--n 32] [--max-length 192] [--steps 6] [--vocab 8192]

Feature extraction: verifier tokens/s in fp32, and under bf16 autocast with the feature error it
causes. Training (loss tokens/s per backbone, same examples, same number of steps), cumulatively:
the full-vocabulary trainer in stream order (the old default), + the reduced draft vocabulary,
+ length-bucketed batches, + bf16 autocast (fp32 master weights).
"""
from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _parse(argv) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--max-length", type=int, default=192)
    ap.add_argument("--steps", type=int, default=7)  # + 1 warm-up = every batch of 2 x 32 examples
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=8192)
    return ap.parse_args(argv)


def _extract(model, train: list, corpus: str) -> list:
    """Features of ``train`` in fp32; prints tokens/s in fp32 and under bf16 autocast (on the first
    8 examples) with the feature error bf16 causes."""
    import torch

    from drafters.features import verifier_features

    ntok = sum(len(e.input_ids) for e in train)
    t = time.perf_counter()
    fx = verifier_features(model, train)
    dt = time.perf_counter() - t
    t = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fb = verifier_features(model, train[:8])
    dtb = time.perf_counter() - t
    nb = sum(len(e.input_ids) for e in train[:8])
    err = max(float((a.features.float() - b.features.float()).norm() / a.features.float().norm()) for a,
              b in zip(fx, fb))
    top1 = sum(int((a.top_ids[:, 0] == b.top_ids[:, 0]).sum()) for a, b in zip(fx, fb)) / sum(len(a.top_ids)
            for a in fx[:8])
    print(f"feature extraction {corpus}: fp32 {ntok / dt:.0f} tokens/s; bf16 autocast {nb / dtb:.0f} "
          "tokens/s "
          f"(max relative feature error {err:.3f}, top-1 agreement with fp32 {top1:.3f})")
    return fx


def _train_rate(model, args, backbone: str, label: str, vocab, order: list, bf16: bool) -> None:
    """Time ``args.steps`` optimizer steps (after one warm-up step) of a fresh drafter over ``order``
    and print its loss tokens/s."""
    import torch

    from drafters.checkpoint import init_drafter
    from drafters.config import DrafterConfig
    from drafters.train.backbones import compute_loss
    from drafters.train.config import TrainConfig
    from drafters.train.eagle2 import collate
    from drafters.vocab import DraftHead

    cfg = TrainConfig(verifier="smollm2-135m-instruct", backbone=backbone, variant="math",
                      out_dir=tempfile.mkdtemp(),
                      train_data=[["x", "y", None]], batch_size=args.batch_size, deepspeed=False)
    dcfg = DrafterConfig.for_verifier(model, "smollm2-135m-instruct", backbone,
                                      draft_vocab_size=None if vocab is None else int(vocab.shape[0]))
    drafter = init_drafter(dcfg, vocab)
    head = DraftHead(model.lm_head, vocab)
    opt = torch.optim.AdamW(drafter.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(0)
    tokens = 0
    rows = 0
    t0 = None
    for step in range(args.steps + 1):
        batch = collate(order[(step * args.batch_size) % len(order):][: args.batch_size])
        if step == 1:
            t0 = time.perf_counter()  # step 0 is warm-up
            tokens = 0
            rows = 0
        ctx = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
        with ctx:
            loss, _ = compute_loss(cfg, drafter, model.get_input_embeddings(), head, batch, gen)
        loss.backward()
        opt.step()
        opt.zero_grad()
        tokens += int(batch.mask.sum())
        rows += batch.mask.numel()
    dt = time.perf_counter() - t0
    print(f"training {backbone:<7} {label:<32} {tokens / dt:6.0f} loss tokens/s  "
          f"({dt / args.steps:.2f}s/step, loss positions {100 * tokens / rows:.0f}% of padded rows)")


def main(argv=None) -> int:
    import torch

    from common.verifiers import eos_token_ids
    from decoding.verifiers import load_verifier
    from drafters.variants import DataSpec, select_examples
    from drafters.vocab import count_targets, select_ids

    args = _parse(argv)
    warnings.simplefilter("ignore")
    model, tok = load_verifier()
    eos = eos_token_ids(model, tok)
    spec = DataSpec(n=args.n, heldout=1, max_length=args.max_length)
    print(f"torch threads {torch.get_num_threads()}; n={args.n} per corpus, max_length {args.max_length}")
    feats, exs = [], []
    for corpus in ("mathinstruct", "sharegpt"):
        train, _ = select_examples(tok, eos, corpus, spec)
        exs += train
        feats += _extract(model, train, corpus)
    ids = select_ids(count_targets(exs, model.config.vocab_size), args.vocab, eos)
    feats.sort(key=lambda e: e.id)  # a fixed stream order, the same for every configuration
    bucketed = sorted(feats, key=lambda e: len(e.input_ids))
    configs = [("full vocab, stream order (old)", None, feats, False), (f"+ draft vocab {args.vocab}", ids,
            feats, False),
               ("+ length buckets", ids, bucketed, False), ("+ bf16 autocast", ids, bucketed, True)]
    for backbone in ("eagle2", "hass"):
        for label, vocab, order, bf16 in configs:
            _train_rate(model, args, backbone, label, vocab, order, bf16)
    return 0


if __name__ == "__main__":
    sys.exit(main())
