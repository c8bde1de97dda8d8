"""The paper plan's GPU rates, measured on one GPU in one short run, written as the rates file that
``python experiments/full_grid.py --profile paper --dry-run --rates FILE`` reads (features, training
and evaluation alike; orchestrator/plan/rates/gpu.py).

    bash experiments/gpu_rates.sh                 # one CUDA GPU: the full Llama-3-8B shape (installs first)
    bash experiments/gpu_rates.sh --dry           # the same code on the CPU at a tiny shape (the suite's)

The verifier is built once, here, with Llama-3-8B-Instruct's shape (32 layers, hidden 4096, GQA 32/8,
128,256-token vocabulary) in bf16, random with a planted near-bigram next token
(experiments/llama3_shaped.py): the shape is what costs. Every part reuses it; where memory runs short
the eval part drops process counts, never layers. The parts, in the order that settles the plan's
largest unknowns first, each with its own time budget (``--budgets``; a part stops starting rows once
its budget is spent, and names what it skipped):

  (c) eval: batch-1 speculative decoding with the paper profile's tree at 1, 2 and 4 processes on the
      device (step time, device time fitted from the slowdown, peak memory per process) and
      transformers' ``generate`` per token;
  (b) train: optimizer steps of EAGLE-2, HASS and EAGLE-3 through the project's DeepSpeed runner on one
      rank (ZeRO as the paper profile sets it; one rank shards nothing), micro-batch 1 x 350 and
      1 x 900 tokens with the paper profile's vocabulary: ms per step and peak memory beside
      orchestrator/plan/sizing.py's estimate;
  (a) features: the project's extraction code at 1,024-token batches, with and without EAGLE-3's aux
      layers (and asynchronous host copies where the code has them): tokens/s and bytes written/s.

Each row is printed as soon as it is measured and the file is rewritten (temp file, rename) after
each part, so a run cut short still leaves numbers. The planted verifier's acceptance (tau) is not
Llama-3's: the file carries step times only and the dry run keeps tau as an assumption.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RATES_KIND = "gpu-rates"
PARTS = ("eval", "train", "features")  # (c), (b), (a)
# seconds per part on one H100 (the loan is ~15 min of device time, start-up included; the whole
# script, its installs and the verifier's build included, must stay under 8 minutes)
BUDGETS = {"eval": 150.0, "train": 100.0, "features": 45.0}


def _experiment(name: str):
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def emit(part: str, text: str) -> None:
    print(f"rate: {part}: {text}", flush=True)


class Context:
    """What every part reads: the arguments, the built verifier (its path, shape and constants), the
    paper profile's settings, the prompts and a random drafter for the eval part."""

    def __init__(self, args):
        from orchestrator.plan.sizing import load_profile

        self.args = args
        self.device = args.device
        self.dtype = "bfloat16"
        self.workdir = args.workdir or tempfile.mkdtemp(prefix="gpu-rates-")
        self.profile = load_profile(args.profile)
        t = self.profile.eval.tree
        self.tree = tuple(args.tree or (t.top_k, t.depth, t.total_tokens))
        self.experiment = _experiment
        cpu = platform.processor() or platform.machine()
        self.device_name = (torch.cuda.get_device_name() if self.device.startswith("cuda")
                            else f"cpu ({cpu}, {os.cpu_count()} cores)")

    def build(self) -> float:
        """The verifier, its data, prompts and a random HASS drafter; returns the seconds it took."""
        t0 = time.perf_counter()
        sd, l3 = _experiment("standalone_data"), _experiment("llama3_shaped")
        data = sd.write_data_root(Path(self.workdir) / "data", n_train=16, n_prompts=self.args.n_prompts)
        os.environ["TASKSPEC_DATA_ROOT"] = str(data)  # the packing workers read the prompts' loaders too
        self.shape = dict(l3.SHAPES[self.args.shape])
        path = Path(self.workdir) / f"{self.args.shape}-{self.shape['layers']}l"
        self.verifier = str(l3.build(path, device=self.device, learnable=True, corpus_texts=sd.texts(data),
                                     **self.shape))
        if self.device.startswith("cuda"):
            torch.cuda.empty_cache()
        self.prompt_ids = self._prompts()
        self.drafter = self._random_drafter()
        return time.perf_counter() - t0

    def _prompts(self) -> list[list[int]]:
        from transformers import AutoTokenizer

        from drafters.data.sources import load_benchmark
        from drafters.data.templating import benchmark_prompt_ids

        tok = AutoTokenizer.from_pretrained(self.verifier)
        prompts = [p for b in ("gsm8k", "mt_bench") for p in load_benchmark(b)[0][: self.args.n_prompts]]
        return [benchmark_prompt_ids(tok, p, 0, []) for p in prompts]

    def _random_drafter(self) -> str:
        from types import SimpleNamespace

        from transformers import AutoConfig

        from common.verifiers import resolve
        from drafters.checkpoint import init_drafter, save_checkpoint
        from drafters.config import DrafterConfig

        # the verifier's config alone: no copy of its weights stays in this process while the eval
        # part's processes each load one
        shape = SimpleNamespace(config=AutoConfig.from_pretrained(self.verifier))
        cfg = DrafterConfig.for_verifier(shape, resolve(self.verifier).name, "hass", seed=0)
        return str(save_checkpoint(init_drafter(cfg), Path(self.workdir) / "drafter"))

    def load_plain_verifier(self):
        """The verifier as training and extraction load it (one copy per process: common's cache)."""
        from common.verifiers import load_from_registry

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model, _ = load_from_registry(self.verifier, dtype=self.dtype, device=self.device)
        return model

    @property
    def shape_constants(self) -> dict:
        """The built verifier's sizes in orchestrator/plan/costs.py's form (what sizing estimates from)."""
        m = self.load_plain_verifier()
        c = m.config
        return {"params": sum(p.numel() for p in m.parameters()), "hidden": c.hidden_size,
                "vocab": c.vocab_size, "heads": c.num_attention_heads, "kv_heads": c.num_key_value_heads,
                "intermediate": c.intermediate_size, "layers": c.num_hidden_layers}

    def vocab_file(self, size: int | None) -> str | None:
        """A draft vocabulary of ``size`` ids (the profile's; None: the whole vocabulary)."""
        if not size:
            return None
        from drafters.vocab import save_vocab

        return str(save_vocab(torch.arange(size), Path(self.workdir) / f"vocab-{size}.safetensors"))


