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

from common.verifiers import TIE_GAP
from decoding.timing import synchronize
from tests.accelerator import SyncCounter, caller

_train = importlib.util.spec_from_file_location("gpu_check_train",
                                                Path(__file__).with_name("gpu_check_train.py"))
train_mod = importlib.util.module_from_spec(_train)
_train.loader.exec_module(train_mod)
training_failure, free_verifiers = train_mod.training_failure, train_mod.free_verifiers

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
        print("row: " + " | ".join(f"{c}={row[c]}" for c in COLUMNS if row.get(c) not in (None, "")),
              flush=True)

    def print(self) -> None:
        cells = [[str(r.get(c, "")) for c in COLUMNS] for r in self.rows]
        width = [max(len(c), *(len(x[i]) for x in cells)) for i, c in enumerate(COLUMNS)]

        def line(xs):
            return "| " + " | ".join(x.ljust(w) for x, w in zip(xs, width)) + " |"

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


def _decoder_rows(args, model, props, eos, inputs, refs, gen_tps, dtype: str, model_name: str,
                  table: Table) -> None:
    """One row per strategy: exactness against ``generate``, tokens/s, tau, host round trips, memory."""
    from common.verifiers import compare_greedy
    from decoding.config import TreeConfig
    from decoding.engine import DecodeConfig, SpeculativeDecoder
    for spec in STRATEGIES:
        strat = spec.split("-")[0]
        dedup = spec.endswith("dedup")
        budget = spec.endswith("budget")
        n = 1 if strat == "single" else 2
        cfg = DecodeConfig(strategy=strat, max_new_tokens=args.max_new_tokens, merge_dedup=dedup,
                           merge_budget=budget,
                           tree=TreeConfig(4, 4, 16))
        dec = SpeculativeDecoder(model, props[:n], cfg, eos)
        # first-call costs (tuning, kernels) stay out of the time
        dec.generate(inputs[0][:8], seed_key="warm-up")
        counts = {"equal": 0, "near-tie": 0, "MISMATCH": 0}
        gaps = []
        toks = 0
        calls = 0
        new = 0
        _reset_peak(args.device)
        synchronize(args.device)
        t0 = time.perf_counter()
        outs = [dec.generate(ids, seed_key=str(i)) for i, ids in enumerate(inputs)]
        synchronize(args.device)
        wall = time.perf_counter() - t0
        peak = _peak(args.device)
        per_step = _per_step(args, dec, inputs, spec, dtype)
        tie_gap = args.tie_gap if args.tie_gap is not None else TIE_GAP[dtype]
        for ids, res, ref in zip(inputs, outs, refs):
            kind, gap = compare_greedy(model, ids, res.output_token_ids, ref, tie_gap)
            counts[kind] += 1
            toks += len(res.output_token_ids)
            calls += res.verifier_calls
            new += res.new_tokens
            if gap is not None:
                gaps.append(round(gap, 4))
        tps, tau = toks / wall, new / max(calls, 1)
        low = tau < args.min_tau
        note = "; ".join(filter(None, [f"gaps at ties {gaps}" if gaps else "",
                                       f"FAILED: tau {tau:.2f} < {args.min_tau:g}" if low else ""]))
        table.add(dict(model=model_name, dtype=dtype, check=spec, **counts, **{"tok/s": f"{tps:.1f}"},
                       **{"vs gen": f"{tps / gen_tps:.2f}x", "peak mem": peak}, **per_step,
                       tau=f"{tau:.2f}", fail=int(low), note=note))


def _per_step(args, dec, inputs, spec: str, dtype: str) -> dict:
    """Host round trips per decode step, counted on a separate (untimed) run; CUDA only."""
    if not args.device.startswith("cuda"):
        return {"syncs/step": "-", "h2d/step": "-", "cuda-sync/step": "-"}

    def run():
        res = [dec.generate(ids, seed_key=str(i)) for i, ids in enumerate(inputs)]
        return max(1, sum(r.verifier_calls for r in res))

    ours, cuda, sites, steps = _count_syncs(args.device, run)
    print(f"per step, by source line, {spec} ({dtype}): syncs {_sites(ours.where['sync'], steps)}; "
          f"h2d {_sites(ours.where['h2d'], steps)}; CUDA's {_sites(sites, steps)}", flush=True)
    return {"syncs/step": f"{ours.counts['sync'] / steps:.1f}",
            "h2d/step": f"{ours.counts['h2d'] / steps:.1f}",
            "cuda-sync/step": f"{cuda:.1f}"}


def check_dtype(args, dtype: str, table: Table) -> list[list[int]]:
    """The ``generate`` row and one row per strategy in one dtype; returns the prompts' ids. The
    verifier is freed at the end, so the next dtype's copy is the only one on the device."""
    from common.verifiers import eos_token_ids, resolve
    from decoding.bench import hf_generate
    from decoding.runner import load_proposers
    from decoding.verifiers import load_verifier
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
    table.add(dict(model=model_name, dtype=dtype, check="generate", **{"tok/s": f"{gen_tps:.1f}",
            "vs gen": "1.00x"},
                   **{"peak mem": _peak(args.device)},
                   note=f"{len(inputs)} prompts x {args.max_new_tokens} tokens"))
    _decoder_rows(args, model, props, eos, inputs, refs, gen_tps, dtype, model_name, table)
    del model, tok, props
    free_verifiers(args.device)
    return inputs


