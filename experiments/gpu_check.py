"""GPU readiness in one short script (a few minutes on one GPU):

1. exactness: every strategy (single, confidence, entropy, merged, merged-dedup, budget-matched
   merged) decodes real prompts at T=0 in float32 and bfloat16 and is compared token for token with
   transformers' greedy ``generate`` on the same device; a divergence is classified as a near-tie
   (top-2 logit gap within the dtype's noise at the first differing position -- 0.01 in float32,
   0.5 in bfloat16, whose spacing is 0.125 at a logit of 16-32 -- reported with its gap) or a
   MISMATCH (a bug: exit code 1);
2. speed: tokens/s of each strategy against ``generate`` (same prompts, device, dtype), and the
   host round trips per decode step (device -> host reads and host -> device copies, counted by
   tests/accelerator.py's SyncCounter on CUDA; the test suite bounds them on a CPU stand-in);
3. training: one short DeepSpeed (ZeRO-1) run of a HASS drafter through Ray Train on the GPU, from
   features extracted on the GPU, printing loss tokens/s.

``python experiments/gpu_check.py [--verifier NAME|DIR] [--drafter CKPT ...] [--llama3-shaped on|off]``
(random drafters when none are given: exactness and overhead are still measured; acceptance then
is ~1; on CUDA the same rows also run on a random model with Llama-3-8B's shape). Everything is
printed as ONE markdown table at the end, ready for docs/cluster.md.
``--device cpu`` runs the same checks on a CPU (used by the test suite to keep this script working).
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from decoding.verifiers import TIE_GAP  # noqa: E402
from tests.accelerator import SyncCounter  # noqa: E402

STRATEGIES = ("single", "confidence", "entropy", "merged", "merged-dedup", "merged-budget")


def _sync(device: str) -> None:
    from decoding.timing import synchronize

    synchronize(device)


COLUMNS = ("model", "dtype", "check", "equal", "near-tie", "MISMATCH", "tok/s", "vs gen", "tau", "syncs/step",
           "h2d/step", "note")


def check_dtype(args, dtype: str) -> list[dict]:
    """One row for generate and one per strategy: exactness, tokens/s, tau and host round trips."""
    from decoding.bench import hf_generate
    from decoding.engine import DecodeConfig, SpeculativeDecoder
    from decoding.runner import load_proposers
    from decoding.tree import TreeConfig
    from decoding.verifiers import compare_greedy, eos_token_ids, load_verifier, resolve
    from drafters.checkpoint import init_drafter, save_checkpoint
    from drafters.config import DrafterConfig
    from drafters.data.sources import load_benchmark
    from drafters.data.templating import benchmark_prompt_ids

    name = resolve(args.verifier).name
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, tok = load_verifier(args.verifier, dtype=dtype, device=args.device)
    eos = eos_token_ids(model, tok)
    paths = list(args.drafter)
    tmp = tempfile.mkdtemp(prefix="gpu-check-")
    for s in range(len(paths), 2):
        cfg = DrafterConfig.for_verifier(model, name, "hass", seed=s)
        paths.append(str(save_checkpoint(init_drafter(cfg), f"{tmp}/random-{s}")))
    props = load_proposers(model, paths, name)
    prompts = [p for b in ("gsm8k", "mt_bench") for p in load_benchmark(b)[0][: args.n_prompts]]
    inputs = [benchmark_prompt_ids(tok, p, 0, []) for p in prompts]
    hf_generate(model, inputs[0], 4, eos, 0.0, 0)  # warm-up
    _sync(args.device)
    t0 = time.perf_counter()
    refs = [hf_generate(model, ids, args.max_new_tokens, eos, 0.0, 0) for ids in inputs]
    _sync(args.device)
    gen_tps = sum(map(len, refs)) / (time.perf_counter() - t0)
    model_name = Path(name).name if Path(name).exists() else name
    rows = [dict(model=model_name, dtype=dtype, check="generate", **{"tok/s": f"{gen_tps:.1f}", "vs gen": "1.00x"},
                 note=f"{len(inputs)} prompts x {args.max_new_tokens} tokens")]
    for spec in STRATEGIES:
        strat, dedup, budget = spec.split("-")[0], spec.endswith("dedup"), spec.endswith("budget")
        n = 1 if strat == "single" else 2
        cfg = DecodeConfig(strategy=strat, max_new_tokens=args.max_new_tokens, merge_dedup=dedup, merge_budget=budget,
                           tree=TreeConfig(4, 4, 16))
        dec = SpeculativeDecoder(model, props[:n], cfg, eos)
        dec.generate(inputs[0][:8], seed_key="warm-up")  # first-call costs (tuning, kernels) stay out of the time
        counts, gaps, toks, calls, new = {"equal": 0, "near-tie": 0, "MISMATCH": 0}, [], 0, 0, 0
        _sync(args.device)
        t0 = time.perf_counter()
        outs = [dec.generate(ids, seed_key=str(i)) for i, ids in enumerate(inputs)]
        _sync(args.device)
        wall = time.perf_counter() - t0
        per_step = "-", "-"
        if args.device.startswith("cuda"):  # host round trips, counted on a separate (untimed) run
            with SyncCounter() as counter:
                res = [dec.generate(ids, seed_key=str(i)) for i, ids in enumerate(inputs)]
            steps = max(1, sum(r.verifier_calls for r in res))
            per_step = tuple(f"{counter.counts[k] / steps:.1f}" for k in ("sync", "h2d"))
        tie_gap = args.tie_gap if args.tie_gap is not None else TIE_GAP[dtype]
        for ids, res, ref in zip(inputs, outs, refs):
            kind, gap = compare_greedy(model, ids, res.output_token_ids, ref, tie_gap)
            counts[kind] += 1
            toks, calls, new = toks + len(res.output_token_ids), calls + res.verifier_calls, new + res.new_tokens
            if gap is not None:
                gaps.append(round(gap, 4))
        tps = toks / wall
        rows.append(dict(model=model_name, dtype=dtype, check=spec, **counts, **{"tok/s": f"{tps:.1f}"},
                         **{"vs gen": f"{tps / gen_tps:.2f}x", "syncs/step": per_step[0], "h2d/step": per_step[1]},
                         tau=f"{new / max(calls, 1):.2f}", note=f"gaps at ties {gaps}" if gaps else ""))
    return rows


def check_training(args) -> dict:
    """One short DeepSpeed run through Ray Train on the device (the grid's own training path)."""
    import ray

    from decoding.verifiers import eos_token_ids, load_verifier, resolve
    from drafters.trainer import TrainConfig
    from drafters.variants import DataSpec, ensure_features, heldout_data, variant_data
    from workers.train_worker import run_training

    name = resolve(args.verifier).name
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, tok = load_verifier(args.verifier, device=args.device)
    root = tempfile.mkdtemp(prefix="gpu-check-features-")
    spec = DataSpec(n=64, heldout=8, max_length=256)
    t0 = time.perf_counter()
    caches = {"mathinstruct": ensure_features(model, tok, eos_token_ids(model, tok), name, "mathinstruct", spec, root)}
    t_features = time.perf_counter() - t0
    cfg = TrainConfig(verifier=name, backbone="hass", variant="math", out_dir=tempfile.mkdtemp(prefix="gpu-check-train-"),
                      train_data=variant_data("math", root, caches, spec.n), heldout_data=heldout_data(root, caches),
                      epochs=1, lr=1e-3, batch_size=8, deepspeed=True, zero_stage=1,
                      precision="bf16" if args.device.startswith("cuda") else "fp32")  # as the paper profile
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        gpu = args.device.startswith("cuda")
        final, result = run_training(cfg, num_workers=1, use_gpu=gpu, cpus_per_worker=1, name="gpu-check")
    finally:
        ray.shutdown()
    m = result.metrics or {}
    tps = f"{m.get('train_tokens_per_s', 0):.0f}"
    return dict(model=name, dtype="bfloat16" if cfg.precision == "bf16" else "float32", check="train (ZeRO-1)",
                **{"tok/s": tps},
                note=f"features {spec.n} ex in {t_features:.0f}s; {m.get('steps')} steps, loss "
                     f"{m.get('train_loss', 0):.3f}, held-out top-1 {m.get('top1_depth1', 0):.3f} "
                     "(tok/s: loss tokens)")


def print_table(rows: list[dict]) -> None:
    """Every check in one markdown table (paste it into docs/cluster.md as it is)."""
    cells = [[str(r.get(c, "")) for c in COLUMNS] for r in rows]
    width = [max(len(c), *(len(x[i]) for x in cells)) for i, c in enumerate(COLUMNS)]
    line = lambda xs: "| " + " | ".join(x.ljust(w) for x, w in zip(xs, width)) + " |"  # noqa: E731
    print("\n" + line(COLUMNS) + "\n" + line(["-" * w for w in width]))
    for x in cells:
        print(line(x))


def main(argv=None) -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--verifier", default="smollm2-135m-instruct")
    ap.add_argument("--drafter", action="append", default=[], help="drafter checkpoint (repeat for two)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--n-prompts", type=int, default=4, help="per benchmark (gsm8k, mt_bench)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--tie-gap", type=float, default=None,
                    help=f"top-2 logit gap that counts as a near-tie (default per dtype: {TIE_GAP})")
    ap.add_argument("--no-train", action="store_true")
    ap.add_argument("--llama3-shaped", choices=("auto", "on", "off"), default="auto",
                    help="also run the exactness/speed rows on a random model with Llama-3-8B's shape "
                         "(experiments/llama3_shaped.py: GQA, 128k vocabulary), built locally; auto = on CUDA")
    args = ap.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("error: no CUDA device; `--device cpu` runs the same checks on the CPU", file=sys.stderr)
        return 2
    if args.device.startswith("cuda"):
        print(f"device: {torch.cuda.get_device_name()} ({torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} GiB), "
              f"torch {torch.__version__}")
    rows = [r for d in args.dtypes.split(",") for r in check_dtype(args, d)]
    if args.llama3_shaped == "on" or (args.llama3_shaped == "auto" and args.device.startswith("cuda")):
        spec = importlib.util.spec_from_file_location("llama3_shaped", Path(__file__).with_name("llama3_shaped.py"))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        shaped = argparse.Namespace(**{**vars(args), "verifier": str(mod.build(tempfile.mkdtemp(prefix="llama3-")))})
        rows += [r for d in args.dtypes.split(",") for r in check_dtype(shaped, d)]
    if not args.no_train:
        rows.append(check_training(args))
    print_table(rows)
    bad = sum(int(r.get("MISMATCH", 0)) for r in rows)
    print(f"\n{'FAILED' if bad else 'OK'}: {bad} mismatch(es) that are not near-ties")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
