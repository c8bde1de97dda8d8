"""Benchmark: training tokens/s of eagle3 vs eagle2, in-process, on the same cached examples.

python experiments/bench_eagle3_training.py [--n 16] [--max-length 96] [--epochs 2] [--vocab 1024] [--repeats 2]

One EAGLE-3 feature cache of the math corpus (the aux layers plus what an EAGLE-2 cache holds): the
eagle2 runs read its LM-head features and ignore the aux layers, so both backbones see the same
examples, batches and draft vocabulary. Each run is drafters.trainer.train (plain AdamW, fp32,
no DeepSpeed); the rate is the trainer's own ``train_tokens_per_s`` (loss tokens over the epochs'
wall time, held-out evaluation excluded), pooled over the epochs. Runs alternate between the
backbones so that a busy machine slows both alike.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    import torch

    from decoding.verifiers import eos_token_ids, load_verifier
    from drafters.eagle3 import default_aux_layers
    from drafters.trainer import TrainConfig, train
    from drafters.variants import DataSpec, ensure_features, heldout_data, select_examples, variant_data
    from drafters.vocab import count_targets, save_vocab, select_ids

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
    aux = default_aux_layers(model.config.num_hidden_layers)
    caches = {"mathinstruct": ensure_features(model, tok, eos, "smollm2-135m-instruct", "mathinstruct", spec,
                                              str(tmp), aux_layers=aux)}
    train_exs, _ = select_examples(tok, eos, "mathinstruct", spec)
    vocab = save_vocab(select_ids(count_targets(train_exs, model.config.vocab_size), args.vocab, eos), tmp / "vocab")
    print(f"torch threads {torch.get_num_threads()}; n={args.n} math examples, max_length {args.max_length}, "
          f"batch {args.batch_size}, {args.epochs} epochs, draft vocabulary {args.vocab}, aux layers {list(aux)}")
    rates: dict[str, list[float]] = {"eagle2": [], "eagle3": []}
    for r in range(args.repeats):
        for backbone in ("eagle2", "eagle3"):
            cfg = TrainConfig(verifier="smollm2-135m-instruct", backbone=backbone, variant="math",
                              out_dir=str(tmp / f"{backbone}-{r}"), draft_vocab=str(vocab),
                              train_data=variant_data("math", str(tmp), caches, args.n),
                              heldout_data=heldout_data(str(tmp), caches), epochs=args.epochs, lr=5e-3,
                              batch_size=args.batch_size, deepspeed=False)
            c0 = time.process_time()
            final = train(cfg, model)
            cpu = time.process_time() - c0
            hist = json.loads((final / "config.json").read_text())["training"]["history"][1:]
            toks = sum(h["train_tokens_per_s"] * h["epoch_seconds"] for h in hist)
            secs = sum(h["epoch_seconds"] for h in hist)
            rates[backbone].append(toks / secs)
            print(f"{backbone} run {r}: {toks:.0f} loss tokens in {secs:.1f} s = {toks / secs:.1f} tokens/s "
                  f"(process CPU {cpu:.1f} s, held-out evaluation included); held-out top-1 at depth 1 "
                  f"{hist[-1]['top1_depth1']:.3f}", flush=True)
    best = {b: max(v) for b, v in rates.items()}
    print(f"best of {args.repeats}: eagle2 {best['eagle2']:.1f} tokens/s, eagle3 {best['eagle3']:.1f} tokens/s "
          f"(eagle3 / eagle2 = {best['eagle3'] / best['eagle2']:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