def _standalone(args) -> None:
    """Data and a Llama-3-shaped verifier built here: the check needs only the repository."""
    sd = _experiment("standalone_data")
    data = sd.write_data_root(tempfile.mkdtemp(prefix="gpu-check-data-"), n_train=args.train_examples + 16,
                              n_prompts=args.n_prompts)
    os.environ["TASKSPEC_DATA_ROOT"] = str(data)  # every loader, and the Ray workers started below, read it
    l3 = _experiment("llama3_shaped")
    shape = dict(l3.SHAPES[args.shape])
    if args.layers:
        shape["layers"] = args.layers
    t0 = time.perf_counter()
    out = Path(args.workdir
               or tempfile.mkdtemp(prefix="gpu-check-model-")) / f"{args.shape}-{shape['layers']}l"
    # the planted successor map is the data's bigram table: the verifier speaks the corpus the drafter trains
    # on
    path = l3.build(out, device=args.device, learnable=True, corpus_texts=sd.texts(data), **shape)
    args.verifier = str(path)
    args.model_label = f"{args.shape} ({shape['layers']} layers, hidden {shape['hidden']})"
    print(f"built {args.model_label}, random bf16 weights with the data's bigram table planted as a "
          "near-bigram "
          f"next token (experiments/llama3_shaped.py plant_bigram), at {path} in "
          f"{time.perf_counter() - t0:.0f}s; "
          f"data at {data}", flush=True)
    if args.device.startswith("cuda"):
        torch.cuda.empty_cache()  # the build's copy is gone: nothing of it stays on the device


def _default_layers(args) -> None:
    """Llama-3-8B's 32 layers where they fit (16 GB of bf16 weights; one copy at a time), else as many
    as fit in 80% of the device, said in the output."""
    if not (args.standalone and args.shape == "llama3-8b" and args.device.startswith("cuda")) or args.layers:
        return
    total = torch.cuda.get_device_properties(0).total_memory / 2**30
    per_layer, rest = 0.44, 2.2  # GiB in bf16: one 8B layer (218M parameters); embeddings + LM head (1.05B)
    fit = int((0.8 * total - rest) / per_layer)
    if fit < 32:
        args.layers = max(2, fit)
        print(f"note: {total:.0f} GiB on the device; Llama-3-8B's 32 layers need "
              f"~{32 * per_layer + rest:.0f} GiB; "
              f"building {args.layers} layers instead", flush=True)


def _packing_counts(args) -> list[int]:
    """The process counts whose verifier copies fit the device (CUDA: 90% of it, each copy its
    weight files plus 8% and 0.6 GiB of context and cache); the others are named and skipped."""
    if not args.device.startswith("cuda"):
        return args.packing
    copy = sum(f.stat().st_size for f in Path(args.verifier).glob("*.safetensors")) / 2**30
    total = torch.cuda.get_device_properties(0).total_memory / 2**30
    fits = int(0.9 * total / (1.08 * copy + 0.6))
    skipped = [k for k in args.packing if k > fits]
    if skipped:
        print(f"note: {total:.0f} GiB on the device holds {fits} verifier copies of {copy:.1f} GiB; "
              f"packing x{', x'.join(map(str, skipped))} skipped", flush=True)
    return [k for k in args.packing if k <= fits]


