"""Fill this machine's caches for a verifier before work that runs many processes at once."""
from __future__ import annotations

import time
from pathlib import Path

from common.caches import load_json_cache


def warm(verifier: str, threads: list[int], dtypes: list[str], drafters: list[str] = (),
         draft_vocabs: list[int] = ()) -> int:
    """Fill this machine's caches for a verifier before work that runs many processes at once:
    the de-quantized copy, the kernel, and the matmul tables per thread count and dtype, timed
    now, on quiet cores (timings taken while other processes hold the cores are never cached, so
    a busy test suite or grid would time them again in every process). ``drafters`` (backbones) and
    ``draft_vocabs`` (reduced vocabulary sizes): the shapes a drafter's load adds, timed too."""
    import torch

    from common.verifiers import load_from_registry
    from decoding.cpu import matmul as cpu_matmul
    from drafters.config import BACKBONES

    bad = [d for d in dtypes if d not in ("float32", "bfloat16", "float16")]
    if bad:
        raise ValueError(f"--dtypes: unknown dtype(s) {bad}; use float32, bfloat16 or float16")
    bad = [b for b in drafters if b not in BACKBONES]
    if bad:
        raise ValueError(f"--drafters: unknown backbone(s) {bad}; use {', '.join(BACKBONES)}")
    for dtype in dtypes:
        for n in threads:
            torch.set_num_threads(n)
            t = time.time()
            model, _ = load_from_registry(verifier, dtype=dtype)  # the plain model: only the tables are tuned
            before = _keys(cpu_matmul.CACHE, n, model.dtype)
            # the tables alone: the model (shared by this process's other training-style loads) keeps
            # its plain forward
            keys = {cpu_matmul.table_for(m.weight)[0] for m in model.modules()
                    if isinstance(m, torch.nn.Linear)}
            shapes = len(keys | _drafter_tables(model, verifier, drafters, draft_vocabs))
            added = len(_keys(cpu_matmul.CACHE, n, model.dtype) - before)
            print(f"[cache warm] {verifier} {dtype}, {n} thread(s): {shapes} weight shape(s), {added} newly "
                  f"timed and cached, {time.time() - t:.0f}s", flush=True)
    return 0


def _drafter_tables(model, verifier: str, backbones: list[str], vocabs: list[int]) -> set[str]:
    """The tables a process that loads a drafter of ``model`` times beyond the verifier's own: its
    layers (the fc that takes 2 or 3 hidden states, EAGLE-3's) and the draft head's slice of the
    LM head per reduced vocabulary size."""
    import torch

    from drafters.checkpoint import init_drafter
    from drafters.config import DrafterConfig
    from drafters.eagle3 import Eagle3Config, init_eagle3

    from . import matmul as cpu_matmul

    weights = [model.get_output_embeddings().weight[:v] for v in vocabs]
    for b in backbones:
        d = init_eagle3(Eagle3Config.for_verifier(model, verifier)) if b == "eagle3" else \
            init_drafter(DrafterConfig.for_verifier(model, verifier, b))
        weights += [m.weight for m in d.to(model.dtype).modules() if isinstance(m, torch.nn.Linear)]
    return {cpu_matmul.table_for(w.detach())[0] for w in weights}


def _keys(path: Path, threads: int, dtype) -> set[str]:
    """The matmul tables cached for one thread count and dtype (another process may be adding others)."""
    return {k for k in load_json_cache(path) if f"|threads={threads}|" in k and k.endswith(str(dtype))}
