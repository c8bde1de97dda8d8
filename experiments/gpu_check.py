"""GPU readiness in one short script (a few minutes on one GPU; ``experiments/gpu_check.sh`` runs it as is):

1. exactness: every strategy (single, confidence, entropy, merged, merged-dedup, budget-matched
   merged) decodes real prompts at T=0 and is compared token for token with transformers' greedy
   ``generate`` on the same device; a divergence is classified as a near-tie (top-2 logit gap within
   the dtype's noise at the first differing position -- 0.01 in float32, 0.5 in bfloat16, whose
   spacing is 0.125 at a logit of 16-32 -- reported with its gap) or a MISMATCH (a bug: exit code 1);
2. speed: tokens/s of each strategy against ``generate`` (same prompts, device, dtype), the host
   round trips per decode step (device -> host reads and host -> device copies, counted by
   tests/accelerator.py's SyncCounter on CUDA, and CUDA's own count of synchronizing calls under
   ``torch.cuda.set_sync_debug_mode``), and the peak device memory of each row;
3. training: one DeepSpeed (ZeRO-1) run of a HASS drafter through Ray Train on the device, in bf16
   on CUDA, from features extracted on the device; it fails the check (exit code 1) when its loss is
   not finite or does not fall from the first epoch to the last. With ``--standalone`` that drafter
   is then the first of the decoding rows' drafters.

``--standalone`` needs nothing outside the repository: the verifier is a random model with
Llama-3-8B-Instruct's shape (``--shape llama3-8b``: 32 layers, hidden 4096, GQA 32/8, 128,256-token
vocabulary; ``--layers`` fewer only where memory needs it) built on the device, and the data are
built on the spot (experiments/standalone_data.py); no GGUF file, no ../shared. ``--shape small``
on ``--device cpu`` is the dry mode the test suite runs. Without ``--standalone`` the check runs
the configured verifier (default: the embedded SmolLM2) on the local data.

Each row is printed as it completes; everything is printed again as ONE markdown table at the end.
What it prints and what each part costs: docs/gpu-check.md.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import resource
import sys
import tempfile
import time
import warnings
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from decoding.timing import synchronize  # noqa: E402
from decoding.verifiers import TIE_GAP  # noqa: E402
from tests.accelerator import SyncCounter, caller  # noqa: E402

STRATEGIES = ("single", "confidence", "entropy", "merged", "merged-dedup", "merged-budget")
COLUMNS = ("model", "dtype", "check", "equal", "near-tie", "MISMATCH", "tok/s", "vs gen", "tau", "syncs/step",
           "h2d/step", "cuda-sync/step", "peak mem", "note")


def _experiment(name: str):
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class Table:
    """Rows printed as they complete (a failure later keeps them), and all of them again at the end."""

    def __init__(self):
        self.rows: list[dict] = []

    def add(self, row: dict) -> None:
        self.rows.append(row)
        print("row: " + " | ".join(f"{c}={row[c]}" for c in COLUMNS if row.get(c) not in (None, "")), flush=True)

    def print(self) -> None:
        cells = [[str(r.get(c, "")) for c in COLUMNS] for r in self.rows]
        width = [max(len(c), *(len(x[i]) for x in cells)) for i, c in enumerate(COLUMNS)]
        line = lambda xs: "| " + " | ".join(x.ljust(w) for x, w in zip(xs, width)) + " |"  # noqa: E731
        print("\n" + line(COLUMNS) + "\n" + line(["-" * w for w in width]))
        for x in cells:
            print(line(x))


def _reset_peak(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()


def _peak(device: str) -> str:
    """Peak device memory since the last reset (CUDA), else this process's peak resident set."""
    if device.startswith("cuda"):
        return f"{torch.cuda.max_memory_allocated() / 2**30:.1f} GiB"
    return f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.1f} GiB RSS"


def _count_syncs(device: str, run) -> tuple[SyncCounter, float, Counter, int]:
    """One untimed run: SyncCounter (counts and where), CUDA's synchronizing calls per step under
    ``set_sync_debug_mode("warn")``, and the source lines that made CUDA's calls."""
    sites = Counter()

    def seen(message, category, filename, lineno, file=None, line=None):  # called where the sync happens
        if "synchroniz" in str(message):
            sites[caller()] += 1

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = seen
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with SyncCounter() as counter:
                steps = run()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return counter, sum(sites.values()) / steps, sites, steps


