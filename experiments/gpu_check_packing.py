"""How many decoding processes one device carries: the GPU check's packing rows.

Batch-1 speculative decoding is host-bound on a GPU (a step costs tens of milliseconds of Python and
kernel launches while reading the weights costs a few), so several evaluation actors can share one
GPU until the device saturates. This measures it: k = 1, 2, 4 worker processes each load the
verifier and the drafter, wait at a common start, decode the same prompts with ``single``, and report
their wall time, steps and tokens. Per k: aggregate tokens/s (every process's tokens over the span
from the first start to the last end) and the mean per-process step time. The rows go to the check's
table and to a rates file (``gpu_rates.json``) that the dry run's packing model reads (``--rates``).

A worker is this file run as a script (``--worker``): it prints ``ready``, waits for one line on
stdin, decodes, and prints one JSON line.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _worker(args) -> int:
    import torch

    sys.path.insert(0, str(ROOT))
    from common.verifiers import eos_token_ids, resolve
    from decoding.config import TreeConfig
    from decoding.engine import DecodeConfig, SpeculativeDecoder
    from decoding.runner import load_proposers
    from decoding.verifiers import load_verifier

    if args.threads:
        torch.set_num_threads(args.threads)
    model, tok = load_verifier(args.verifier, dtype=args.dtype, device=args.device)
    props = load_proposers(model, [args.drafter], resolve(args.verifier).name)
    cfg = DecodeConfig(strategy="single", max_new_tokens=args.max_new_tokens, tree=TreeConfig(*args.tree))
    dec = SpeculativeDecoder(model, props, cfg, eos_token_ids(model, tok))
    inputs = json.loads(Path(args.inputs).read_text())
    dec.generate(inputs[0][:8], seed_key="warm-up")
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    print("ready", flush=True)
    sys.stdin.readline()
    start = time.time()
    res = [dec.generate(ids, seed_key=str(i)) for i, ids in enumerate(inputs)]
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
    end = time.time()
    peak = torch.cuda.max_memory_allocated() / 2**30 if args.device.startswith("cuda") else None
    out = {"start": start, "end": end, "tokens": sum(len(r.output_token_ids) for r in res),
           "steps": sum(r.verifier_calls for r in res), "new": sum(r.new_tokens for r in res),
           "peak_gib": peak}
    if args.generate:  # transformers' generate on the same prompts, after the timed decode
        out |= _time_generate(model, tok, inputs, args.max_new_tokens, args.device)
    if args.batches:  # the same prompts verified several at a time in one pass (decoding/batch.py)
        out["batched"] = _time_batches(dec, inputs, args.batches, args.device)
    print(json.dumps(out), flush=True)
    return 0


def _time_generate(model, tok, inputs: list[list[int]], max_new: int, device: str) -> dict:
    """Seconds and tokens of transformers' greedy ``generate`` over ``inputs`` (after a warm-up)."""
    import torch

    from common.verifiers import eos_token_ids
    from decoding.bench import hf_generate

    eos = eos_token_ids(model, tok)
    hf_generate(model, inputs[0][:8], 4, eos, 0.0, 0)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t0 = time.time()
    toks = sum(len(hf_generate(model, ids, max_new, eos, 0.0, 0)) for ids in inputs)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return {"generate_s": time.time() - t0, "generate_tokens": toks}


