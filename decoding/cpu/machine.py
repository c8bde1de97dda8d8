"""Which machine a CPU number was measured on, and the bound it is measured against.

Decode speed on a CPU is set by how fast the verifier's weights stream from memory, and that
differs between machine classes (AMD EPYC with AVX2, Intel Xeon with AVX-512/AMX, Apple Silicon):
a ratio means little without the machine beside it. ``record(weights)`` returns the CPU model,
the instruction-set flags the kernel and the tuner care about, the thread count, and the plain
sum of the weights in model order (one read of every byte, nothing else: the bandwidth bound a
one-row verifier pass can at best reach). ``describe`` prints it in two lines for the benches.
"""
from __future__ import annotations

import os
import platform
import statistics
import time
from pathlib import Path

import torch

from decoding.cpu import kernel as cpu_kernel
from decoding.cpu import matmul

FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16",
         "asimd", "sve")


def isa_class(flags: set[str]) -> str:
    """The class docs/performance.md groups its measurements by."""
    if "amx_tile" in flags:
        return "x86 AVX-512 + AMX"
    if "avx512f" in flags:
        return "x86 AVX-512"
    if "avx2" in flags:
        return "x86 AVX2"
    if "asimd" in flags or platform.machine() in ("arm64", "aarch64"):
        return "ARM NEON"
    return "other"


def _cpu_fields() -> dict[str, str]:
    """/proc/cpuinfo's first block as {key: value} ({} where there is none)."""
    out: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().split("\n\n", 1)[0].splitlines():
            if ":" in line:
                k, v = line.split(":", 1)
                out.setdefault(k.strip(), v.strip())
    except OSError:
        pass
    return out


def microarchitecture(vendor: str, family: int, model: int) -> str:
    """AMD's core generation from the CPUID family/model ("" where unknown): the classes the suite
    and the benches are compared across (Zen 3 with AVX2 only, Zen 4 and Zen 5 with AVX-512)."""
    if vendor != "AuthenticAMD":
        return ""
    if family == 0x1A:
        return "Zen 5"
    if family == 0x19:
        return "Zen 4" if 0x10 <= model <= 0x1F or 0x60 <= model <= 0xAF else "Zen 3"
    if family == 0x17:
        return "Zen 2" if model >= 0x30 else "Zen/Zen+"
    return ""


def machine_class() -> str:
    """One line naming this machine's class, e.g. "AMD EPYC, Zen 4 (x86 AVX-512), 2 cores"."""
    f = _cpu_fields()
    flags = set(f.get("flags", "").split()) | set(f.get("Features", "").split())
    name = f.get("model name") or platform.processor() or platform.machine()
    try:
        arch = microarchitecture(f.get("vendor_id", ""), int(f.get("cpu family", "")), int(f.get("model",
                "")))
    except ValueError:
        arch = ""
    return f"{name}, {arch + ' ' if arch else ''}({isa_class(flags)}), {os.cpu_count()} cores"


def stream(w: torch.Tensor) -> torch.Tensor:
    """A plain sum that reads every byte of ``w`` once. A 16-bit weight is summed through a float32
    view of its bytes (the value means nothing; the read is the same): torch's bf16 sum widens
    every element and on an Intel Xeon ran at 15 GB/s where the float32 view reads at 21, so the
    bf16 sum would have measured the sum, not the memory."""
    if w.element_size() == 2 and w.is_contiguous() and w.shape[-1] % 2 == 0:
        return w.view(torch.float32).sum()
    return w.sum()


def weights_sum_ms(weights: list[torch.Tensor], repeats: int = 7) -> float:
    """Median ms of one plain sum over every weight, in order: the weights' stream time."""
    for w in weights:  # warm up
        stream(w)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        for w in weights:
            stream(w)
        times.append(time.perf_counter() - t)
    return 1000 * statistics.median(times)


def record(weights: list[torch.Tensor] | None = None) -> dict:
    """This machine: CPU, flags of interest, threads, kernel status and (given weights) the bound."""
    flags = set(cpu_kernel.cpuinfo("flags").split()) | set(cpu_kernel.cpuinfo("Features").split())
    rec = {
        "cpu": cpu_kernel.cpuinfo("model name") or platform.processor() or platform.machine(),
        "class": isa_class(flags),
        "flags": [f for f in FLAGS if f in flags],
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "kernel": cpu_kernel.status(),
    }
    if weights:
        nbytes = sum(w.numel() * w.element_size() for w in weights)
        ms = weights_sum_ms(weights)
        rec.update(weights_mb=nbytes / 1e6, sum_ms=ms, bandwidth_gbs=nbytes / 1e6 / ms)
    return rec


def forms_summary(tables: dict, rows: int) -> str:
    """Which form the tuner chose per weight shape at this row count ("(576, 576) kernel; ...")."""
    if not tables:
        return "none installed (F.linear everywhere)"
    return "; ".join(f"{shape} {matmul.form_at(t, rows)}" for shape, t in tables.items())


def describe(rec: dict) -> str:
    """Two lines: the machine, then the bound (when measured)."""
    out = (f"machine: {rec['cpu']} ({rec['class']}; flags {' '.join(rec['flags']) or '-'}); "
           f"{rec['threads']} threads; torch {rec['torch']}; {rec['kernel']}")
    if "sum_ms" in rec:
        out += (f"\nbound: a plain sum of the {rec['weights_mb']:.0f} MB of weights takes "
                f"{rec['sum_ms']:.1f} ms "
                f"({rec['bandwidth_gbs']:.1f} GB/s)")
    return out
