"""The measurement caches decoding keeps per machine, in one directory, and a way to see and clear them.

``$TASKSPEC_CACHE`` (default ``~/.cache/taskspec``) holds ``cpu_matmul.json`` (the CPU matmul
tuner's choice per weight shape and row count, decoding/cpu/matmul.py), ``verify_cost.json``
(tree auto's verifier pass costs, decoding/autotree.py), ``kernels/`` (the thin-GEMM kernel
built for this CPU, decoding/cpu/kernel.py) and ``verifiers/`` (a GGUF verifier's de-quantized
copy, decoding/verifier_copy.py). Keys name the machine, the device type, the dtype
and (for verify costs) the verifier. ``python -m decoding cache show|clear|warm`` prints, removes or
fills them.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import time
from pathlib import Path

from drafters.atomic import write_text_atomic


def cache_dir() -> Path:
    return Path(os.environ.get("TASKSPEC_CACHE", Path.home() / ".cache" / "taskspec"))


def load_json_cache(path: Path) -> dict:
    """A measurement cache (JSON); missing or unreadable = empty."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def save_json_cache(path: Path, data: dict) -> None:
    """Write a measurement cache atomically; a read-only home only means measuring again next time."""
    try:
        write_text_atomic(path, json.dumps(data, indent=1, sort_keys=True))
    except OSError:
        pass


def add_to_json_cache(path: Path, key: str, value) -> None:
    """Add one entry to a measurement cache that other processes on this machine write too (a
    grid's workers, a parallel test suite): read, add and write under an exclusive lock, so no
    process's entries are lost to another's write of what it read earlier."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_name(path.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            data = load_json_cache(path)
            data[key] = value
            save_json_cache(path, data)
    except OSError:
        pass


def show(root: Path | None = None) -> str:
    """What the caches hold: one line per file and per entry key."""
    root = root or cache_dir()
    lines = [f"cache directory {root}" + ("" if root.exists() else " (empty: nothing measured yet)")]
    for name in ("cpu_matmul.json", "verify_cost.json"):
        data = load_json_cache(root / name)
        lines.append(f"{name}: {len(data)} entr{'y' if len(data) == 1 else 'ies'}")
        lines += [f"  {key}: {json.dumps(value, sort_keys=True)}" for key, value in sorted(data.items())]
    kernels = sorted((root / "kernels").glob("*.so")) if (root / "kernels").is_dir() else []
    lines.append(f"kernels/: {len(kernels)} built" + "".join(f"\n  {k.name}" for k in kernels))
    copies = sorted(p for p in (root / "verifiers").iterdir() if p.is_dir()) if (root / "verifiers").is_dir() else []
    lines.append(f"verifiers/: {len(copies)} de-quantized cop{'y' if len(copies) == 1 else 'ies'}"
                 + "".join(f"\n  {c.name}" for c in copies))
    return "\n".join(lines)


def clear(root: Path | None = None) -> list[str]:
    """Remove every cache file (the next run measures and builds again). Returns what was removed."""
    root = root or cache_dir()
    gone = []
    for name in ("cpu_matmul.json", "verify_cost.json"):
        if (root / name).exists():
            (root / name).unlink()
            gone.append(name)
        (root / f"{name}.lock").unlink(missing_ok=True)
    for sub in ("kernels", "verifiers"):
        if (root / sub).is_dir():
            shutil.rmtree(root / sub)
            gone.append(f"{sub}/")
    return gone


def warm(verifier: str, threads: list[int], dtypes: list[str]) -> int:
    """Fill this machine's caches for a verifier before work that runs many processes at once:
    the de-quantized copy, the kernel, and the matmul tables per thread count and dtype, timed
    now, on quiet cores (timings taken while other processes hold the cores are never cached, so
    a busy test suite or grid would time them again in every process)."""
    import torch

    from .cpu import matmul as cpu_matmul  # (imports this module: lazily)
    from .verifiers import load_verifier

    bad = [d for d in dtypes if d not in ("float32", "bfloat16", "float16")]
    if bad:
        raise ValueError(f"--dtypes: unknown dtype(s) {bad}; use float32, bfloat16 or float16")
    for dtype in dtypes:
        for n in threads:
            torch.set_num_threads(n)
            t = time.time()
            model, _ = load_verifier(verifier, dtype=dtype, matmul_forms=False)
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
