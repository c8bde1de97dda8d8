"""Wall-clock timing that is honest on an accelerator.

On CUDA, kernels run asynchronously: ``time.perf_counter()`` around a pass measures how long the
host took to launch it. ``Clock`` records CUDA events instead (no host sync per mark) and resolves
them after one ``finish()`` (a device sync) at the end of the timed work; ``synced_now(device)``
synchronises and then reads the host clock, for timers that need seconds right away (the bench,
tree auto's verify costs). On the CPU both are ``time.perf_counter()``.
"""
from __future__ import annotations

import statistics
import time

import torch

MAX_SPREAD = 0.5  # (max - min) / median of repeated timings beyond which they are not cached
MIN_CPU_SHARE = 0.6  # process CPU time / (wall time x threads) below which other processes held the cores


def _is_cuda(device) -> bool:
    return torch.device(device).type == "cuda"


def synchronize(device) -> None:
    """Wait for the device's queued work (no-op on the CPU)."""
    if _is_cuda(device):
        torch.cuda.synchronize()


def synced_now(device) -> float:
    """``time.perf_counter()`` after the device has finished what was queued before."""
    synchronize(device)
    return time.perf_counter()


class Clock:
    """Marks within a piece of work; ``seconds(a, b)`` is valid after ``finish()``."""

    def __init__(self, device):
        self.cuda = _is_cuda(device)
        self.finished = not self.cuda

    def mark(self):
        if not self.cuda:
            return time.perf_counter()
        self.finished = False
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def finish(self) -> None:
        """One device sync that closes every mark so far."""
        if self.cuda:
            torch.cuda.synchronize()
        self.finished = True

    def seconds(self, a, b) -> float:
        if not self.cuda:
            return b - a
        if not self.finished:
            raise RuntimeError("Clock.seconds before Clock.finish(): CUDA events are not complete")
        return a.elapsed_time(b) / 1000.0


def spread(ts: list[float]) -> float:
    """(max - min) / median of repeated timings of one thing."""
    return (max(ts) - min(ts)) / max(statistics.median(ts), 1e-12)


def cpu_share(fn):
    """(fn's result, the share of its threads' CPU time this process got while it ran): well under
    1 when other processes held the cores, so timings taken meanwhile describe a loaded machine."""
    c0, t0 = time.process_time(), time.perf_counter()
    out = fn()
    wall = max(time.perf_counter() - t0, 1e-9)
    return out, (time.process_time() - c0) / (wall * torch.get_num_threads())
