"""Time the verifier's matmuls, one whole pass of them, in every form decoding.cpu.matmul can pick.

    python experiments/bench_matmul.py [--verifier smollm2-135m-instruct] [--dtype float32|bfloat16]
                                       [--rows 1,2,4,6,8,9,12,16,32]

For each row count, runs every nn.Linear weight of the verifier once, in model order (so each weight
comes from memory, as in a real pass), as F.linear, (W @ x.T).T, the thin-GEMM kernel with either
prefetch hint, oneDNN's prepacked linear (where this torch runs it), and the form the tuned table
installs, and a plain sum of the same weights (the bound: one read of every byte);
prints the median ms over interleaved repeats (the bound among them, so a noisy machine moves
both alike), the weight bytes streamed per second, the tuned pass against the bound and against
the tuned one-row pass, and which form the tuner chose how often. First it prints the machine
(CPU model, flags, threads, kernel). ``--dtype bfloat16`` runs the verifier's weights in bf16
(half the bytes; the kernel's bf16 path). The same process, weights and threads for
every form: compare the columns, and compare machines by the ratios.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from decoding.cpu import kernel as cpu_kernel
from decoding.cpu import matmul as cpu_matmul
from decoding.cpu.machine import describe, record, stream
from decoding.runner import default_threads
from decoding.verifiers import load_verifier
from drafters.model import DTYPES


def chosen(tables, rows: int) -> str:
    """How many weights the tuner gave each form at this row count ("F.linear 120, kernel 91")."""
    counts: dict[str, int] = {}
    for t in tables:
        form = cpu_matmul.form_at(t, rows)
        counts[form] = counts.get(form, 0) + 1
    return ", ".join(f"{f} {n}" for f, n in sorted(counts.items(), key=lambda kv: -kv[1]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--verifier", default="smollm2-135m-instruct")
    ap.add_argument("--rows", default="1,2,4,6,8,9,12,16,32,96")
    ap.add_argument("--dtype", default="float32", choices=list(DTYPES))
    ap.add_argument("--repeats", type=int, default=7)
    a = ap.parse_args(argv)
    rows = [int(r) for r in a.rows.split(",")]
    if not rows or min(rows) < 1 or max(rows) > cpu_kernel.MAX_ROWS:
        ap.error(f"--rows must be in 1..{cpu_kernel.MAX_ROWS}, got {a.rows!r}")
    default_threads()
    model, _ = load_verifier(a.verifier, dtype=a.dtype)
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    weights = [m.weight.detach() for m in linears]
    tables = {id(m): cpu_matmul.table_for(m.weight)[1] for m in linears}
    gb = sum(w.numel() * w.element_size() for w in weights) / 1e9
    forms = cpu_matmul.forms_for(weights[0])
    machine = record(weights)
    print(describe(machine))
    print(f"{a.verifier}: {len(weights)} weights, {gb * 1000:.0f} MB")
    print(f"{'rows':>4}  " + "  ".join(f"{f:>9}" for f in forms)
          + f"  {'tuned':>8}  {'sum':>8}  best GB/s  tuned/sum  tuned/1row  tuned forms")
    one_row = None
    for m in rows:
        xs = {w.shape[1]: torch.randn(m, w.shape[1], dtype=DTYPES[a.dtype]) for w in weights}

        def run(form, xs=xs):  # called in this iteration only
            if form == "sum":
                return lambda: [stream(w) for w in weights]
            if form == "tuned":
                return lambda: [cpu_matmul.apply(xs[w.shape[1]], w, None, tables[id(lin)])
                                for lin, w in zip(linears, weights)]
            fn = cpu_matmul.form_fn(form)
            return lambda: [fn(xs[w.shape[1]], w) for w in weights]

        fns = {f: run(f) for f in [*forms, "tuned", "sum"]}
        times = {f: [] for f in fns}
        for f in fns.values():
            f()  # warm up (and pack the kernel's copies)
        for _ in range(a.repeats):
            for f, fn in fns.items():
                t = time.perf_counter()
                fn()
                times[f].append(time.perf_counter() - t)
        ms = {f: 1000 * statistics.median(t) for f, t in times.items()}
        bound = ms.pop("sum")
        one_row = ms["tuned"] if one_row is None else one_row
        print(f"{m:>4}  " + "  ".join(f"{ms[f]:9.1f}" for f in forms) + f"  {ms['tuned']:8.1f}  {bound:8.1f}"
              + f"  {gb / (min(ms.values()) / 1000):9.1f}  {ms['tuned'] / bound:8.2f}x"
              + f"  {ms['tuned'] / one_row:9.2f}x  {chosen(tables.values(), m)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
