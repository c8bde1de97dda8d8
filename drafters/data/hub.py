"""The data sources' Hub step when the Hub cannot be reached (common/hub.py decides that once per
process): the ``datasets`` call in the libraries' offline mode, its failure one line.

A local path (a ``TASKSPEC_HUB_<NAME>`` directory) is never probed. Offline or unreachable, the
``datasets`` call runs in the libraries' offline mode (their local cache only, no network) and its
failure is one :class:`HubUnreachable`.
"""
from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from common.hub import is_local, offline_library, unreachable


class HubUnreachable(ConnectionError):
    """The Hub step found no data: offline or the endpoint unreachable, and no usable cached copy.
    ``fix`` says what gives Hub access back."""

    def __init__(self, message: str, fix: str):
        super().__init__(message)
        self.fix = fix


@contextmanager
def _offline_libraries() -> Iterator[None]:
    """huggingface_hub (common/hub.py) and datasets in offline mode (cache only) for one call, quiet."""
    import datasets.config

    saved, log = datasets.config.HF_HUB_OFFLINE, logging.getLogger("datasets")
    level = log.level
    datasets.config.HF_HUB_OFFLINE = True
    log.setLevel(logging.ERROR)
    try:
        with offline_library():
            yield
    finally:
        datasets.config.HF_HUB_OFFLINE = saved
        log.setLevel(level)


@contextmanager
def reach(path: str) -> Iterator[None]:
    """Around the ``datasets`` call for ``path``: a local path or a reachable Hub, the call as it
    is; offline or unreachable, the call in offline mode, a failure raised as :class:`HubUnreachable`
    (the Hub's local cache has no usable copy)."""
    state = None if is_local(path) else unreachable()
    if state is None:
        yield
        return
    why, fix = state
    with _offline_libraries():
        try:
            yield
        except Exception as e:  # noqa: BLE001 - one line for whatever the offline call met
            missing = isinstance(e, (ConnectionError, FileNotFoundError))
            cached = ("not in the local Hugging Face cache" if missing
                      else "its cached copy: " + " ".join(f"{type(e).__name__}: {e}".split())[:120])
            raise HubUnreachable(f"skipped: {why}; {cached}", fix) from e
