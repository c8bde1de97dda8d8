"""Host -> device copies that leave the host free to run ahead of the device."""
from __future__ import annotations

import torch


def to_device(t: torch.Tensor, device) -> torch.Tensor:
    """``t`` (a host tensor) on ``device``. On CUDA the copy goes from pinned memory with
    ``non_blocking=True``: a plain ``.to`` from pageable memory is a copy followed by a stream sync (CUDA's
    sync debug mode reports it), which drains the device's queue once per decode step. PyTorch's pinned
    allocator keeps the staging buffer until the copy has run. Elsewhere (the CPU, the accelerator
    stand-in of the tests) a plain ``.to``."""
    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.device_count() > 0:  # (the stand-in fakes is_available only)
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)
