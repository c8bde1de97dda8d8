"""Floating-point formats, declared once (torch-free): each format's name and bytes per element,
and the short names training precisions go by. ``float32``, ``bfloat16`` and ``float16`` are the
formats (torch's names: the verifier's dtype, exported drafters); ``fp32`` and ``bf16`` name two of
them as ``train.precision`` (the profile, the worker's TrainConfig, ``python -m workers train``)."""
from __future__ import annotations

BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}  # format -> bytes per element
NAMES = tuple(BYTES)
PRECISIONS = {"fp32": "float32", "bf16": "bfloat16"}  # a training precision -> its format


def nbytes(name: str) -> int:
    """Bytes per element of a format, by its name or its training precision's."""
    return BYTES[PRECISIONS.get(name, name)]


def torch_dtypes() -> dict:
    """{name: torch.dtype} for every name in NAMES."""
    import torch

    return {name: getattr(torch, name) for name in NAMES}


def torch_dtype(name: str):
    """The torch dtype of a format, by its name or its training precision's."""
    return torch_dtypes()[PRECISIONS.get(name, name)]