def _time_batches(dec, inputs: list[list[int]], batches: str, device: str) -> dict:
    """decoding.batch.time_batches on the prompts, repeated to fill the largest batch (batch 1 first, in
    the same process; each B with the rows drafting together and one by one, so what drafting together
    buys is read apart from what the shared verifier pass buys), and the peak device memory over them
    (the largest batch's)."""
    import torch

    from decoding.batch import time_batches
    from decoding.timing import synced_now

    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    sizes = [int(x) for x in batches.split(",")]
    runs = [(ids, f"{i}/{r}") for r in range(-(-max(sizes) // len(inputs))) for i, ids in enumerate(inputs)]
    rows = time_batches(dec, runs, sizes, lambda: synced_now(device), rows_draft_alone=True)
    return {"rows": rows, "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None}


def run_packed(k: int, worker_args: list[str], threads: int, timeout: float = 600) -> list[dict]:
    """Start k workers, release them together once all are ready, return their JSON results."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--threads", str(threads), *worker_args]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                                     os.environ.get("PYTHONPATH")]))}
    procs = [subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
             for _ in range(k)]
    try:
        for p in procs:
            line = p.stdout.readline()
            if line.strip() != "ready":
                raise RuntimeError(f"packing worker did not start (exit {p.wait()}): {line.strip()!r}")
        for p in procs:  # the start signal, to all at once
            p.stdin.write("go\n")
            p.stdin.flush()
        out = [json.loads(p.stdout.readline()) for p in procs]
        for p in procs:
            p.wait(timeout=timeout)
        return out
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


def summarize(k: int, results: list[dict]) -> dict:
    """One packing row: aggregate tokens/s over the common span, mean step time per process, tau."""
    span = max(r["end"] for r in results) - min(r["start"] for r in results)
    steps = sum(r["steps"] for r in results)
    step_s = sum((r["end"] - r["start"]) / max(r["steps"], 1) for r in results) / len(results)
    peaks = [r["peak_gib"] for r in results if r.get("peak_gib") is not None]
    return {"processes": k, "tokens_per_s": sum(r["tokens"] for r in results) / span, "step_s": step_s,
            "tau": sum(r["new"] for r in results) / max(steps, 1),
            "peak_gib_per_process": max(peaks) if peaks else None}


def measure(args, drafter: str, dtype: str, inputs: list[list[int]], counts: list[int], table) -> list[dict]:
    """Packing rows for k in ``counts``; each row is added to the table as it completes."""
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="gpu-check-packing-")) / "inputs.json"
    path.write_text(json.dumps(inputs))
    worker_args = ["--verifier", args.verifier, "--drafter", drafter, "--device", args.device, "--dtype",
                   dtype,
                   "--inputs", str(path), "--max-new-tokens", str(args.max_new_tokens)]
    cpu = not args.device.startswith("cuda")
    rows, base = [], None
    for k in counts:
        row = summarize(k, run_packed(k, worker_args, threads=1 if cpu else 0))
        base = base or row["tokens_per_s"]
        rows.append(row)
        peak = row["peak_gib_per_process"]
        table.add({"model": args.model_label or Path(args.verifier).name, "dtype": dtype,
                   "check": f"packing x{k}",
                   "tok/s": f"{row['tokens_per_s']:.1f}", "vs gen": "", "tau": f"{row['tau']:.2f}",
                   "peak mem": f"{peak:.1f} GiB each" if peak is not None else "-",
                   "note": f"{k} processes on one device, single 4/4/16: aggregate "
                           f"{row['tokens_per_s'] / base:.2f}x "
                           f"one process; {row['step_s'] * 1e3:.1f} ms per step per process"
                           + ("; 1 torch thread each" if cpu else "")})
    return rows


def write_rates(path: str | Path, device_name: str, model_label: str, dtype: str, rows: list[dict]) -> Path:
    """The rates file the dry run reads (orchestrator/plan/rates/): written to a temp name, then renamed."""
    path = Path(path)
    body = {"kind": "gpu-check-packing", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "device": device_name, "verifier": model_label, "dtype": dtype, "strategy": "single",
            "tree": [4, 4, 16], "packing": rows}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(body, indent=1) + "\n")
    tmp.replace(path)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--worker", action="store_true", required=True)
    ap.add_argument("--verifier", required=True)
    ap.add_argument("--drafter", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--inputs", required=True)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--tree", type=int, nargs=3, default=[4, 4, 16])
    ap.add_argument("--generate", action="store_true", help="also time transformers' generate on the prompts")
    ap.add_argument("--batches", default="", help="comma list: also time the prompts verified B at a time")
    return _worker(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
