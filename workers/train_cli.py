"""`python -m workers train`: features extracted (cached) and one drafter trained, with Ray Train +
DeepSpeed or in this process (`--no-ray`)."""
from __future__ import annotations

import json
from pathlib import Path

from common.dtypes import PRECISIONS
from drafters.config import BACKBONES
from drafters.corpora import CORPORA, VARIANTS, variant_corpora


def _train(args) -> None:
    if args.backbone == "eagle3" and args.loss_mask != "next":  # before the verifier loads
        raise SystemExit(f"--backbone eagle3 trains with --loss-mask next only, got {args.loss_mask!r}")
    from common.verifiers import eos_token_ids, resolve
    from decoding.verifiers import load_verifier
    from drafters.train.config import TrainConfig
    from drafters.variants import DataSpec, ensure_features, heldout_data, variant_data

    name = resolve(args.verifier).name
    spec = DataSpec(n=args.n, heldout=args.heldout, max_length=args.max_length, seed=args.data_seed,
                    self_distill=args.self_distill)
    features = str(Path(args.features_dir).resolve())
    model, tok = load_verifier(args.verifier)
    eos = eos_token_ids(model, tok)
    corpora = variant_corpora(args.variant)
    aux = None
    if args.backbone == "eagle3":  # its caches hold the aux layers' hidden states (their own keys)
        from drafters.eagle3 import default_aux_layers

        aux = default_aux_layers(model.config.num_hidden_layers)
    caches = {c: ensure_features(model, tok, eos, name, c, spec, features, aux_layers=aux,
                                 progress=lambda s, d, t: print(f"[{s}] {d}/{t}", flush=True))
                                 for c in corpora}
    vocab = _draft_vocab(args, model, tok, eos, name, spec, features) if args.draft_vocab else None
    cfg = TrainConfig(
        verifier=name, backbone=args.backbone, variant=args.variant, out_dir=str(Path(args.out).resolve()),
        draft_vocab=vocab,
        train_data=variant_data(args.variant, features, caches, args.n),
        heldout_data=heldout_data(features, caches),
        epochs=args.epochs, lr=args.lr, batch_size=args.batch_size, init_seed=args.seed,
        deepspeed=not args.no_deepspeed, zero_stage=args.zero_stage, loss_mask=args.loss_mask,
        precision=args.precision,
    )
    if args.no_ray:
        from drafters.train.loop import train

        final = train(cfg, model)
    else:
        import ray

        from workers.train_worker import run_training

        ray.init(address=args.ray_address, dashboard_host="127.0.0.1", ignore_reinit_error=True,
                 runtime_env={"env_vars": {"TASKSPEC_TRAIN_THREADS": str(args.threads)}} if args.threads
                 else None)
        final, _ = run_training(cfg, num_workers=args.num_workers, cpus_per_worker=args.cpus_per_worker)
    hist = json.loads((final / "config.json").read_text())["training"]["history"]
    for h in hist:
        print({k: round(v, 4) if isinstance(v, float) else v for k, v in h.items()})
    print(f"final checkpoint: {final}")


def _draft_vocab(args, model, tok, eos, name: str, spec, features: str) -> str:
    """The reduced draft vocabulary's file, built if missing: one file per (verifier, data spec, size),
    shared by every variant trained with it."""
    from drafters.variants import build_vocab
    from drafters.vocab import save_vocab

    vocab = Path(features) / (f"vocab-{name}-n{spec.n}-len{spec.max_length}-s{spec.seed}-"
                              f"{args.draft_vocab}.safetensors")
    if not vocab.is_file():
        ids, stats = build_vocab(tok, eos, list(CORPORA), spec, args.draft_vocab, model.config.vocab_size)
        save_vocab(ids, vocab, stats)
        print(f"draft vocabulary {args.draft_vocab}: {100 * stats['coverage']:.1f}% of assistant tokens "
              f"-> {vocab}")
    return str(vocab)


def add_train(sub) -> None:
    t = sub.add_parser("train",
                       help="extract features (cached) and train one drafter with Ray Train + DeepSpeed")
    t.add_argument("--verifier", default="smollm2-135m-instruct")
    t.add_argument("--backbone", choices=list(BACKBONES), required=True)
    t.add_argument("--variant", choices=list(VARIANTS), required=True)
    t.add_argument("--n", type=int, default=256, help="examples per domain")
    t.add_argument("--heldout", type=int, default=32)
    t.add_argument("--max-length", type=int, default=512)
    t.add_argument("--epochs", type=int, default=2)
    t.add_argument("--lr", type=float, default=3e-4)
    t.add_argument("--batch-size", type=int, default=8)
    t.add_argument("--seed", type=int, default=0, help="drafter init seed (shared by all variants)")
    t.add_argument("--data-seed", type=int, default=42)
    t.add_argument("--zero-stage", type=int, choices=[0, 1, 2], default=1)
    t.add_argument("--draft-vocab", type=int, default=None,
                   help="reduced draft vocabulary size (from both corpora's training data; default: full "
                        "vocabulary)")
    t.add_argument("--self-distill", choices=["greedy", "sample"], default=None,
                   help="train on the verifier's own answers to the training prompts (cached; held-out "
                        "stays original)")
    t.add_argument("--loss-mask", choices=["next", "reference"], default="next",
                   help="loss positions: next = the input token is the assistant's (decode-time); reference "
                        "= EAGLE/HASS's")
    t.add_argument("--precision", choices=list(PRECISIONS), default="fp32",
                   help="bf16: DeepSpeed's bf16 engine (float32 master weights), or autocast with "
                        "--no-deepspeed")
    t.add_argument("--no-deepspeed", action="store_true")
    t.add_argument("--no-ray", action="store_true", help="train in this process (no Ray Train)")
    t.add_argument("--num-workers", type=int, default=1)
    t.add_argument("--cpus-per-worker", type=int, default=1)
    t.add_argument("--threads", type=int, default=0, help="torch threads per worker (0 = all cores)")
    t.add_argument("--ray-address", default=None)
    t.add_argument("--features-dir", default="runs/features")
    t.add_argument("--out", required=True)
    t.set_defaults(fn=_train)


def main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m workers")
    add_train(p.add_subparsers(dest="cmd", required=True))
    args = p.parse_args(argv)
    args.fn(args)
    return 0
