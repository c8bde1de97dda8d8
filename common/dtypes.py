"""Floating-point formats by name: the names (torch-free, for configs and profiles) and their torch
dtypes."""
from __future__ import annotations

NAMES = ("float32", "bfloat16", "float16")


def torch_dtypes() -> dict:
    """{name: torch.dtype} for every name in NAMES."""
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
