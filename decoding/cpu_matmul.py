"""Row-count-aware linear layers for CPU decoding.

On the 2-core CPU, ``F.linear`` (x @ W.T) with 2-8 rows runs 2-3x slower than with one row (for
the 49,152 x 576 LM head: 10 ms at one row, 24-35 ms at two or three), although streaming the
weights once costs the same for any small row count. Computing ``W @ x.T`` instead takes another
BLAS path that is 3-8x faster at those sizes (the LM head at 2-8 rows: 3-7 ms). So a tree pass
of a few nodes paid 1.4-2x a one-token step for a reason that had nothing to do with the tree.

Even ``W @ x.T`` runs 4-8 rows at 40-60% of the one-row speed, so ``cpu_kernel.py`` adds a
third form, a thin-GEMM kernel compiled on first use that streams a repacked copy of the weights
once for up to 32 rows. All of SmolLM2's 211 weights in pass order on the 2-core CPU
(``experiments/bench_matmul.py``): 16.6 ms at one row, 16.4 at 6, 16.9 at 9, 25.8 at 16; the
previous kernel, which read the weights in place, took 19.4 / 23.9 / 28.2 / 38.4.

``install(model)`` times every form for every distinct weight shape at a few row counts (a few
seconds, cached per machine) and makes each ``nn.Linear`` use the fastest one for its row count;
one row is padded to two where that wins. Applied to the verifier model, so ``generate`` (the
baseline) and the speculative loop run the same kernels. Results equal ``F.linear`` up to float
summation order (as any change of row count already does). CPU only; no-op on other devices.
"""
from __future__ import annotations

import bisect
import json
import os
import platform
import statistics
import time

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from drafters.atomic import write_text_atomic

from . import cpu_kernel

BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)  # row counts that are timed; larger ones use F.linear
CACHE = Path(os.environ.get("TASKSPEC_CACHE", Path.home() / ".cache" / "taskspec")) / "cpu_matmul.json"


def wxt(x2: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """(M, in) -> (M, out) as (W @ x.T).T; one row is padded to two (the one-row path is a GEMV)."""
    if x2.shape[0] == 1:
        return (W @ torch.cat([x2, x2]).T).T[:1].contiguous()
    return (W @ x2.T).T.contiguous()


def _time(fn, reps: int) -> float:
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


COLD_BYTES = 128 * 2**20  # weights cycled per timing: more than any last-level cache, as in a real pass


FORMS = ("linear", "wxt", "kernel")  # F.linear; (W @ x.T).T; the thin-GEMM kernel (cpu_kernel.py)


def _form_fn(form: str):
    return {"linear": F.linear, "wxt": wxt, "kernel": cpu_kernel.matmul}[form]


@torch.no_grad()
def tune(W: torch.Tensor, reps: int = 3) -> dict[int, str]:
    """{row bucket: fastest form} for this weight, from timing every form on cold weights (a model
    pass streams every weight from memory once; a hot loop over one small matrix would not). A
    form must beat F.linear by 5% to replace it."""
    copies = [W] + [W.clone() for _ in range(max(0, COLD_BYTES // (W.numel() * W.element_size()) - 1))]
    forms = [f for f in FORMS if f != "kernel" or (W.dtype == torch.float32 and cpu_kernel.available())]
    out = {}
    for m in BUCKETS:
        x = torch.randn(m, W.shape[1], dtype=W.dtype, device=W.device)
        t = {f: _time(lambda: [_form_fn(f)(x, w) for w in copies], reps) for f in forms}
        t["linear"] /= 0.95
        out[m] = min(t, key=t.get)
    return out


_ON = [True]


class disabled:
    """``with disabled():`` runs installed layers as stock F.linear (the bench's stock baseline)."""

    def __enter__(self):
        _ON[0] = False

    def __exit__(self, *exc):
        _ON[0] = True


class RowAwareLinear:
    """The forward installed on an nn.Linear: picks the form by row count from a tuned table."""

    def __init__(self, module: nn.Linear, table: dict[int, str]):
        self.m, self.table = module, table

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return apply(x, self.m.weight, self.m.bias, self.table)


def apply(x: torch.Tensor, W: torch.Tensor, bias: torch.Tensor | None, table: dict[int, str]) -> torch.Tensor:
    """F.linear(x, W, bias) in the form ``table`` names for x's row count."""
    rows = x.numel() // x.shape[-1]
    if rows > BUCKETS[-1] or x.device.type != "cpu" or x.dtype != W.dtype or not _ON[0]:
        return F.linear(x, W, bias)
    form = table[BUCKETS[max(0, bisect.bisect_right(BUCKETS, rows) - 1)]]
    if form == "linear":
        return F.linear(x, W, bias)
    y = _form_fn(form)(x.reshape(rows, x.shape[-1]), W)
    if bias is not None:
        y = y + bias
    return y.reshape(*x.shape[:-1], W.shape[0])


def _machine() -> str:
    cpu = cpu_kernel.cpuinfo("model name") or platform.processor() or platform.machine()
    kernel = cpu_kernel.library_path().name if cpu_kernel.available() else "no-kernel"
    return f"v2|{cpu}|threads={torch.get_num_threads()}|torch={torch.__version__}|{kernel}"


def load_json_cache(path: Path) -> dict:
    """A measurement cache (JSON); missing or unreadable = empty."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def save_json_cache(path: Path, data: dict) -> None:
    """Write a measurement cache atomically; a read-only home only means measuring again next time."""
    try:
        write_text_atomic(path, json.dumps(data, indent=1, sort_keys=True))
    except OSError:
        pass


def _table(W: torch.Tensor, disk: dict, machine: str) -> tuple[str, dict[int, str]]:
    """(cache key, {rows: form}) for this weight's shape and dtype, tuned once per machine."""
    key = f"{machine}|{tuple(W.shape)}|{W.dtype}"
    if key not in disk:
        disk[key] = {str(m): v for m, v in tune(W.detach()).items()}
        save_json_cache(CACHE, disk)
    return key, {int(m): v for m, v in disk[key].items()}


def row_aware(W: torch.Tensor):
    """``x -> x @ W.T`` in the tuned form per row count (for weights that are not an nn.Linear, e.g.
    a drafter's slice of the verifier's LM head); plain ``x @ W.T`` when turned off or off CPU."""
    if os.environ.get("TASKSPEC_CPU_MATMUL", "1") == "0" or W.device.type != "cpu":
        return lambda x: x @ W.T
    table = _table(W, load_json_cache(CACHE), _machine())[1]
    return lambda x: apply(x, W, None, table)


def install(model: nn.Module) -> dict:
    """Give every nn.Linear of a CPU model the faster form per row count. Returns
    {"out x in": {rows: form}}. Tables are cached per machine, threads, torch, shape and dtype in
    ``$TASKSPEC_CACHE/cpu_matmul.json`` (default ~/.cache/taskspec). ``TASKSPEC_CPU_MATMUL=0``
    turns it off."""
    if os.environ.get("TASKSPEC_CPU_MATMUL", "1") == "0":
        return {}
    disk, machine = load_json_cache(CACHE), _machine()
    tables: dict[str, dict] = {}
    for mod in model.modules():
        if isinstance(mod, nn.Linear) and mod.weight.device.type == "cpu":
            key, table = _table(mod.weight, disk, machine)
            tables.setdefault(key, table)
            mod.forward = RowAwareLinear(mod, tables[key])
    return {k.split("|")[-2]: dict(t) for k, t in tables.items()}
