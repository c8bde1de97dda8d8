"""Benchmark: eagle2 vs hass vs eagle3 math drafters trained on the same examples, then decoded.

Issue #40 item 6. python experiments/bench_backbones.py [--n 500] [--max-length 256] [--epochs 2]
    [--eagle3-epochs E] [--equal-cpu] [--benchmarks gsm8k,mt_bench] [--n-prompts 10] [--max-new-tokens 64]
    [--tree auto] [--out JSON]

1. One EAGLE-3 feature cache of the math corpus (the aux layers plus what an EAGLE-2 cache holds):
   the eagle2 and hass runs read its LM-head features, so all three backbones see the same training
   and held-out examples, batches and draft vocabulary.
2. Each backbone trains in this process (drafters.train.loop.train: plain AdamW, fp32, no DeepSpeed):
   process CPU seconds and wall of the whole call (held-out evaluation included), the trainer's own
   loss tokens/s (epochs' wall, evaluation excluded) and its held-out top-1 agreement at depths 1-3
   after the last epoch. ``--equal-cpu`` trains eagle3 first, times one epoch of eagle2 and of hass
   (a probe) and gives them the epoch count whose CPU time comes nearest eagle3's.
3. One decoding run: transformers' ``generate`` gives the reference outputs; each drafter decodes
   the first ``--n-prompts`` prompts of every benchmark (first turn) with the fixed tree and
   (``--tree auto``) the tree fitted on held-out prompts of the same benchmarks, each row paired with
   ``generate`` runs on the same prompts (decoding/bench.py ``time_row``): tau, speed against
   ``generate`` and, at T=0, outputs equal to ``generate``'s.

Prints markdown tables and writes the result as JSON (atomically, after each stage).
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from common.atomic import write_text_atomic
from common.verifiers import TIE_GAP, compare_greedy, eos_token_ids, resolve
from decoding.args import add_decode_args, decode_config
from decoding.autotree import auto_tree, calibration_inputs
from decoding.bench import summarise, time_row
from decoding.cpu.machine import machine_class
from decoding.engine import SpeculativeDecoder
from decoding.runner import default_threads, generate_baseline, load_proposers
from decoding.verifiers import load_verifier
from drafters.config import BACKBONES
from drafters.data.sources import BENCHMARKS, load_benchmark
from drafters.data.templating import benchmark_prompt_ids
from drafters.eagle3 import default_aux_layers
from drafters.train.config import TrainConfig
from drafters.train.loop import train
from drafters.variants import DataSpec, ensure_features, heldout_data, select_examples, variant_data
from drafters.vocab import count_targets, save_vocab, select_ids

ROOT = Path(__file__).resolve().parents[1]

ORDER = ("eagle2", "hass", "eagle3")  # table order
CORPUS = "mathinstruct"


@dataclass(frozen=True)
class BenchSpec:
    """What one invocation trains and decodes; refused before any work when it cannot run."""

    data: DataSpec
    epochs: dict  # backbone -> epochs (those of --equal-cpu's backbones are set after the probe)
    batch_size: int = 8
    lr: float = 2e-3
    warmup_steps: int = 0
    vocab: int = 8192
    benchmarks: tuple = ("gsm8k", "mt_bench")
    n_prompts: int = 2
    repeats: int = 1
    equal_cpu: bool = False

    def __post_init__(self):
        for b, e in self.epochs.items():
            if b not in BACKBONES:
                raise ValueError(f"unknown backbone {b!r}; known: {', '.join(BACKBONES)}")
            if e < 1:
                raise ValueError(f"{b} epochs must be >= 1, got {e}")
        if not self.epochs:
            raise ValueError("no backbone to train")
        if min(self.batch_size, self.n_prompts, self.repeats) < 1 or self.vocab < 2:
            raise ValueError(f"batch size, n-prompts and repeats must be >= 1 and vocab >= 2, got "
                             f"{self.batch_size}, {self.n_prompts}, {self.repeats}, {self.vocab}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        bad = [b for b in self.benchmarks if b not in BENCHMARKS]
        if bad or not self.benchmarks:
            raise ValueError(f"unknown benchmark {', '.join(bad) or '(none given)'}; "
                             f"known: {', '.join(BENCHMARKS)}")
        if self.equal_cpu and "eagle3" not in self.epochs:
            raise ValueError("--equal-cpu matches the other backbones' CPU time to eagle3's: "
                             "add eagle3 to --backbones")


def log(msg: str) -> None:
    print(f"[bench_backbones {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---- training (also used by experiments/bench_eagle3_training.py) ----

def prepare(model, tok, eos, verifier: str, spec: DataSpec, vocab_size: int, work: Path, progress=None):
    """The math corpus's EAGLE-3 feature cache under ``work`` and a draft vocabulary of its training
    targets: (caches for drafters.variants.variant_data / heldout_data, vocabulary file)."""
    aux = default_aux_layers(model.config.num_hidden_layers)
    caches = {CORPUS: ensure_features(model, tok, eos, verifier, CORPUS, spec, str(work), aux_layers=aux,
                                      progress=progress)}
    train_exs, _ = select_examples(tok, eos, CORPUS, spec)
    ids = select_ids(count_targets(train_exs, model.config.vocab_size), vocab_size, eos)
    return caches, save_vocab(ids, work / "vocab")


def train_config(backbone: str, epochs: int, out: Path, work: Path, caches: dict, vocab, n: int,
                 verifier: str, **kw) -> TrainConfig:
    """The TrainConfig of one math drafter on the shared cache (plain AdamW, no DeepSpeed)."""
    return TrainConfig(verifier=verifier, backbone=backbone, variant="math", out_dir=str(out),
                       draft_vocab=str(vocab), train_data=variant_data("math", str(work), caches, n),
                       heldout_data=heldout_data(str(work), caches), epochs=epochs, deepspeed=False, **kw)


def train_one(cfg, model, progress=None) -> dict:
    """Train ``cfg`` in this process: CPU and wall of the call, the trainer's tokens/s and held-out top-1."""
    def report(metrics, _d):
        if progress:
            progress(metrics)

    c0, w0 = time.process_time(), time.perf_counter()
    final = train(cfg, model, report=report)
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    hist = json.loads((final / "config.json").read_text())["training"]["history"]
    epochs = hist[1:]  # hist[0]: the untrained drafter's held-out agreement
    toks = sum(h["train_tokens_per_s"] * h["epoch_seconds"] for h in epochs)
    secs = sum(h["epoch_seconds"] for h in epochs)
    return {"epochs": cfg.epochs, "steps": sum(h["steps"] for h in epochs), "loss_tokens": round(toks),
            "train_seconds": secs, "train_tokens_per_s": toks / secs if secs else 0.0, "process_cpu_s": cpu,
            "wall_s": wall, "checkpoint": str(final),
            "heldout_top1": {f"depth{j}": epochs[-1].get(f"top1_depth{j}") for j in (1, 2, 3)},
            "heldout_top1_untrained": {f"depth{j}": hist[0].get(f"top1_depth{j}") for j in (1, 2, 3)}}


