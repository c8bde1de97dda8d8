"""A thin-GEMM kernel for CPU decoding, compiled on first use (``csrc/smallm.c``).

``matmul(x, W)`` computes ``x @ W.T`` for 1-256 rows (a tree pass, a prompt's prefill), reading W
once, in float32 or in bfloat16 (float32 accumulation, each output rounded once to bf16, as
torch's bf16 linear). It reads W from a repacked copy (panels of 32 output rows, k-major), made
on first use and kept until the weight changes: the kernel's weights take twice their memory.
It is two of the forms ``matmul.tune`` times per weight shape and row count (``l2=False``: a
non-temporal prefetch into L1, "kernel"; ``l2=True``: a prefetch into L2, "kernel-l2"; which one
streams faster depends on the CPU), so it is used only where it wins on this machine. The shared
library is built with the system C compiler (``$CC``, default ``gcc``) for this CPU
(``-march=native``, or ``$TASKSPEC_CPU_MARCH``) and cached under ``$TASKSPEC_CACHE/kernels``, keyed
by the source, the flags and the CPU's feature flags; it uses the OpenMP runtime torch has already
loaded, with torch's intra-op thread count. Without a compiler (or with ``TASKSPEC_CPU_KERNEL=0``)
it is unavailable, ``status()`` says why, and the BLAS forms remain.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import tempfile
from pathlib import Path

import torch

from common.caches import cache_dir
from decoding.cpu.packed import PackedCopies

SOURCE = Path(__file__).with_name("csrc") / "smallm.c"
FLAGS = ["-O3", "-fopenmp", "-fPIC", "-shared"]
MAX_ROWS = 256
_STATE: dict = {}


def cpuinfo(field: str) -> str:
    """The value of ``field`` in /proc/cpuinfo's first block ("" where there is none)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(field):
                return line.split(":", 1)[1].strip()
    except (OSError, IndexError):
        pass
    return ""


def flags() -> list[str]:
    """Compiler flags: this CPU's own instruction set, or ``$TASKSPEC_CPU_MARCH`` (e.g. ``x86-64``,
    the baseline without AVX: how the kernel builds for a CPU that lacks AVX2/AVX-512)."""
    return [*FLAGS, f"-march={os.environ.get('TASKSPEC_CPU_MARCH', 'native')}"]


def library_path() -> Path:
    key = hashlib.sha256("\n".join([SOURCE.read_text(), os.environ.get("CC", "gcc"), *flags(),
                                    cpuinfo("flags")])
                         .encode()).hexdigest()[:16]
    return cache_dir() / "kernels" / f"smallm-{key}.so"


def build(path: Path) -> None:
    """Compile to a temporary name in the cache directory, then rename (concurrent builders race
    harmlessly: each rename installs a complete library)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        subprocess.run([os.environ.get("CC", "gcc"), *flags(), str(SOURCE), "-o", tmp], check=True,
                       capture_output=True, text=True, timeout=120)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _load():
    if "fn" in _STATE:
        return _STATE["fn"]
    fn, why = None, None
    if os.environ.get("TASKSPEC_CPU_KERNEL", "1") == "0":
        why = "off (TASKSPEC_CPU_KERNEL=0)"
    else:
        try:
            path = library_path()
            if not path.exists():
                build(path)
            lib = ctypes.CDLL(str(path))
            for name in ("smallm_f32", "smallm_bf16"):
                getattr(lib, name).argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int] * 5
                getattr(lib, name).restype = ctypes.c_int
            for name in ("pack_f32", "pack_bf16"):
                getattr(lib, name).argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int] * 3
                getattr(lib, name).restype = ctypes.c_int
            fn = {torch.float32: lib.smallm_f32, torch.bfloat16: lib.smallm_bf16}
            lib.packed_size_f32.argtypes = [ctypes.c_int] * 2
            lib.packed_size_f32.restype = ctypes.c_longlong
            _STATE["lib"] = lib
        except subprocess.CalledProcessError as e:
            why = f"compiling {SOURCE.name} failed: {(e.stderr or '').strip()[:300]}"
        except (OSError, subprocess.SubprocessError) as e:
            why = f"cannot build or load {SOURCE.name}: {e}"
    _STATE.update(fn=fn, why=why)
    return fn


def available() -> bool:
    return _load() is not None


def status() -> str:
    """One line for logs: where the kernel came from, or why it is not used."""
    return (f"thin-GEMM kernel {library_path().name}" if available()
            else f"thin-GEMM kernel unavailable: {_STATE['why']}")


def _pack(W: torch.Tensor) -> torch.Tensor:
    if _load() is None:
        raise RuntimeError(status())
    lib = _STATE["lib"]
    N, K = W.shape
    Wc = W.detach().contiguous()
    out = torch.empty(lib.packed_size_f32(N, K), dtype=W.dtype)
    pack = lib.pack_bf16 if W.dtype == torch.bfloat16 else lib.pack_f32
    if pack(Wc.data_ptr(), out.data_ptr(), N, K, torch.get_num_threads()) != 0:
        raise RuntimeError(f"packing a {W.dtype} weight: the kernel refused its arguments")
    return out


# W's repacked copy for the kernel, made once and kept (freed with W) until W is written to (its
# version counter moves) or its storage changes
packed = PackedCopies(_pack)


DTYPES = (torch.float32, torch.bfloat16)  # the weight formats the kernel takes


def matmul(x2: torch.Tensor, W: torch.Tensor, l2: bool = False) -> torch.Tensor:
    """(M, K) @ (N, K).T -> (M, N) on CPU, M <= MAX_ROWS, x and W both float32 or both bfloat16
    (callers check ``available()``); ``l2``: prefetch the weights into L2 rather than
    non-temporally into L1 (the same result)."""
    M, K = x2.shape
    if (x2.dtype != W.dtype or W.dtype not in DTYPES or W.shape[1] != K or not 1 <= M <= MAX_ROWS
            or x2.device.type != "cpu" or W.device.type != "cpu"):
        raise ValueError(f"cpu.kernel.matmul takes CPU (M<= {MAX_ROWS}, K) and (N, K), both float32 or both "
                         f"bfloat16; got {tuple(x2.shape)} {x2.dtype} and {tuple(W.shape)} {W.dtype}")
    return run(x2, W, l2)


def run(x2: torch.Tensor, W: torch.Tensor, l2: bool = False) -> torch.Tensor:
    """``matmul`` without its argument checks, for callers that have made them (matmul.apply: a
    verifier pass makes ~200 of these calls, and each check costs microseconds)."""
    M, K = x2.shape
    N = W.shape[0]
    if not x2.is_contiguous():
        x2 = x2.contiguous()
    y = torch.empty(M, N, dtype=W.dtype, device="cpu")  # the kernel runs on the host only
    fn = _STATE["fn"][W.dtype]
    if fn(x2.data_ptr(), packed(W).data_ptr(), y.data_ptr(), M, K, N, torch.get_num_threads(), int(l2)):
        raise RuntimeError(f"the kernel refused its arguments ({W.dtype}, M={M}, K={K}, N={N})")
    return y
