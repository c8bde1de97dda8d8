"""python -m drafters {init,merge,export,import} ...: a drafter initialised, merged, exported or read back
(training is `python -m workers train`, workers/train_cli.py: it launches Ray Train)."""
from __future__ import annotations

import argparse
import sys


def _init(args) -> None:
    from common.verifiers import load_from_registry, resolve
    from drafters.checkpoint import init_drafter, load_any, save_any
    from drafters.config import DrafterConfig
    from drafters.eagle3 import Eagle3Config, init_eagle3

    name = resolve(args.verifier).name
    model, _ = load_from_registry(args.verifier)
    # the same draft vocabulary as a trained drafter (a TIES / task-arithmetic base)
    ids = load_any(args.vocab_from).draft_ids() if args.vocab_from else None
    size = None if ids is None else int(ids.shape[0])
    if args.backbone == "eagle3":  # its LM head starts as the verifier's rows (as the trainer's init)
        cfg = Eagle3Config.for_verifier(model, name, seed=args.seed, draft_vocab_size=size)
        drafter = init_eagle3(cfg, ids, model.get_output_embeddings().weight)
    else:
        cfg = DrafterConfig.for_verifier(model, name, args.backbone, seed=args.seed, draft_vocab_size=size)
        drafter = init_drafter(cfg, ids)
    out = save_any(drafter, args.out)
    print(f"wrote randomly initialised {args.backbone} drafter for {name} to {out}")


def _export(args) -> None:
    from common.verifiers import verifier_config
    from drafters.checkpoint import load_config
    from drafters.eagle3 import is_eagle3_checkpoint, load_eagle3
    from drafters.export import ContractError, export
    from drafters.formats import EAGLE3_LAYOUTS, FORMATS, TOKEN_MAP_FILE

    eagle3 = is_eagle3_checkpoint(args.ckpt)
    try:
        name = args.verifier or (load_eagle3(args.ckpt).config if eagle3 else load_config(args.ckpt)).verifier
        vcfg, ref = verifier_config(name)
        out = export(args.ckpt, args.format, args.out, vcfg, ref, dtype=args.dtype,
                     full_vocab_head=args.full_vocab_head, depth=args.depth)
    except (ContractError, FileNotFoundError) as e:
        raise SystemExit(f"error: {e}") from None
    print(f"wrote {args.format} export of {args.ckpt} to {out} (checked against the {args.format} contract)")
    if eagle3:
        serve = EAGLE3_LAYOUTS[args.format].serve
        print("serve with " + serve.replace("DIR", str(out)).replace("VERIFIER", ref["name_or_path"]))
        return
    serve = FORMATS[args.format].serve.replace("DIR", str(out))
    if (out / TOKEN_MAP_FILE).is_file():
        serve += f" --speculative-token-map {out / TOKEN_MAP_FILE}"
    print("serve with " + serve)


def _import(args) -> None:
    from drafters.checkpoint import save_checkpoint
    from drafters.eagle3 import Eagle3Drafter, save_eagle3
    from drafters.export import ContractError, load_export

    try:
        drafter = load_export(args.export_dir, verifier=args.verifier, backbone=args.backbone)
    except (ContractError, FileNotFoundError) as e:
        raise SystemExit(f"error: {e}") from None
    save = save_eagle3 if isinstance(drafter, Eagle3Drafter) else save_checkpoint
    print(f"wrote {save(drafter, args.out)} from {args.export_dir}")

def _merge(args) -> None:
    from drafters.merge import merge_checkpoints

    out = merge_checkpoints(args.kind, args.checkpoints, args.out, lam=args.lam, base=args.base,
                            alpha=args.alpha, density=args.density)
    print(f"wrote {args.kind} merge to {out}")


TRAIN_MOVED = ("error: `python -m drafters train` is now `python -m workers train`, with the same flags "
               "(training launches Ray Train, which lives in workers/)")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m drafters")
    sub = p.add_subparsers(dest="cmd", required=True)
    q = sub.add_parser("init", help="write a randomly initialised drafter checkpoint")
    q.add_argument("--verifier", default="smollm2-135m-instruct")
    q.add_argument("--backbone", choices=["eagle2", "hass", "eagle3"], required=True)
    q.add_argument("--seed", type=int, default=0)
    q.add_argument("--vocab-from", default=None, help="copy the draft vocabulary of this checkpoint")
    q.add_argument("--out", required=True)
    q.set_defaults(fn=_init)
    q = sub.add_parser("export", help="write a drafter in a serving format (checked against its contract)")
    q.add_argument("ckpt", help="a drafter checkpoint directory (config.json + model.safetensors)")
    q.add_argument("--format", choices=["eagle", "sglang", "speculators", "sglang-eagle3"], required=True,
                   help="eagle2/hass: eagle (vLLM), sglang; eagle3: speculators (speculators 0.9, vLLM), "
                        "sglang-eagle3 (SGLang, SpecForge)")
    q.add_argument("--out", required=True)
    q.add_argument("--verifier", default=None, help="default: the verifier the drafter was trained for")
    q.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    q.add_argument("--depth", type=int, default=5, help="speculative tokens recorded in a speculators config")
    q.add_argument("--full-vocab-head", action="store_true",
                   help="eagle format only: export a reduced-vocabulary drafter to draft over the full "
                        "vocabulary")
    q.set_defaults(fn=_export)
    q = sub.add_parser("import", help="read an export back into this project's checkpoint format")
    q.add_argument("export_dir")
    q.add_argument("--out", required=True)
    q.add_argument("--verifier", default=None)
    q.add_argument("--backbone", choices=["eagle2", "hass"], default=None)
    q.set_defaults(fn=_import)
    m = sub.add_parser("merge", help="weight-space merge of drafter checkpoints")
    m.add_argument("--kind", choices=["linear", "task_arithmetic", "ties"], required=True)
    m.add_argument("checkpoints", nargs="+")
    m.add_argument("--lam", type=float, default=None)
    m.add_argument("--base", default=None)
    m.add_argument("--alpha", type=float, default=1.0)
    m.add_argument("--density", type=float, default=0.2)
    m.add_argument("--out", required=True)
    m.set_defaults(fn=_merge)
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["train"]:
        raise SystemExit(TRAIN_MOVED)
    args = p.parse_args(argv)
    args.fn(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
