"""The library versions the decode path supports, checked once with one clear error.

The decode path (the verifier's tree pass and in-place KV cache, decoding/verifier_pass.py; the
grouped-attention interface, common/grouped_attention.py) subclasses and calls transformers'
cache and attention internals, which change between releases. ``TRANSFORMERS`` is the range the
test suite runs: its lower bound in a scratch environment (tests/test_transformers_floor.py, in
``make test-full``), the pinned release (docker/constraints.txt) everywhere else.
"""
from __future__ import annotations

import re

TRANSFORMERS = ("5.0.0", "6")  # [lowest tested, first unsupported major)


def _release(text: str) -> tuple[int, ...]:
    """(major, minor, patch) of a version string; pre-release and local tags are ignored."""
    nums = re.match(r"(\d+)(?:\.(\d+))?(?:\.(\d+))?", text)
    if nums is None:
        raise ValueError(f"not a version: {text!r}")
    return tuple(int(x or 0) for x in nums.groups())


def transformers_problem(version: str) -> str:
    """'' when ``version`` is in the supported range, else the one-line reason."""
    low, high = TRANSFORMERS
    if _release(version) < _release(low) or _release(version) >= _release(high):
        return (f"transformers {version} is not supported by the decode path: it needs >={low},<{high} "
                f"(pip install 'transformers>={low},<{high}')")
    return ""


def check_transformers() -> None:
    """Raise one RuntimeError naming the installed transformers when it is outside the supported range."""
    import transformers

    problem = transformers_problem(transformers.__version__)
    if problem:
        raise RuntimeError(problem)
