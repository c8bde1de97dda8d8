"""What a profile asks the claims to cover: backbones, temperatures, benchmarks and the averaging
sweep's lambdas. It fixes the study's Holm family before any trace is read (family.py) and names the
benchmarks the prompt rule counts (check.py)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import polars as pl


@dataclass(frozen=True)
class Grid:
    """What a profile asks for: backbones, temperatures, benchmarks, the averaging sweep's lambdas."""
    backbones: tuple[str, ...]
    temperatures: tuple[float, ...]
    benchmarks: tuple[str, ...]
    lambdas: tuple[float, ...] = ()
    sweep_backbones: tuple[str, ...] | None = None  # where the lambda list runs (merge.sweep_backbones); None: all

    def __post_init__(self):
        for name in ("backbones", "temperatures", "benchmarks"):
            if not getattr(self, name):
                raise ValueError(f"claims grid: {name} is empty")
        if any(not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0 for t in self.temperatures):
            raise ValueError(f"claims grid: temperatures must be finite numbers >= 0, got {self.temperatures}")
        if len(set(self.benchmarks)) != len(self.benchmarks):
            raise ValueError(f"claims grid: benchmarks repeat: {self.benchmarks}")

    @classmethod
    def from_profile(cls, prof: dict, pp: pl.DataFrame) -> Grid:
        """The grid of profile.json's ``train.backbones``, ``eval.temperatures``, ``eval.benchmarks``
        and ``merge.lambdas`` (on ``merge.sweep_backbones``); a key the profile lacks falls back to what the
        traces hold."""
        ev, tr, mg = prof.get("eval", {}), prof.get("train", {}), prof.get("merge", {})
        benches = ev.get("benchmarks") or sorted(pp["benchmark"].unique().to_list())
        backbones = tr.get("backbones") or sorted(set(pp["backbone"].unique().to_list()) - {"none"}) or ["none"]
        temps = ev.get("temperatures") or sorted(pp["temperature"].unique().to_list())
        sweep = mg.get("sweep_backbones")
        return cls(tuple(backbones), tuple(float(t) for t in temps), tuple(benches),
                   tuple(float(x) for x in mg.get("lambdas", ())), None if sweep is None else tuple(sweep))