def _commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                             text=True, timeout=10)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def header(ctx: Context) -> dict:
    """Where and with what the rates were measured."""
    full = ctx.args.shape == "llama3-8b"
    return {
        "kind": RATES_KIND, "format": 1, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": _commit(), "device": ctx.device_name,
        "device_memory_gib": (torch.cuda.get_device_properties(0).total_memory / 2**30
                              if ctx.device.startswith("cuda") else None),
        "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
        "shape": ctx.args.shape, "verifier_dtype": ctx.dtype,
        "stands_for": ctx.args.stands_for or ("llama3-8b-instruct" if full else None),
        "full_shape": full, "profile": ctx.profile.name,
        "verifier": "random weights with Llama-3-8B-Instruct's layout and a planted near-bigram next token "
                    "(experiments/llama3_shaped.py): step times only; its tau is not Llama-3's",
        "budgets_s": {}, "seconds": {}, "parts": {},
    }


def write(path: Path, body: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(body, indent=1, sort_keys=True) + "\n")
    tmp.replace(path)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--shape", choices=("llama3-8b", "small"), default="llama3-8b")
    ap.add_argument("--profile", default="paper", help="whose tree, ZeRO stage, precision and vocabulary")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, in order (default {PARTS})")
    ap.add_argument("--budgets", default=None,
                    help="seconds per part, e.g. eval=150,train=100 (defaults: " +
                         ", ".join(f"{k} {v:g}" for k, v in BUDGETS.items()) + ")")
    ap.add_argument("--out", default=None, help="the rates file (default: WORKDIR/gpu-rates.json)")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--stands-for", default=None,
                    help="the profile verifier these rates stand for (default: llama3-8b-instruct at the "
                         "full shape)")
    ap.add_argument("--tree", type=int, nargs=3, default=None,
                    help="top_k depth total_tokens (default: the profile's)")
    ap.add_argument("--n-prompts", type=int, default=1, help="per benchmark (gsm8k, mt_bench)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--packing", default="1,2,4")
    ap.add_argument("--batches", default="2,4",
                    help="prompts verified at once in one process (decoding/batch.py), after batch 1")
    ap.add_argument("--backbones", default="eagle2,hass,eagle3")
    ap.add_argument("--train-tokens", default="350,900", help="micro-batch lengths (MathInstruct, ShareGPT)")
    ap.add_argument("--train-steps", type=int, default=8,
                    help="timed steps per row (after two warm-up steps)")
    ap.add_argument("--feature-examples", type=int, default=96)
    return ap


def _settle(args) -> None:
    args.parts = [p for p in args.parts.split(",") if p]
    bad = [p for p in args.parts if p not in PARTS]
    if bad:
        raise SystemExit(f"error: --parts {bad}: each must be one of {list(PARTS)}")
    args.budget = dict(BUDGETS)
    for kv in filter(None, (args.budgets or "").split(",")):
        k, _, v = kv.partition("=")
        if k not in BUDGETS or not v.replace(".", "", 1).isdigit():
            raise SystemExit(f"error: --budgets {kv!r}: need PART=SECONDS with PART one of {list(BUDGETS)}")
        args.budget[k] = float(v)
    args.packing = [int(k) for k in args.packing.split(",")]
    args.backbones = args.backbones.split(",")
    args.train_tokens = [int(t) for t in args.train_tokens.split(",")]


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    _settle(args)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("error: no CUDA device; --device cpu --shape small runs the same code on the CPU",
              file=sys.stderr)
        return 2
    gp = _experiment("gpu_rates_parts")
    ctx = Context(args)
    out = Path(args.out or Path(ctx.workdir) / "gpu-rates.json")
    body = header(ctx)
    print(f"gpu rates: {ctx.device_name}, torch {torch.__version__}, CUDA {torch.version.cuda}; parts "
          f"{', '.join(f'{p} ({args.budget[p]:g} s)' for p in args.parts)}; file {out}", flush=True)
    body["seconds"]["build"] = ctx.build()
    emit("build", f"{args.shape} ({ctx.shape['layers']} layers, hidden {ctx.shape['hidden']}) built in "
                  f"{body['seconds']['build']:.0f} s at {ctx.verifier}")
    run = {"eval": gp.eval_part, "train": gp.train_part, "features": gp.features_part}
    for part in args.parts:
        t0 = time.perf_counter()
        body["parts"][part] = run[part](ctx, args.budget[part], emit)
        body["seconds"][part], body["budgets_s"][part] = time.perf_counter() - t0, args.budget[part]
        write(out, body)
        emit(part, f"done in {body['seconds'][part]:.0f} s (budget {args.budget[part]:g} s); {out} rewritten")
    print(f"rates written to {out}\n  python experiments/full_grid.py --profile {args.profile} --dry-run "
          f"--rates {out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
