"""The average over benchmarks as the study weights it. The study's Table 1 average is the plain mean
over MT-Bench, GSM8K, MATH-500 and SVAMP: one chat benchmark to three math ones (1 chat : 3 math). A
run with other benchmarks keeps that ratio (``STUDY_W``): the math benchmarks share 3/4 of the weight
and the chat ones 1/4, each class split equally inside it; a run of one class weights its benchmarks
equally. With the study's four benchmarks this is the study's own mean; with GSM8K and MT-Bench alone
(cpu-study) it is a stated reweighting, GSM8K 3/4 and MT-Bench 1/4, where the plain mean (``EQUAL_W``)
would be 1 : 1. Which checkpoint is the "best single" can differ between the two (``picks``)."""
from __future__ import annotations

import numpy as np
import polars as pl

from ..tables import MATH_BENCH

STUDY_W = "1 chat : 3 math"  # the study's Table 1 average (its 4 benchmarks: 3 math, 1 chat)
EQUAL_W = "equal per benchmark"
MATH_SHARE = 0.75


def weights(benches: list[str], kind: str = STUDY_W) -> list[float]:
    """One weight per benchmark of ``benches`` (summing to 1) under ``kind``."""
    if kind not in (STUDY_W, EQUAL_W):
        raise ValueError(f"weighting {kind!r} is not one of {STUDY_W!r}, {EQUAL_W!r}")
    n_math = sum(b in MATH_BENCH for b in benches)
    n_chat = len(benches) - n_math
    if kind == EQUAL_W or not n_math or not n_chat:
        return [1 / len(benches)] * len(benches) if benches else []
    return [MATH_SHARE / n_math if b in MATH_BENCH else (1 - MATH_SHARE) / n_chat for b in benches]


def mean_tau(prompts: pl.DataFrame, backbone: str, temp: float, method: str, benches: list[str],
             kind: str = STUDY_W) -> float:
    """``method``'s tau (ratio of sums) per benchmark, averaged under ``kind`` over the benchmarks it
    has rows on (weights renormalised); -inf where it has none."""
    vals, ws = [], []
    for bn, w in zip(benches, weights(benches, kind)):
        g = prompts.filter((pl.col("backbone") == backbone) & (pl.col("temperature") == temp)
                           & (pl.col("method") == method) & (pl.col("benchmark") == bn))
        if g.height and g["verifier_calls"].sum() > 0:
            vals.append(g["new_tokens"].sum() / g["verifier_calls"].sum())
            ws.append(w)
    return float(np.dot(vals, ws) / sum(ws)) if vals else float("-inf")


def picks(prompts: pl.DataFrame, backbone: str, temp: float, methods: list[str], benches: list[str],
          best: bool = True) -> dict[str, str]:
    """The best (or worst) of ``methods`` by mean tau under each weighting: {weighting: method}."""
    pick = max if best else min
    return {kind: pick(sorted(methods), key=lambda m: mean_tau(prompts, backbone, temp, m, benches, kind))
            for kind in (STUDY_W, EQUAL_W)}


def named(choice: dict[str, str], what: str = "best", first: str = STUDY_W) -> str:
    """The pick of weighting ``first``, and the other weighting's after it where they differ."""
    other = EQUAL_W if first == STUDY_W else STUDY_W
    mine, theirs = choice[first], choice[other]
    return mine if mine == theirs else f"{mine}; {other}'s {what}: {theirs}"
