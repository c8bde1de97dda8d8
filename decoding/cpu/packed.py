"""Packed copies of weights, made once per weight and kept while it lives and is not written to.

The thin-GEMM kernel (``kernel.py``) and oneDNN's prepacked linear (``onednn.py``) each read a
weight from a layout of their own. ``PackedCopies(pack)`` keeps ``pack(W)`` per weight in a
registry keyed by the weight's identity: a hit needs the same tensor (a weak reference), storage,
version counter and shape; the copy is freed with the weight.
"""
from __future__ import annotations

import weakref
from collections.abc import Callable

import torch


class PackedCopies:
    def __init__(self, pack: Callable[[torch.Tensor], torch.Tensor]):
        self.pack = pack
        self.copies: dict = {}  # id(weight) -> (weak reference to it, stamp, packed copy)

    def __call__(self, W: torch.Tensor) -> torch.Tensor:
        stamp = (W.data_ptr(), W._version, W.shape)
        hit = self.copies.get(id(W))
        if hit is not None and hit[0]() is W and hit[1] == stamp:
            return hit[2]
        out = self.pack(W)
        key = id(W)
        self.copies[key] = (weakref.ref(W, lambda _, key=key: self._drop(key)), stamp, out)
        return out

    def _drop(self, key: int) -> None:
        """A weight was freed: free its copy (unless a new tensor with the same id took the slot)."""
        hit = self.copies.get(key)
        if hit is not None and hit[0]() is None:
            del self.copies[key]