def _packing(args, dtype: str, inputs: list[list[int]], table: Table) -> None:
    """k processes on the one device; the rows and the rates file for the dry run's packing model."""
    pk = _experiment("gpu_check_packing")
    rows = pk.measure(args, args.drafter[0], dtype, inputs, _packing_counts(args), table)
    device = (torch.cuda.get_device_name() if args.device.startswith("cuda")
              else f"cpu ({os.cpu_count()} cores)")
    path = pk.write_rates(args.rates_out or Path(args.workdir or tempfile.mkdtemp()) / "gpu_rates.json",
                          device, args.model_label or args.verifier, dtype, rows)
    print(f"packing rates written to {path} (python experiments/full_grid.py --dry-run --rates {path})",
          flush=True)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--verifier", default="smollm2-135m-instruct")
    ap.add_argument("--drafter", action="append", default=[], help="drafter checkpoint (repeat for two)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtypes", default=None,
                    help="comma-separated (default: float32,bfloat16; standalone: bfloat16)")
    ap.add_argument("--n-prompts", type=int, default=4, help="per benchmark (gsm8k, mt_bench)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--tie-gap", type=float, default=None,
                    help=f"top-2 logit gap that counts as a near-tie (default per dtype: {TIE_GAP})")
    ap.add_argument("--trainer", choices=train_mod.TRAINERS, default="ray",
                    help="ray: Ray Train + DeepSpeed ZeRO-1 (the grid's path); torch: in this process, plain "
                         "AdamW, nothing but torch and transformers")
    ap.add_argument("--no-train", dest="trainer", action="store_const", const="torch",
                    help="no Ray Train or DeepSpeed: the same as --trainer torch")
    ap.add_argument("--skip-training", action="store_true",
                    help="decode with the given (or random) drafters only")
    ap.add_argument("--min-top1", type=float, default=0.5,
                    help="held-out top-1 at depth 1 the trained drafter must reach "
                         "(the check fails below it)")
    ap.add_argument("--min-tau", type=float, default=None,
                    help="tau every strategy must reach (default: 2.0 with a trained drafter on the planted "
                         "verifier, i.e. drafts accepted and the commit path run; else 0)")
    ap.add_argument("--packing", default=None,
                    help="comma-separated process counts decoding at once on the device (default with "
                         "--standalone: 1,2,4; 'none' skips)")
    ap.add_argument("--rates-out", default=None, help="packing rates file (default: WORKDIR/gpu_rates.json)")
    ap.add_argument("--standalone", action="store_true",
                    help="build the verifier (Llama-3-shaped, random with a planted near-bigram next token) "
                         "and "
                         "the data here: nothing from outside the repository; the trained drafters decode")
    ap.add_argument("--shape", choices=("llama3-8b", "small"), default="llama3-8b")
    ap.add_argument("--layers", type=int, default=None, help="fewer layers than the shape's (memory)")
    ap.add_argument("--workdir", default=None,
                    help="where the standalone model is written (default: a temp dir)")
    ap.add_argument("--train-examples", type=int, default=256)
    ap.add_argument("--train-batch", type=int, default=2)
    ap.add_argument("--train-steps", type=int, default=256,
                    help="optimizer steps, rounded up to whole epochs (two at least)")
    ap.add_argument("--train-lr", type=float, default=1e-3,
                    help="peak learning rate (linear warm-up over the first eighth of the steps, then decay)")
    ap.add_argument("--llama3-shaped", choices=("auto", "on", "off"), default="auto",
                    help="without --standalone: also run the exactness/speed rows on a small random model of "
                         "Llama-3's layout (GQA, 128k vocabulary), built locally; auto = on CUDA")
    return ap


def _settle(args) -> None:
    """Defaults that depend on the other arguments."""
    args.model_label = None
    trained = args.standalone and not args.skip_training
    if args.min_tau is None:
        args.min_tau = 2.0 if trained else 0.0
    text = args.packing or ("1,2,4" if trained else "none")
    args.packing = [] if text == "none" else [int(k) for k in text.split(",")]


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    _settle(args)
    import transformers

    from decoding.compat import TRANSFORMERS, check_transformers

    check_transformers()
    print(f"versions: torch {torch.__version__}, transformers {transformers.__version__} (the decode path "
          f"supports >={TRANSFORMERS[0]},<{TRANSFORMERS[1]})", flush=True)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("error: no CUDA device; `--device cpu` runs the same checks on the CPU", file=sys.stderr)
        return 2
    if args.device.startswith("cuda"):
        print(f"device: {torch.cuda.get_device_name()} "
              f"({torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} "
              f"GiB), torch {torch.__version__}", flush=True)
    # standalone on a GPU: float32 first (exactness at the tightest tie gap), then bfloat16 (speed, syncs,
    # memory)
    cpu_only = args.standalone and not args.device.startswith("cuda")
    dtypes = (args.dtypes or ("bfloat16" if cpu_only else "float32,bfloat16")).split(",")
    table = Table()
    if args.standalone:
        _default_layers(args)
        _standalone(args)
        if not args.skip_training:
            args.drafter = [str(p) for p in train_mod.check_training(args, table, lambda: _peak(args.device))]
    inputs = None
    for d in dtypes:
        _reset_peak(args.device)
        inputs = check_dtype(args, d, table)
    if args.packing and args.drafter:
        _packing(args, dtypes[-1], inputs, table)
    if not args.standalone:
        if args.llama3_shaped == "on" or (args.llama3_shaped == "auto" and args.device.startswith("cuda")):
            built = _experiment("llama3_shaped").build(tempfile.mkdtemp(prefix="llama3-"))
            shaped = argparse.Namespace(**{**vars(args), "verifier": str(built), "model_label": None,
                                           "min_tau": 0.0})
            for d in dtypes:
                check_dtype(shaped, d, table)
        if not args.skip_training:
            train_mod.check_training(args, table, lambda: _peak(args.device))
    table.print()
    bad = sum(int(r.get("MISMATCH") or 0) + int(r.get("fail") or 0) for r in table.rows)
    print(f"\n{'FAILED' if bad else 'OK'}: {bad} mismatch(es) that are not near-ties, strategies below tau "
          f"{args.min_tau:g}, or failed training run(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
