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
    ``draft_vocabs`` (reduced vocabulary sizes): the shapes a drafter's load adds, timed too. In
    float32, tree auto's verify costs too, for the feature captures of ``drafters``."""
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
            if dtype == "float32":  # the dtype a CPU grid decodes in (tree auto runs there)
                t = time.time()
                costs = _verify_costs(verifier, dtype, drafters)
                print(f"[cache warm] {verifier} {dtype}, {n} thread(s): tree auto's verify costs for "
                      f"{costs} feature capture(s), {time.time() - t:.0f}s", flush=True)
    return 0


def _verify_costs(verifier: str, dtype: str, backbones: list[str]) -> int:
    """Tree auto's verifier pass costs (decoding/autotree.py) for each feature capture the backbones'
    drafters read (the last hidden state; EAGLE-3's aux layers), timed on quiet cores with the forms
    decoding installs: a grid's eval actors otherwise time them under each other's load, where
    nothing is cached and the costs, inflated, steer tree auto to short chains (docs/study.md)."""
    from decoding import cpu
    from decoding.autotree import calibration_inputs, measure_verify_costs
    from decoding.verifiers import load_verifier
    from drafters.eagle3 import Eagle3Config

    model, tok = load_verifier(verifier, dtype=dtype)  # a separate instance: the plain one stays plain
    cpu.install(model)  # this thread count's tables (the instance is loaded once per process)
    ids = calibration_inputs(tok)[0]
    captures = [None] + ([tuple(Eagle3Config.for_verifier(model, verifier).aux_layers)]
                         if "eagle3" in backbones else [])
    for layers in captures:
        measure_verify_costs(model, ids, layers=layers)
    return len(captures)


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
