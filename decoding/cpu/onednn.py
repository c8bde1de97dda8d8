"""oneDNN's prepacked linear through torch (``torch.ops.mkldnn``), one of the forms the tuner times.

``F.linear`` on a CPU reorders its weight into oneDNN's blocked layout on every call. Packing the
weight once (``_reorder_linear_weight``) and calling ``_linear_pointwise`` on the packed copy runs
the same oneDNN primitive without that cost; on a CPU with AMX its bf16 primitive uses the tiles
(measured: docs/performance.md, "Why the CPU forms exist"). The product is exact up to summation
order (a bf16 ``F.linear`` runs the same primitive and gave the same bits there; a float32 one runs
BLAS); a row's result may depend on the row count, as with ``F.linear``. The packed copy is kept
per weight (``packed.py``): it doubles the memory of the weights that take this form.

``available(dtype)`` tries the two ops once per dtype (a torch build without oneDNN, or a CPU whose
oneDNN has no bf16 path, says no), so the tuner offers the form only where it runs.
"""
from __future__ import annotations

import torch

from decoding.cpu.packed import PackedCopies

_OK: dict = {}


def available(dtype: torch.dtype) -> bool:
    if dtype not in _OK:
        _OK[dtype] = False
        if torch.backends.mkldnn.is_available():
            try:  # a host-only form: its trial tensors are on the CPU on purpose
                W = torch.ones(8, 16, dtype=dtype, device="cpu")
                y = _run(torch.ones(2, 16, dtype=dtype, device="cpu"),
                         torch.ops.mkldnn._reorder_linear_weight(W))
                _OK[dtype] = torch.equal(y, torch.full_like(y, 16))
            except (AttributeError, RuntimeError, NotImplementedError):
                pass
    return _OK[dtype]


def _run(x2: torch.Tensor, Wp: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x2, Wp, None, "none", [], "")


packed = PackedCopies(lambda W: torch.ops.mkldnn._reorder_linear_weight(W.detach().contiguous()))


def matmul(x2: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """(M, K) @ (N, K).T -> (M, N) on CPU through W's packed copy (callers check ``available``)."""
    return _run(x2 if x2.is_contiguous() else x2.contiguous(), packed(W))
