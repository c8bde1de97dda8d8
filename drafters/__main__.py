"""python -m drafters {init,train,merge} ..."""
from __future__ import annotations

import argparse
import sys


def _init(args) -> None:
    from decoding.verifiers import load_verifier, resolve

    from .checkpoint import init_drafter, save_checkpoint
    from .config import DrafterConfig

    name = resolve(args.verifier).name
    model, _ = load_verifier(args.verifier)
    ids = None
    if args.vocab_from:  # the same draft vocabulary as a trained drafter (a TIES / task-arithmetic base)
        from .checkpoint import load_checkpoint

        ids = load_checkpoint(args.vocab_from).draft_ids()
    cfg = DrafterConfig.for_verifier(model, name, args.backbone, seed=args.seed,
                                     draft_vocab_size=None if ids is None else int(ids.shape[0]))
    out = save_checkpoint(init_drafter(cfg, ids), args.out)
    print(f"wrote randomly initialised {args.backbone} drafter for {name} to {out}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m drafters")
    sub = p.add_subparsers(dest="cmd", required=True)
    q = sub.add_parser("init", help="write a randomly initialised drafter checkpoint")
    q.add_argument("--verifier", default="smollm2-135m-instruct")
    q.add_argument("--backbone", choices=["eagle2", "hass"], required=True)
    q.add_argument("--seed", type=int, default=0)
    q.add_argument("--vocab-from", default=None, help="copy the draft vocabulary of this checkpoint")
    q.add_argument("--out", required=True)
    q.set_defaults(fn=_init)
    from .cli_train import add_subcommands

    add_subcommands(sub)
    args = p.parse_args(argv)
    args.fn(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
