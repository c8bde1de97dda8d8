"""The CPU speed machinery, in one place: row-count-aware matmuls (``matmul.py``), the thin-GEMM
kernel they may pick (``kernel.py``, ``csrc/smallm.c``), the lean verifier pass (``lean_pass.py``).

``install(model)`` is the one way in: on a CPU model it gives every ``nn.Linear`` its tuned form
per row count; on any other device it does nothing (no kernel build, no tuning). The lean pass is
chosen per forward by ``use_lean(model)``, for CPU Llama-family models only. One switch turns all
of it off: ``TASKSPEC_CPU_SPEED=0`` (finer: ``TASKSPEC_CPU_MATMUL``, ``TASKSPEC_CPU_KERNEL``,
``TASKSPEC_LEAN_PASS``). The decode algorithm (decoding/*.py) reads the same on a CPU and a GPU.
"""
from __future__ import annotations

import os

from torch import nn

from decoding.cpu import kernel, lean_pass, machine, matmul, onednn
from decoding.cpu.lean_pass import disabled as lean_disabled
from decoding.cpu.lean_pass import forward as lean_forward
from decoding.cpu.lean_pass import use_lean
from decoding.cpu.matmul import disabled as matmul_disabled
from decoding.cpu.matmul import installed, machine_key, row_aware

__all__ = ["install", "installed", "use_lean", "lean_forward", "lean_disabled", "matmul_disabled",
           "row_aware",
           "machine_key", "status", "kernel", "machine", "matmul", "lean_pass", "onednn"]


def enabled() -> bool:
    return os.environ.get("TASKSPEC_CPU_SPEED", "1") != "0"


def install(model: nn.Module) -> dict:
    """Row-count-aware matmuls for a CPU model's linear layers ({} for other devices or when off)."""
    if not enabled():
        return {}
    return matmul.install(model)


def status() -> str:
    """One line for logs and benches: what the CPU machinery does on this machine."""
    if not enabled():
        return "CPU speed machinery off (TASKSPEC_CPU_SPEED=0)"
    return kernel.status()
