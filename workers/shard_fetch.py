"""One feature shard fetched from object storage: the whole file, or only the tensors a reader needs.

A shard is a safetensors file (drafters/features.py): an 8-byte little-endian header length, the
JSON header (per tensor its dtype, shape and byte range in the data; ``__metadata__`` holds the
shard's example ids), then the data. A reader that needs only some tensors (EAGLE-2 and HASS:
everything but EAGLE-3's ``aux`` layers, three quarters of an EAGLE-3 shard's bytes) reads the
header with one ranged read, then only those tensors' byte ranges (adjacent ones merged), through
pyarrow's random-access file (``read_at``: a ranged GET on S3 or GCS), and writes them locally as
a smaller safetensors file of those tensors, with the same metadata, in the same order: the same
tensors, bit for bit, as reading the whole file. The shards at the store are unchanged, so caches
written by older runs read the same way. Every fetch writes a temp file and renames it: a reader
never sees a half-written shard. Torch-free.
"""
from __future__ import annotations

import functools
import json
import os
import struct
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path

from common import storage

CHUNK = 64 << 20  # bytes per ranged read: a 1 GiB shard is 16 reads (each a GET: its latency paid 16 times)
HEADER_GUESS = 16 << 10  # the first read: the header fits it (a 1 GiB shard's: a few KiB of ids and entries)


@dataclass(frozen=True)
class Plan:
    """What to fetch of one shard: ``head`` bytes written first (b"" for the whole file), then the
    ``ranges`` (offset, length) of the remote file in order; ``size`` the local file's bytes."""

    head: bytes
    ranges: tuple
    size: int


@functools.lru_cache(maxsize=64)
def _directory(parent: str, endpoint: tuple):
    return storage.filesystem(parent)  # one client per cache directory (and endpoint), not one per read


def _open(ref: str):
    parent, name = str(ref).rsplit("/", 1)
    filesystem, path = _directory(parent, tuple(sorted(storage.endpoint_env().items())))
    return filesystem.open_input_file(f"{path.rstrip('/')}/{name}")


def whole(size: int) -> Plan:
    return Plan(b"", ((0, size),) if size else (), size)


def read_header(f) -> tuple[dict, int, int]:
    """(the JSON header, the data's offset in the file, bytes read) of an open random-access
    safetensors file: one read, two if the header is longer than ``HEADER_GUESS``."""
    first = f.read_at(min(HEADER_GUESS, f.size()), 0)
    (n,) = struct.unpack("<Q", first[:8])
    if n > 100 << 20 or 8 + n > f.size():
        raise ValueError(f"not a safetensors file (header of {n} bytes in a file of {f.size()})")
    if 8 + n <= len(first):
        return json.loads(bytes(first[8 : 8 + n])), 8 + n, len(first)
    return json.loads(bytes(f.read_at(n, 8))), 8 + n, len(first) + n


def view_plan(header: dict, data_start: int, tensors) -> Plan | None:
    """The plan of a local file holding only ``tensors`` (those the shard has) with the header's
    metadata; None when the shard holds no other tensor (fetch it whole)."""
    names = [k for k in header if k != "__metadata__"]
    keep = sorted((k for k in names if k in set(tensors)), key=lambda k: header[k]["data_offsets"][0])
    if len(keep) == len(names):
        return None
    out = {}
    ranges = []
    pos = 0
    if "__metadata__" in header:
        out["__metadata__"] = header["__metadata__"]
    for k in keep:
        a, b = header[k]["data_offsets"]
        out[k] = {"dtype": header[k]["dtype"], "shape": header[k]["shape"], "data_offsets": [pos,
                pos + b - a]}
        pos += b - a
        if ranges and ranges[-1][0] + ranges[-1][1] == data_start + a:  # adjacent: one read
            ranges[-1] = (ranges[-1][0], ranges[-1][1] + b - a)
        else:
            ranges.append((data_start + a, b - a))
    text = json.dumps(out, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # as safetensors pads it: the data starts 8-byte aligned
    head = struct.pack("<Q", len(text)) + text
    return Plan(head, tuple(ranges), len(head) + pos)


def plan_for(ref: str, tensors) -> tuple[Plan | None, int]:
    """(view_plan of ``ref`` for ``tensors``, bytes read to find it: the header's)."""
    with _open(ref) as f:
        header, start, nread = read_header(f)
    return view_plan(header, start, tensors), nread


def download(ref: str, local: Path, plan: Plan) -> int:
    """Write ``plan`` of ``ref`` to ``local`` (a temp file, then renamed); returns the bytes read."""
    local.parent.mkdir(parents=True, exist_ok=True)
    tmp = local.parent / f".{local.name}.{os.getpid()}.{threading.get_ident()}.{uuid.uuid4().hex[:6]}.tmp"
    got = 0
    try:
        with _open(ref) as f, open(tmp, "wb") as out:
            out.write(plan.head)
            for offset, length in plan.ranges:
                for a in range(offset, offset + length, CHUNK):
                    buf = f.read_at(min(CHUNK, offset + length - a), a)
                    out.write(buf)
                    got += len(buf)
        if tmp.stat().st_size != plan.size:
            raise OSError(f"feature shard {ref}: fetched {tmp.stat().st_size} bytes, expected {plan.size}")
        os.replace(tmp, local)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return got


def complete(local: Path, size: int) -> bool:
    """Whether ``local`` is a whole fetched file of ``size`` bytes (a fetch renames it there only then)."""
    try:
        return local.stat().st_size == size
    except FileNotFoundError:
        return False