def _sites(where: Counter, steps: int) -> str:
    return ", ".join(f"{k} {n / steps:.2f}" for k, n in where.most_common(6)) or "none"


def check_dtype(args, dtype: str, table: Table) -> None:
    """One row for generate and one per strategy: exactness, tokens/s, tau, host round trips, memory."""
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
    _reset_peak(args.device)
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
    synchronize(args.device)
    t0 = time.perf_counter()
    refs = [hf_generate(model, ids, args.max_new_tokens, eos, 0.0, 0) for ids in inputs]
    synchronize(args.device)
    gen_tps = sum(map(len, refs)) / (time.perf_counter() - t0)
    model_name = args.model_label or (Path(name).name if Path(name).exists() else name)
    table.add(dict(model=model_name, dtype=dtype, check="generate", **{"tok/s": f"{gen_tps:.1f}", "vs gen": "1.00x"},
                   **{"peak mem": _peak(args.device)}, note=f"{len(inputs)} prompts x {args.max_new_tokens} tokens"))
    for spec in STRATEGIES:
        strat, dedup, budget = spec.split("-")[0], spec.endswith("dedup"), spec.endswith("budget")
        n = 1 if strat == "single" else 2
        cfg = DecodeConfig(strategy=strat, max_new_tokens=args.max_new_tokens, merge_dedup=dedup, merge_budget=budget,
                           tree=TreeConfig(4, 4, 16))
        dec = SpeculativeDecoder(model, props[:n], cfg, eos)
        dec.generate(inputs[0][:8], seed_key="warm-up")  # first-call costs (tuning, kernels) stay out of the time
        counts, gaps, toks, calls, new = {"equal": 0, "near-tie": 0, "MISMATCH": 0}, [], 0, 0, 0
        _reset_peak(args.device)
        synchronize(args.device)
        t0 = time.perf_counter()
        outs = [dec.generate(ids, seed_key=str(i)) for i, ids in enumerate(inputs)]
        synchronize(args.device)
        wall = time.perf_counter() - t0
        peak = _peak(args.device)
        per_step = {"syncs/step": "-", "h2d/step": "-", "cuda-sync/step": "-"}
        if args.device.startswith("cuda"):  # host round trips, counted on a separate (untimed) run
            def run():
                res = [dec.generate(ids, seed_key=str(i)) for i, ids in enumerate(inputs)]
                return max(1, sum(r.verifier_calls for r in res))

            ours, cuda, sites, steps = _count_syncs(args.device, run)
            per_step = {"syncs/step": f"{ours.counts['sync'] / steps:.1f}",
                        "h2d/step": f"{ours.counts['h2d'] / steps:.1f}", "cuda-sync/step": f"{cuda:.1f}"}
            print(f"per step, by source line, {spec} ({dtype}): syncs {_sites(ours.where['sync'], steps)}; "
                  f"h2d {_sites(ours.where['h2d'], steps)}; CUDA's {_sites(sites, steps)}", flush=True)
        tie_gap = args.tie_gap if args.tie_gap is not None else TIE_GAP[dtype]
        for ids, res, ref in zip(inputs, outs, refs):
            kind, gap = compare_greedy(model, ids, res.output_token_ids, ref, tie_gap)
            counts[kind] += 1
            toks, calls, new = toks + len(res.output_token_ids), calls + res.verifier_calls, new + res.new_tokens
            if gap is not None:
                gaps.append(round(gap, 4))
        tps = toks / wall
        table.add(dict(model=model_name, dtype=dtype, check=spec, **counts, **{"tok/s": f"{tps:.1f}"},
                       **{"vs gen": f"{tps / gen_tps:.2f}x", "peak mem": peak}, **per_step,
                       tau=f"{new / max(calls, 1):.2f}", note=f"gaps at ties {gaps}" if gaps else ""))