def equal_cpu_epochs(probe_cpu: float, target_cpu: float) -> int:
    """Epochs whose CPU time (one epoch's, from a probe) comes nearest ``target_cpu``."""
    return max(1, round(target_cpu / probe_cpu))


# ---- decoding ----

def benchmark_inputs(tok, spec: BenchSpec) -> dict:
    """Benchmark -> [(prompt id, first-turn token ids)] of its first ``spec.n_prompts`` prompts."""
    inputs = {}
    for b in spec.benchmarks:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            prompts = load_benchmark(b)[0][: spec.n_prompts]
        inputs[b] = [(p.id, benchmark_prompt_ids(tok, p, 0, [])) for p in prompts]
    return inputs


@dataclass
class Rows:
    """Times a decoder on every benchmark, paired with ``generate`` (decoding/bench.py
    ``time_row``), and logs the progress over ``total`` rows."""

    spec: BenchSpec
    inputs: dict  # benchmark_inputs
    run_gen: object  # ids -> (generate's tokens, seconds)
    refs: dict | None  # T=0: generate's outputs, for the ``same`` count
    classify: object  # (ids, got, ref) -> "near-tie" | "MISMATCH"
    total: int
    done: int = 0

    def __call__(self, key: str, dec, shape_text: str) -> dict:
        per = {}
        for b in self.spec.benchmarks:
            runs = [time_row(lambda pid, ids: dec, self.inputs[b], self.run_gen, self.refs, self.classify)
                    for _ in range(self.spec.repeats)]
            t, lo, hi = summarise(runs)  # the run with the median ratio
            self.done += 1
            per[b] = {"tree": shape_text, "tau": t.tau, "tok_s": t.toks / t.wall,
                      "gen_tok_s": t.gen_toks / t.gen_wall, "vs_generate": t.ratio,
                      "vs_generate_range": [lo, hi], "prompts": t.prompts, "tokens": t.toks,
                      "same": t.same if t.checked else None, "near_ties": t.ties, "mismatches": t.mismatches}
            log(f"decode {self.done}/{self.total}: {key} on {b}: tau {t.tau:.2f}, {t.ratio:.2f}x generate"
                + (f", {t.same}/{t.prompts} equal to generate" if t.checked else ""))
        return per


