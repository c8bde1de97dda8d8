"""Row-count-aware linear layers for CPU decoding.

On a small CPU, ``F.linear`` (x @ W.T) with a few rows runs slower than with one row although
streaming the weights once costs the same for any small row count; ``W @ x.T`` takes another BLAS
path, and a thin-GEMM kernel compiled on first use (``kernel.py``, two prefetch variants) streams a
repacked copy of the weights once for up to 256 rows. oneDNN's prepacked linear (``onednn.py``) is
what a bf16 verifier's multi-row passes want on a CPU with AMX. Which form wins depends on the CPU,
the weight shape and the row count (prefills included), so every form is timed (one far behind the
fastest and losing ground drops out as the row count grows): the measurements that motivated each
form are in docs/performance.md ("Why the CPU forms exist").

``install(model)`` times every form for every distinct weight shape at a few row counts (a few
seconds, cached per machine) and makes each ``nn.Linear`` use the fastest one for its row count;
one row is padded to two where that wins. Applied to the verifier model, so ``generate`` (the
baseline) and the speculative loop run the same kernels. Results equal ``F.linear`` up to float
summation order (as any change of row count already does). CPU only; no-op on other devices,
and never where gradients flow (``apply`` takes F.linear there).

Timings are trusted only when they are repeatable: each form is timed ``reps`` times, and a row
count whose timings spread by more than ``MAX_SPREAD`` of their median is timed once more (a
single spike on a VM); a table where that second timing still spreads as much, or measured while
this process got less than ``MIN_CPU_SHARE`` of its threads' CPU time (other processes held the cores),
is used for this process but not cached, and the next process measures again.
"""
from __future__ import annotations

import bisect
import os
import platform
import statistics
import sys
import time
import weakref

import torch
import torch.nn.functional as F
from torch import nn

from common.caches import add_to_json_cache, cache_dir, load_json_cache
from decoding import timing
from decoding.cpu import kernel as cpu_kernel
from decoding.cpu import onednn

# row counts that are timed (a tree pass: 1-32; a prompt's prefill: 32-256); larger ones use F.linear
BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 128, 256)
CACHE = cache_dir() / "cpu_matmul.json"
MAX_SPREAD = timing.MAX_SPREAD  # a form's repeated timings spread beyond this: the table is not cached
MIN_CPU_SHARE = timing.MIN_CPU_SHARE  # this process got less of its threads' CPU: not cached either
_SESSION: dict[str, dict] = {}  # untrusted tables: used by this process only
_INSTALLED: weakref.WeakKeyDictionary[nn.Module, dict] = weakref.WeakKeyDictionary()


