"""Progress lines: done/total, elapsed and an ETA from the units this run actually worked on."""
from __future__ import annotations

import io
import re
import time
from types import SimpleNamespace

from orchestrator.run import progress
from orchestrator.run.progress import Progress


def _etas(text: str) -> list[str]:
    return re.findall(r"ETA (\S+)", text)


def test_eta_leaves_out_units_done_earlier(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(progress, "time", SimpleNamespace(time=lambda: now[0], strftime=time.strftime))
    out = io.StringIO()
    p = Progress("eval", 6, stream=out, quiet=True)
    p.step("a (done earlier)", skipped=True)  # at once, as a resumed run skips its finished units
    p.step("b (done earlier)", skipped=True)
    for t, n in ((110.0, 1), (120.0, 1), (140.0, 2)):  # then 10 s per unit worked on
        now[0] = t
        p.step("c", n=n)
    lines = out.getvalue().splitlines()
    assert [re.search(r"(\d+)/6 done", x).group(1) for x in lines] == ["1", "2", "3", "4", "6"]
    # nothing worked yet: unknown; then 10 s per worked unit times the units left (3, then 2); at the end 0
    assert _etas(out.getvalue()) == ["?", "?", "30s", "20s", "0s"]


def test_a_training_sweep_line_counts_against_the_whole_sweep():
    # Tune creates trials lazily (one at a time here), so its own list cannot give the total
    from workers.tune_sweep import trial_line

    line = trial_line("hass-chat", 5, 8, 472.0, 0.1474)
    assert line == "trial hass-chat finished (5/8, elapsed 472s, ETA ~283s, held-out top-1 0.147)"
    assert trial_line("eagle2-math", 8, 8, 900.0) == "trial eagle2-math finished (8/8, elapsed 900s)"