def reference_rows(model, eos, base, spec: BenchSpec, inputs: dict, total: int) -> Rows:
    """Warm ``generate`` up and record its reference outputs: the :class:`Rows` every decoder is
    timed with."""
    T = base.temperature
    run_gen = generate_baseline(model, eos, base.max_new_tokens, T, base.seed)
    run_gen(next(iter(inputs.values()))[0][1][:8])  # warm-up
    all_inputs = [x for xs in inputs.values() for x in xs]
    log(f"decode: generate's reference outputs, {len(all_inputs)} prompts")
    refs = {pid: run_gen(ids)[0] for pid, ids in all_inputs}
    gap = TIE_GAP[str(model.dtype).removeprefix("torch.")]

    def classify(ids, got, ref):
        return compare_greedy(model, ids, got, ref, gap)[0]

    return Rows(spec, inputs, run_gen, refs if T == 0 else None, classify, total)


def decode_all(model, tok, eos, verifier: str, ckpts: dict, spec: BenchSpec, base, tree_mode: str,
               result: dict, save) -> None:
    """Every drafter on every benchmark's prompts, fixed tree and (auto) fitted tree, each row paired
    with ``generate`` (decoding/bench.py); fills ``result['decoding']``."""
    default_threads()
    inputs = benchmark_inputs(tok, spec)
    n_shapes = 2 if tree_mode == "auto" else 1
    rows = reference_rows(model, eos, base, spec, inputs, (1 + n_shapes * len(ckpts)) * len(spec.benchmarks))
    dec_out = result.setdefault("decoding", {})
    own = SpeculativeDecoder(model, [], dataclasses.replace(base, strategy="autoregressive"), eos)
    dec_out["autoregressive"] = rows("autoregressive", own, "-")
    save()
    cal = calibration_inputs(tok, max(1, 2 // len(spec.benchmarks)), spec.benchmarks,
                             exclude={pid for xs in inputs.values() for pid,
                                      _ in xs}) if tree_mode == "auto" else None
    for backbone in ORDER:
        if backbone not in ckpts:
            continue
        proposers = load_proposers(model, [ckpts[backbone]], verifier)
        cfg = dataclasses.replace(base, strategy="single")
        shapes = [("fixed", cfg.tree, "")]
        if tree_mode == "auto":
            log(f"decode: tree auto for {backbone} (calibration on {len(cal)} held-out prompts)")
            choice = auto_tree(model, proposers, "single", eos, cal)
            shapes.append(("auto", choice.tree, choice.describe()))
        dec_out[backbone] = {}
        for kind, shape, why in shapes:
            dec = SpeculativeDecoder(model, proposers, dataclasses.replace(cfg, tree=shape), eos)
            text = f"{shape.top_k}/{shape.depth}/{shape.total_tokens}"
            per = rows(f"{backbone} {kind} {text}", dec, text)
            dec_out[backbone][kind] = {"tree": text, "choice": why, "benchmarks": per}
            save()


# ---- report ----

def targets(result: dict) -> dict:
    """Issue #40's decoding targets, where the run has what they need (GSM8K, eagle2 and eagle3)."""
    d, out = result.get("decoding", {}), {}
    for kind in ("fixed", "auto"):
        try:
            e3, e2 = d["eagle3"][kind]["benchmarks"]["gsm8k"], d["eagle2"][kind]["benchmarks"]["gsm8k"]
        except KeyError:
            continue
        out[f"gsm8k_tau_eagle3_over_eagle2_{kind}"] = {"value": e3["tau"] / e2["tau"], "target": 1.2,
                                                       "met": e3["tau"] / e2["tau"] >= 1.2}
    try:
        e3 = d["eagle3"]["auto"]["benchmarks"]["gsm8k"]
        out["gsm8k_eagle3_auto_vs_generate"] = {"value": e3["vs_generate"], "target": 2.0,
                                                "met": e3["vs_generate"] >= 2.0}
    except KeyError:
        pass
    return out


def markdown(result: dict) -> str:
    f3 = lambda v: "-" if v is None or v != v else f"{v:.3f}"  # noqa: E731 (a one-line cell formatter)
    lines = ["| backbone | epochs | loss tokens | train tokens/s | train wall (s) | process CPU (s) | "
             "held-out top-1 d1 / d2 / d3 |", "|---|---|---|---|---|---|---|"]
    for b in ORDER:
        t = result.get("training", {}).get(b)
        if t:
            h = t["heldout_top1"]
            lines.append(f"| {b} | {t['epochs']} | {t['loss_tokens']} | {t['train_tokens_per_s']:.1f} | "
                         f"{t['train_seconds']:.1f} | {t['process_cpu_s']:.1f} | "
                         f"{f3(h['depth1'])} / {f3(h['depth2'])} / {f3(h['depth3'])} |")
    d = result.get("decoding", {})
    if d:
        lines += ["", "| drafter | tree | benchmark | tau | tok/s | vs generate | same as generate |",
                  "|---|---|---|---|---|---|---|"]

        def row(name, tree, b, r):
            same = "-"
            if r["same"] is not None:
                same = (f"{r['same']}/{r['prompts']}"
                        + (f" +{r['near_ties']} near-tie" if r["near_ties"] else "")
                        + (f", {r['mismatches']} MISMATCH" if r["mismatches"] else ""))
            lines.append(f"| {name} | {tree} | {b} | {r['tau']:.2f} | {r['tok_s']:.1f} | "
                         f"{r['vs_generate']:.2f}x | {same} |")

        for b, r in d.get("autoregressive", {}).items():
            row("own loop", "-", b, r)
        for name in ORDER:
            for kind, k in d.get(name, {}).items():
                for b, r in k["benchmarks"].items():
                    row(name, f"{kind} {k['tree']}", b, r)
    goals = targets(result)
    lines += [""] if goals else []
    for k, v in goals.items():
        verdict = "met" if v["met"] else "NOT met"
        lines.append(f"- target {k}: {v['value']:.2f} (at least {v['target']}): {verdict}")
    return "\n".join(lines)


def commit() -> str:
    r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                           capture_output=True, text=True).stdout.strip()
    return r.stdout.strip() + (" (uncommitted changes)" if dirty else "")


