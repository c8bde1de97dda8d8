"""The caches kept per machine (measurements, kernels, verifier copies), in one directory, and a way to
see and clear them.

``$TASKSPEC_CACHE`` (default ``~/.cache/taskspec``) holds ``cpu_matmul.json`` (the CPU matmul
tuner's choice per weight shape and row count, decoding/cpu/matmul.py), ``verify_cost.json``
(tree auto's verifier pass costs, decoding/autotree.py), ``kernels/`` (the thin-GEMM kernel
built for this CPU, decoding/cpu/kernel.py) and ``verifiers/`` (a GGUF verifier's de-quantized
copy, common/verifier_copy.py). Keys name the machine, the device type, the dtype
and (for verify costs) the verifier. ``python -m decoding cache show|clear|warm`` prints, removes or
fills them (warm: decoding/cpu/warm.py).
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
from pathlib import Path

from common.atomic import write_text_atomic


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
    copies = sorted(p for p in (root / "verifiers").iterdir()
                    if p.is_dir()) if (root / "verifiers").is_dir() else []
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
