"""Fill this machine's caches for a verifier before work that runs many processes at once."""
from __future__ import annotations

import time
from pathlib import Path

from common.caches import load_json_cache


def warm(verifier: str, threads: list[int], dtypes: list[str]) -> int:
    """Fill this machine's caches for a verifier before work that runs many processes at once:
    the de-quantized copy, the kernel, and the matmul tables per thread count and dtype, timed
    now, on quiet cores (timings taken while other processes hold the cores are never cached, so
    a busy test suite or grid would time them again in every process)."""
    import torch

    from common.verifiers import load_from_registry
    from decoding.cpu import matmul as cpu_matmul

    bad = [d for d in dtypes if d not in ("float32", "bfloat16", "float16")]
    if bad:
        raise ValueError(f"--dtypes: unknown dtype(s) {bad}; use float32, bfloat16 or float16")
    for dtype in dtypes:
        for n in threads:
            torch.set_num_threads(n)
            t = time.time()
            model, _ = load_from_registry(verifier, dtype=dtype)  # the plain model: only the tables are tuned
            before = _keys(cpu_matmul.CACHE, n, model.dtype)
            # the tables alone: the model (shared by this process's other training-style loads) keeps
            # its plain forward
            shapes = len({cpu_matmul.table_for(m.weight)[0] for m in model.modules()
                          if isinstance(m, torch.nn.Linear)})
            added = len(_keys(cpu_matmul.CACHE, n, model.dtype) - before)
            print(f"[cache warm] {verifier} {dtype}, {n} thread(s): {shapes} weight shape(s), {added} newly "
                  f"timed and cached, {time.time() - t:.0f}s", flush=True)
    return 0


def _keys(path: Path, threads: int, dtype) -> set[str]:
    """The matmul tables cached for one thread count and dtype (another process may be adding others)."""
    return {k for k in load_json_cache(path) if f"|threads={threads}|" in k and k.endswith(str(dtype))}