# ---- the command ----

def parse(argv=None) -> tuple[argparse.Namespace, BenchSpec]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_decode_args(ap)  # --verifier, --dtype, --max-new-tokens, --temperature, --seed, fixed tree, --tree
    ap.set_defaults(max_new_tokens=64, tree_mode="auto")
    ap.add_argument("--backbones", default=",".join(ORDER), help="comma list to train and decode")
    ap.add_argument("--n", type=int, default=64, help="training examples (math corpus)")
    ap.add_argument("--heldout", type=int, default=16, help="held-out examples for top-1 agreement")
    ap.add_argument("--max-length", type=int, default=192)
    ap.add_argument("--epochs", type=int, default=2, help="every backbone's, unless --<backbone>-epochs")
    for b in ORDER:
        ap.add_argument(f"--{b}-epochs", type=int, default=None, help=f"epochs of {b} (default --epochs)")
    ap.add_argument("--equal-cpu", action="store_true",
                    help="eagle2/hass epochs from a one-epoch probe, to match eagle3's training CPU time")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup-steps", type=int, default=0)
    ap.add_argument("--vocab", type=int, default=8192, help="draft vocabulary (shared by all backbones)")
    ap.add_argument("--benchmarks", default="gsm8k,mt_bench", help="comma list; first turn of each prompt")
    ap.add_argument("--n-prompts", type=int, default=2, help="prompts per benchmark")
    ap.add_argument("--repeats", type=int, default=1, help="time every row this many times (median ratio)")
    ap.add_argument("--work", default=None, help="feature cache and checkpoints (default: a temp dir)")
    ap.add_argument("--out", default="runs/bench_backbones.json", help="the JSON result")
    args = ap.parse_args(argv)
    try:
        if args.drafter:
            raise ValueError("--drafter: this bench trains its own drafters")
        if args.strategy != "single":
            raise ValueError(f"--strategy: each drafter decodes alone (single), got {args.strategy!r}")
        if args.max_new_tokens < 1:
            raise ValueError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
        backbones = [b.strip() for b in args.backbones.split(",") if b.strip()]
        own = {b: getattr(args, f"{b}_epochs", None) for b in backbones}
        epochs = {b: args.epochs if e is None else e for b, e in own.items()}
        if args.equal_cpu:
            given = [b for b in backbones if b != "eagle3" and own[b] is not None]
            if given:
                raise ValueError(f"--equal-cpu sets the epochs of {', '.join(given)}: "
                                 f"drop --{given[0]}-epochs")
        if args.n < 1:
            raise ValueError(f"--n must be >= 1, got {args.n}")
        if args.heldout < 1:  # (before DataSpec, whose refusal would not name the flag)
            raise ValueError(f"--heldout must be >= 1, got {args.heldout}")
        data = DataSpec(n=args.n, heldout=args.heldout, max_length=args.max_length)
        spec = BenchSpec(data=data, epochs=epochs, batch_size=args.batch_size, lr=args.lr,
                         warmup_steps=args.warmup_steps, vocab=args.vocab,
                         benchmarks=tuple(b.strip() for b in args.benchmarks.split(",") if b.strip()),
                         n_prompts=args.n_prompts, repeats=args.repeats, equal_cpu=args.equal_cpu)
        decode_config(args)  # the decode flags' own checks
    except ValueError as e:
        raise SystemExit(f"bench_backbones: {e}") from None
    return args, spec