def check_training(args, table: Table) -> Path:
    """One DeepSpeed run through Ray Train on the device (the grid's own training path); returns the
    final checkpoint. Steps: ``--train-examples`` / ``--train-batch`` per epoch, epochs for ``--train-steps``."""
    import ray

    from decoding.verifiers import eos_token_ids, load_verifier, resolve
    from drafters.trainer import TrainConfig
    from drafters.variants import DataSpec, ensure_features, heldout_data, variant_data
    from workers.train_worker import run_training

    name = resolve(args.verifier).name
    gpu = args.device.startswith("cuda")
    precision = "bf16" if gpu or args.standalone else "fp32"  # bf16 as the paper profile (CPU: DeepSpeed's bf16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, tok = load_verifier(args.verifier, device=args.device)
    root = tempfile.mkdtemp(prefix="gpu-check-features-")
    spec = DataSpec(n=args.train_examples, heldout=8, max_length=256)
    t0 = time.perf_counter()
    caches = {"mathinstruct": ensure_features(model, tok, eos_token_ids(model, tok), name, "mathinstruct", spec, root)}
    t_features = time.perf_counter() - t0
    per_epoch = max(1, spec.n // args.train_batch)
    epochs = math.ceil(args.train_steps / per_epoch)
    cfg = TrainConfig(verifier=name, backbone="hass", variant="math", out_dir=tempfile.mkdtemp(prefix="gpu-check-train-"),
                      train_data=variant_data("math", root, caches, spec.n), heldout_data=heldout_data(root, caches),
                      epochs=epochs, lr=args.train_lr, warmup_steps=epochs * per_epoch // 8,
                      batch_size=args.train_batch, deepspeed=True, zero_stage=1, precision=precision)
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    t0 = time.perf_counter()
    try:
        final, result = run_training(cfg, num_workers=1, use_gpu=gpu, cpus_per_worker=1, name="gpu-check")
    finally:
        ray.shutdown()
    m = result.metrics or {}
    history = json.loads((Path(final) / "state.json").read_text())["history"]  # epoch 0: before training
    losses = [h.get("train_loss", float("nan")) for h in history if h["epoch"] > 0]
    failed = training_failure(losses)
    top1 = " > ".join(f"{h.get('top1_depth1', float('nan')):.3f}" for h in history)
    table.add(dict(model=args.model_label or name, dtype="bfloat16" if precision == "bf16" else "float32",
                   check="train (ZeRO-1)", **{"tok/s": f"{m.get('train_tokens_per_s', 0):.0f}"},
                   MISMATCH=1 if failed else "",
                   note=f"features {spec.n} ex in {t_features:.0f}s; {m.get('steps')} steps of batch "
                        f"{args.train_batch}, lr {args.train_lr:g}, in {time.perf_counter() - t0:.0f}s "
                        f"(Ray Train start-up included), loss {m.get('train_loss', 0):.3f} (by epoch "
                        f"{' > '.join(f'{x:.3f}' for x in losses)}), held-out top-1 {top1} (untrained first) "
                        f"(tok/s: loss tokens){'; FAILED: ' + failed if failed else ''}"))
    return Path(final)


def training_failure(losses: list[float]) -> str:
    """Why a training run failed the check ('' if it passed): a loss that is not finite, or one that
    did not fall from the first epoch to the last (a run that diverged or learned nothing)."""
    if not losses or not all(math.isfinite(x) for x in losses):
        return f"loss not finite by epoch: {losses}"
    if len(losses) > 1 and not losses[-1] < losses[0]:
        return f"loss did not fall: first epoch {losses[0]:.3f}, last {losses[-1]:.3f}"
    return ""


def _standalone(args) -> None:
    """Data and a Llama-3-shaped verifier built here: the check needs only the repository."""
    data = _experiment("standalone_data").write_data_root(tempfile.mkdtemp(prefix="gpu-check-data-"),
                                                          n_train=args.train_examples + 16, n_prompts=args.n_prompts)
    os.environ["TASKSPEC_DATA_ROOT"] = str(data)  # every loader, and the Ray workers started below, read it
    l3 = _experiment("llama3_shaped")
    shape = dict(l3.SHAPES[args.shape])
    if args.layers:
        shape["layers"] = args.layers
    t0 = time.perf_counter()
    out = Path(args.workdir or tempfile.mkdtemp(prefix="gpu-check-model-")) / f"{args.shape}-{shape['layers']}l"
    path = l3.build(out, device=args.device, **shape)
    args.verifier = str(path)
    args.model_label = f"{args.shape} ({shape['layers']} layers, hidden {shape['hidden']})"
    print(f"built {args.model_label}, random bf16 weights, at {path} in {time.perf_counter() - t0:.0f}s; "
          f"data at {data}", flush=True)


def _default_layers(args) -> None:
    """Llama-3-8B's 32 layers where they fit (16 GB of bf16 weights, twice: the check and the trainer
    each load the verifier), else as many as fit in 60% of the device, said in the output."""
    if not (args.standalone and args.shape == "llama3-8b" and args.device.startswith("cuda")) or args.layers:
        return
    total = torch.cuda.get_device_properties(0).total_memory / 2**30
    per_layer, rest = 0.44, 2.2  # GiB in bf16: one 8B layer (218M parameters); embeddings + LM head (1.05B)
    fit = int((0.6 * total / 2 - rest) / per_layer)
    if fit < 32:
        args.layers = max(2, fit)
        print(f"note: {total:.0f} GiB on the device; Llama-3-8B's 32 layers need ~{2 * (32 * per_layer + rest):.0f} "
              f"GiB for two copies; building {args.layers} layers instead", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--verifier", default="smollm2-135m-instruct")
    ap.add_argument("--drafter", action="append", default=[], help="drafter checkpoint (repeat for two)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtypes", default=None, help="comma-separated (default: float32,bfloat16; standalone: bfloat16)")
    ap.add_argument("--n-prompts", type=int, default=4, help="per benchmark (gsm8k, mt_bench)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--tie-gap", type=float, default=None,
                    help=f"top-2 logit gap that counts as a near-tie (default per dtype: {TIE_GAP})")
    ap.add_argument("--no-train", action="store_true")
    ap.add_argument("--standalone", action="store_true",
                    help="build the verifier (Llama-3-shaped, random) and the data here: nothing from outside the "
                         "repository; the trained drafter joins the decoding rows")
    ap.add_argument("--shape", choices=("llama3-8b", "small"), default="llama3-8b")
    ap.add_argument("--layers", type=int, default=None, help="fewer layers than the shape's (memory)")
    ap.add_argument("--workdir", default=None, help="where the standalone model is written (default: a temp dir)")
    ap.add_argument("--train-examples", type=int, default=256)
    ap.add_argument("--train-batch", type=int, default=2)
    ap.add_argument("--train-steps", type=int, default=256, help="optimizer steps, rounded up to whole epochs")
    ap.add_argument("--train-lr", type=float, default=1e-4,
                    help="peak learning rate (linear warm-up over the first eighth of the steps, then decay)")
    ap.add_argument("--llama3-shaped", choices=("auto", "on", "off"), default="auto",
                    help="without --standalone: also run the exactness/speed rows on a small random model of "
                         "Llama-3's layout (GQA, 128k vocabulary), built locally; auto = on CUDA")
    args = ap.parse_args(argv)
    args.model_label = None
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("error: no CUDA device; `--device cpu` runs the same checks on the CPU", file=sys.stderr)
        return 2
    if args.device.startswith("cuda"):
        print(f"device: {torch.cuda.get_device_name()} ({torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} "
              f"GiB), torch {torch.__version__}", flush=True)
    # standalone on a GPU: float32 first (exactness: a random verifier's top-2 logit gaps are ~0.2, within
    # bf16's noise, so its bf16 rows part from generate at near-ties), then bfloat16 (speed, syncs, memory)
    cpu_only = args.standalone and not args.device.startswith("cuda")
    dtypes = (args.dtypes or ("bfloat16" if cpu_only else "float32,bfloat16")).split(",")
    table = Table()
    if args.standalone:
        _default_layers(args)
        _standalone(args)
        if not args.no_train:
            args.drafter = [str(check_training(args, table)), *args.drafter]
    for d in dtypes:
        check_dtype(args, d, table)
    if not args.standalone:
        if args.llama3_shaped == "on" or (args.llama3_shaped == "auto" and args.device.startswith("cuda")):
            built = _experiment("llama3_shaped").build(tempfile.mkdtemp(prefix="llama3-"))
            shaped = argparse.Namespace(**{**vars(args), "verifier": str(built), "model_label": None})
            for d in dtypes:
                check_dtype(shaped, d, table)
        if not args.no_train:
            check_training(args, table)
    table.print()
    bad = sum(int(r.get("MISMATCH") or 0) for r in table.rows)
    print(f"\n{'FAILED' if bad else 'OK'}: {bad} mismatch(es) that are not near-ties or failed training run(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