def wxt(x2: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """(M, in) -> (M, out) as (W @ x.T).T; one row is padded to two (the one-row path is a GEMV)."""
    if x2.shape[0] == 1:
        return (W @ torch.cat([x2, x2]).T).T[:1].contiguous()
    return (W @ x2.T).T.contiguous()


def _time(fn, reps: int) -> list[float]:
    """``reps`` wall-clock timings of ``fn`` after one warm-up call."""
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return ts


COLD_BYTES = 128 * 2**20  # weights cycled per timing: more than any last-level cache, as in a real pass
# a row count whose fastest form takes longer than this per timed call ends the timing: the larger row
# counts take its form (on a CPU without native bfloat16 a bf16 call at 64-256 rows takes seconds, and
# timing every form at every count took minutes per weight shape: docs/performance.md)
MAX_CALL_S = 0.25
# a form slower than this multiple of the fastest at a row count, and further behind than at the row count
# before, is not timed at the larger ones (on Zen 3 the thin-GEMM kernel's float32 calls, 3-40x behind from
# 2 rows on, took 95% of a table's timing: docs/performance.md); F.linear, the reference, is always timed
DROP_RATIO = 2.0


# F.linear; (W @ x.T).T; the thin-GEMM kernel (kernel.py) with its two prefetch hints; oneDNN's
# prepacked linear (onednn.py)
FORMS = ("linear", "wxt", "kernel", "kernel-l2", "onednn")
KERNEL_FORMS = {"kernel": False, "kernel-l2": True}  # form -> kernel.run's l2


def kernel_l2(x2: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    return cpu_kernel.matmul(x2, W, l2=True)


def form_fn(form: str):
    return {"linear": F.linear, "wxt": wxt, "kernel": cpu_kernel.matmul, "kernel-l2": kernel_l2,
            "onednn": onednn.matmul}[form]


def forms_for(W: torch.Tensor) -> list[str]:
    """The forms that can run this weight here (the kernel's only for its dtypes, once built;
    oneDNN's only where this torch build runs it for the weight's dtype)."""
    kernel = W.dtype in cpu_kernel.DTYPES and cpu_kernel.available()
    return [f for f in FORMS
            if (f not in KERNEL_FORMS or kernel) and (f != "onednn" or onednn.available(W.dtype))]


@torch.no_grad()
def tune(W: torch.Tensor, reps: int = 3) -> tuple[dict[int, str], str | None]:
    """({row bucket: fastest form}, why the timings are not trustworthy or None) for this weight,
    from timing every form on cold weights (a model pass streams every weight from memory once; a
    hot loop over one small matrix would not). A form must beat F.linear by 5% to replace it."""
    copies = [W] + [W.clone() for _ in range(max(0, COLD_BYTES // (W.numel() * W.element_size()) - 1))]
    forms = forms_for(W)

    def bucket(x, live):
        ts = {f: _time(lambda f=f: [form_fn(f)(x, w) for w in copies], reps) for f in live}
        t = {f: statistics.median(v) for f, v in ts.items()}
        t["linear"] /= 0.95
        best = min(t, key=t.get)
        return best, max(timing.spread(ts[best]), timing.spread(ts["linear"])), t

    def measure():
        out, spreads = {}, []
        live, before = list(forms), {}  # the forms still timed, how far behind each was at the last count
        for i, m in enumerate(BUCKETS):
            x = torch.randn(m, W.shape[1], dtype=W.dtype, device=W.device)
            out[m], spread, t = bucket(x, live)
            if spread > MAX_SPREAD:  # one spike (a VM's noise is one-sided): time this row count again
                out[m], spread, t = bucket(x, live)
            spreads.append(spread)
            fastest = min(t.values())
            if fastest > MAX_CALL_S:  # the larger row counts take this one's form, untimed
                out.update({n: out[m] for n in BUCKETS[i + 1:]})
                break
            behind = {f: v / fastest for f, v in t.items()}
            live, before = _still_timed(live, behind, before), behind
        return out, max(spreads)

    (table, spread), share = timing.cpu_share(measure)
    why = None
    if spread > MAX_SPREAD:
        why = f"timings spread by {spread:.0%} of their median (limit {MAX_SPREAD:.0%})"
    elif share < MIN_CPU_SHARE:
        why = f"this process got {share:.0%} of its threads' CPU time (other processes held the cores)"
    return table, why


def _still_timed(live: list[str], behind: dict[str, float], before: dict[str, float]) -> list[str]:
    """The forms timed at the next row count: those ``DROP_RATIO`` behind the fastest and further behind
    than at the row count before (``before``) drop out; F.linear stays."""
    return [f for f in live if f == "linear" or behind[f] <= DROP_RATIO
            or behind[f] <= before.get(f, float("inf"))]


_ON = [True]


class disabled:
    """``with disabled():`` runs installed layers as stock F.linear (the bench's stock baseline)."""

    def __enter__(self):
        _ON[0] = False

    def __exit__(self, *exc):
        _ON[0] = True


class RowAwareLinear:
    """The forward installed on an nn.Linear: picks the form by row count from a tuned table (looked
    up once per row count when the table is set: a pass calls this ~200 times, so microseconds
    count)."""

    def __init__(self, module: nn.Linear, table: dict[int, str]):
        self.m, self.table = module, table

    @property
    def table(self) -> dict[int, str]:
        return self._table

    @table.setter
    def table(self, table: dict[int, str]) -> None:
        self._table, self._forms = table, [form_at(table, r) for r in range(BUCKETS[-1] + 1)]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return apply(x, self.m.weight, self.m.bias, self._table, self._forms)


def form_at(table: dict[int, str], rows: int) -> str:
    """The form a tuned table names for a row count (the largest timed bucket at or below it)."""
    return table[BUCKETS[max(0, bisect.bisect_right(BUCKETS, rows) - 1)]]


def apply(x: torch.Tensor, W: torch.Tensor, bias: torch.Tensor | None, table: dict[int, str],
          forms: list[str] | None = None) -> torch.Tensor:
    """F.linear(x, W, bias) in the form ``table`` names for x's row count (``forms``: the same
    looked up per row count 0..BUCKETS[-1], as RowAwareLinear keeps it)."""
    K = x.shape[-1]
    rows = x.numel() // K
    if rows > BUCKETS[-1] or not x.is_cpu or x.dtype != W.dtype or not _ON[0]:
        return F.linear(x, W, bias)
    if torch.is_grad_enabled() and (x.requires_grad or W.requires_grad or (bias is not None
            and bias.requires_grad)):
        # the kernel and W @ x.T here are inference forms: gradients take F.linear
        return F.linear(x, W, bias)
    form = forms[rows] if forms is not None else form_at(table, rows)
    if form == "linear":
        return F.linear(x, W, bias)
    x2 = x if x.dim() == 2 else x.reshape(rows, K)
    # the kernel's argument checks hold here (CPU, same dtype, rows <= BUCKETS[-1] = kernel.MAX_ROWS;
    # the tuner offers it only for the dtypes it takes), so it runs unchecked
    if form in KERNEL_FORMS:
        y = cpu_kernel.run(x2, W, KERNEL_FORMS[form])
    else:
        y = onednn.matmul(x2, W) if form == "onednn" else wxt(x2, W)
    if bias is not None:
        y = y + bias
    return y if x.dim() == 2 else y.view(*x.shape[:-1], W.shape[0])


def machine_key() -> str:
    """The part of a cache key that names this machine: CPU model, threads, torch, kernel build and
    the forms timed (a table timed before a form existed never saw it)."""
    cpu = cpu_kernel.cpuinfo("model name") or platform.processor() or platform.machine()
    kernel = cpu_kernel.library_path().name if cpu_kernel.available() else "no-kernel"
    return f"v3|{cpu}|threads={torch.get_num_threads()}|torch={torch.__version__}|{kernel}|{','.join(FORMS)}"


def table_for(W: torch.Tensor, disk: dict | None = None, machine: str | None = None) -> tuple[str, dict[int,
        str]]:
    """(cache key, {rows: form}) for this weight's shape and dtype on the CPU, tuned once per machine
    (a table from untrustworthy timings is kept for this process only). The key names the device
    type but not the model: the timing depends on the weight's shape and dtype alone."""
    disk = load_json_cache(CACHE) if disk is None else disk
    key = f"{machine or machine_key()}|{W.device.type}|{tuple(W.shape)}|{W.dtype}"
    if key not in disk and key not in _SESSION:
        table, why = tune(W.detach())
        if why is None:
            disk[key] = {str(m): v for m, v in table.items()}
            add_to_json_cache(CACHE, key, disk[key])
        else:
            print(f"[cpu matmul] {tuple(W.shape)}: not cached, {why}; measured again next run",
                  file=sys.stderr)
            _SESSION[key] = {str(m): v for m, v in table.items()}
    return key, {int(m): v for m, v in (disk.get(key) or _SESSION[key]).items()}


def row_aware(W: torch.Tensor):
    """``x -> x @ W.T`` in the tuned form per row count (for weights that are not an nn.Linear, e.g.
    a drafter's slice of the verifier's LM head); plain ``x @ W.T`` when turned off or off CPU."""
    if os.environ.get("TASKSPEC_CPU_MATMUL", "1") == "0" or os.environ.get("TASKSPEC_CPU_SPEED", "1") == "0" \
            or W.device.type != "cpu":
        return lambda x: x @ W.T
    table = table_for(W)[1]
    return lambda x: apply(x, W, None, table)


def install(model: nn.Module) -> dict:
    """Give every nn.Linear of a CPU model the faster form per row count. Returns
    {"out x in": {rows: form}} (also ``installed(model)``). Tables are cached per machine, threads,
    torch, device type, shape and dtype in ``$TASKSPEC_CACHE/cpu_matmul.json`` (default
    ~/.cache/taskspec). ``TASKSPEC_CPU_MATMUL=0`` turns it off; a model on another device is left alone
    (no tuning, no kernel build)."""
    if os.environ.get("TASKSPEC_CPU_MATMUL", "1") == "0":
        return {}
    linears = [m for m in model.modules() if isinstance(m, nn.Linear) and m.weight.device.type == "cpu"]
    if not linears:
        return {}
    disk, machine = load_json_cache(CACHE), machine_key()
    tables: dict[str, dict] = {}
    for mod in linears:
        key, table = table_for(mod.weight, disk, machine)
        tables.setdefault(key, table)
        mod.forward = RowAwareLinear(mod, tables[key])
    out = {k.split("|")[-2]: dict(t) for k, t in tables.items()}
    _INSTALLED[model] = out
    return out


def installed(model: nn.Module) -> dict:
    """The tables ``install`` gave this model ({} if none)."""
    return _INSTALLED.get(model, {})
