"""Stream the elements of a (possibly truncated) top-level JSON array without loading it whole."""
from __future__ import annotations

import json
from collections.abc import Iterator
from typing import IO


def iter_json_array(f: IO[str], chunk_chars: int = 1 << 20, stats: dict | None = None) -> Iterator:
    """Yield each element of a JSON array read from a text stream, one at a time.

    A file cut off mid-element ends the iteration; ``stats["truncated_chars"]`` then holds the size
    of the incomplete tail (0 for a well-formed array). Memory stays at about one chunk + one element.
    """
    decoder = json.JSONDecoder()
    buf = ""
    pos = 0
    eof = False

    def fill() -> bool:
        nonlocal buf, pos, eof
        chunk = f.read(chunk_chars)
        if not chunk:
            eof = True
            return False
        buf = buf[pos:] + chunk
        pos = 0
        return True

    def skip(chars: str) -> None:
        nonlocal pos
        while True:
            while pos < len(buf) and buf[pos] in chars:
                pos += 1
            if pos < len(buf) or not fill():
                return

    skip(" \t\r\n")
    if pos >= len(buf) or buf[pos] != "[":
        raise ValueError("not a JSON array: the first non-space character is not '['")
    pos += 1
    stats = stats if stats is not None else {}
    stats["truncated_chars"] = 0
    while True:
        skip(" \t\r\n,")
        if pos >= len(buf):
            return  # EOF right after a complete element (missing "]")
        if buf[pos] == "]":
            return
        while True:
            try:
                obj, end = decoder.raw_decode(buf, pos)
                break
            except json.JSONDecodeError:
                if eof or not fill():
                    stats["truncated_chars"] = len(buf) - pos
                    return
        pos = end
        yield obj