def main(argv=None) -> int:
    args, spec = parse(argv)
    base = decode_config(args)
    out = Path(args.out)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="bench-backbones-"))
    verifier = resolve(args.verifier).name
    command = "python experiments/bench_backbones.py " + " ".join(sys.argv[1:] if argv is None else argv)
    config = {"verifier": verifier, "dtype": args.dtype, **dataclasses.asdict(spec),
              "max_new_tokens": base.max_new_tokens, "temperature": base.temperature,
              "fixed_tree": list(dataclasses.astuple(base.tree)), "tree": args.tree_mode}
    result = {"date": datetime.date.today().isoformat(), "commit": commit(), "machine": machine_class(),
              "command": command, "config": config, "training": {}}

    def save():
        write_text_atomic(out, json.dumps(result, indent=1))

    warnings.simplefilter("ignore")
    log(f"stage 1/3: load {verifier}, the EAGLE-3 feature cache of {spec.data.n}+{spec.data.heldout} math "
        f"examples under {work}")
    model, tok = load_verifier(args.verifier, dtype=args.dtype)
    eos = eos_token_ids(model, tok)
    caches, vocab = prepare(model, tok, eos, verifier, spec.data, spec.vocab, work,
                            progress=lambda what, done, total: log(f"{what}: {done}/{total} examples"))
    result["config"]["torch_threads"] = torch.get_num_threads()
    epochs = dict(spec.epochs)
    kw = {"batch_size": spec.batch_size, "lr": spec.lr, "warmup_steps": spec.warmup_steps}

    def run(backbone, n_epochs, tag):
        out = work / f"{backbone}-math{tag}"
        # a fresh run (the trainer would resume a finished one in --work)
        shutil.rmtree(out, ignore_errors=True)
        cfg = train_config(backbone, n_epochs, out, work, caches, vocab, spec.data.n, verifier, **kw)
        return train_one(cfg, model, progress=lambda m: log(
            f"train {backbone}{tag}: epoch {m['epoch']}/{n_epochs}, {m['train_tokens_per_s']:.1f} tokens/s, "
            f"held-out top-1 d1 {m.get('top1_depth1', float('nan')):.3f}"))

    order = sorted(epochs, key=lambda b: b != "eagle3")  # eagle3 first: --equal-cpu matches it
    for i, b in enumerate(order, 1):
        log(f"stage 2/3: train {b} ({i}/{len(order)})")
        if spec.equal_cpu and b != "eagle3":
            probe = run(b, 1, "-probe")
            target = result["training"]["eagle3"]["process_cpu_s"]
            epochs[b] = equal_cpu_epochs(probe["process_cpu_s"], target)
            log(f"equal CPU: {b}'s one-epoch probe took {probe['process_cpu_s']:.1f} s of CPU, eagle3 "
                f"{target:.1f} s -> {epochs[b]} epochs")
        result["training"][b] = run(b, epochs[b], "")
        save()
    log("stage 3/3: decode")
    ckpts = {b: t["checkpoint"] for b, t in result["training"].items()}
    decode_all(model, tok, eos, verifier, ckpts, spec, base, args.tree_mode, result, save)
    result["targets"] = targets(result)
    save()
    print(markdown(result))
    log(f"result: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
