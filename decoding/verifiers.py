"""The verifier as decoding loads it: the registry's model (common/verifiers.py
``load_from_registry``) with this machine's CPU kernels installed on it (decoding/cpu/) when it runs
on the CPU."""
from __future__ import annotations

from common import verifiers as _registry
from decoding.cpu import install as _install_cpu


def load_verifier(name: str = _registry.DEFAULT_VERIFIER, dtype: str | None = None, device: str = "cpu",
                  matmul_forms: bool = True):
    """(model, tokenizer), loaded once per process. On the CPU with ``matmul_forms`` (the default)
    the row-count-aware matmuls and the lean pass are installed (``generate`` uses them too);
    ``matmul_forms=False`` gives the plain model (tuning the matmul tables costs a cold machine a
    minute per process, and training runs the plain product anyway)."""
    prepare = _install_cpu if device == "cpu" and matmul_forms else None
    return _registry.load_from_registry(name, dtype=dtype, device=device, prepare=prepare)
