"""A claim, what it covers and how benchmarks are weighted.

A claim as one record, the row each of its comparisons gives, and what a check reads.

``Claim``: a claim's name, its wording (as the study, or the project, states it), what it needs from
a run, its Holm family, and its check (a function from one cell of the run to rows); beside them
the few facts that differ between claims: the study's numbers shown where the run has no cells for
it, the (backbone, temperature) keys it is checked on, and how many hypotheses of the study family
one key holds. ``Row``: one comparison of a claim (a line of tables/claims.csv). ``Cell``: what a
check reads, one backbone at one temperature (or every backbone, for a claim across backbones).

What a profile asks the claims to cover: backbones, temperatures, benchmarks and the averaging
sweep's lambdas. It fixes the study's Holm family before any trace is read (check.py) and names the
benchmarks the prompt rule counts (check.py).

The average over benchmarks as the study weights it. The study's Table 1 average is the plain mean
over MT-Bench, GSM8K, MATH-500 and SVAMP: one chat benchmark to three math ones (1 chat : 3 math). A
run with other benchmarks keeps that ratio (``STUDY_W``): the math benchmarks share 3/4 of the weight
and the chat ones 1/4, each class split equally inside it; a run of one class weights its benchmarks
equally. With the study's four benchmarks this is the study's own mean; with GSM8K and MT-Bench alone
(cpu-study) it is a stated reweighting, GSM8K 3/4 and MT-Bench 1/4, where the plain mean (``EQUAL_W``)
would be 1 : 1. Which checkpoint is the "best single" can differ between the two (``picks``)."""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
import polars as pl

from orchestrator.report.claims.study import evidence
from orchestrator.report.routers import mark_comparison
from orchestrator.report.stats import paired_avg_diff_ci, paired_diff_ci, verdict
from orchestrator.report.steps import StepSummary
from orchestrator.report.tables import EQUAL_W, STUDY_W, aligned, timed, weights


@dataclass(frozen=True)
class Grid:
    """What a profile asks for: backbones, temperatures, benchmarks, the averaging sweep's lambdas."""
    backbones: tuple[str, ...]
    temperatures: tuple[float, ...]
    benchmarks: tuple[str, ...]
    lambdas: tuple[float, ...] = ()
    # where the lambda list runs (merge.sweep_backbones); None: all
    sweep_backbones: tuple[str, ...] | None = None

    def __post_init__(self):
        for name in ("backbones", "temperatures", "benchmarks"):
            if not getattr(self, name):
                raise ValueError(f"claims grid: {name} is empty")
        if any(not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0 for t in self.temperatures):
            raise ValueError("claims grid: temperatures must be finite numbers >= 0, "
                             f"got {self.temperatures}")
        if len(set(self.benchmarks)) != len(self.benchmarks):
            raise ValueError(f"claims grid: benchmarks repeat: {self.benchmarks}")

    @classmethod
    def from_profile(cls, prof: dict, pp: pl.DataFrame) -> Grid:
        """The grid of profile.json's ``train.backbones``, ``eval.temperatures``, ``eval.benchmarks``
        and ``merge.lambdas`` (on ``merge.sweep_backbones``); a key the profile lacks falls back to what the
        traces hold."""
        ev = prof.get("eval", {})
        tr = prof.get("train", {})
        mg = prof.get("merge", {})
        benches = ev.get("benchmarks") or sorted(pp["benchmark"].unique().to_list())
        backbones = tr.get("backbones") or sorted(set(pp["backbone"].unique().to_list()) - {"none"}) or [
                "none"]
        temps = ev.get("temperatures") or sorted(pp["temperature"].unique().to_list())
        sweep = mg.get("sweep_backbones")
        return cls(tuple(backbones), tuple(float(t) for t in temps), tuple(benches),
                   tuple(float(x) for x in mg.get("lambdas", ())), None if sweep is None else tuple(sweep))


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


STUDY, EXPLORATORY = "study", "exploratory"
STUDY_BACKBONES = ("eagle2", "hass")  # the backbones the study's claims are about
MIN_PROMPTS = 10  # the project's rule: a bootstrap over fewer prompts per benchmark is too narrow to trust
NAN = float("nan")
TIMED_APART = "inconclusive (timed in different grid invocations)"


@dataclass(frozen=True)
class Row:
    """One comparison of a claim: its cell, the estimate with its 95% interval and p-value, the
    verdict, the claim's wording and the study's own numbers for the cell (claims/study.py)."""
    claim: str
    family: str
    backbone: str
    temperature: float
    benchmark: str | None  # None: the comparison spans benchmarks
    comparison: str
    prompts: int | None
    estimate: float | None
    ci_lo: float | None
    ci_hi: float | None
    p_value: float  # NaN: not a test
    verdict: str
    wording: str
    study: str
    study_consistent: bool | None
    study_note: str


def frame(rows: list[Row]) -> pl.DataFrame:
    """Rows as the claims table (its columns in Row's order)."""
    return pl.DataFrame([asdict(r) for r in rows], infer_schema_length=None)


@dataclass(frozen=True)
class Cell:
    """What a check reads: the per-prompt rows of the run (tables.per_prompt, with the post hoc
    routers) and its step summary (None without step traces), one backbone (None for a claim across
    backbones) at one temperature, the benchmarks the prompt rule counts, the methods this backbone
    ran at this temperature, every backbone of the run, the profile's route pair and the weighting of
    the average over benchmarks (claim.py: the study's 1 chat : 3 math)."""
    prompts: pl.DataFrame
    steps: StepSummary | None
    backbone: str | None
    temp: float
    benches: list[str]
    methods: set[str]
    backbones: list[str]
    route_pair: tuple = ("math", "chat")
    weighting: str = STUDY_W  # how ``average`` weights the benchmarks (claim.py)

    def paired(self, a: str, b: str, bench: str, num: str = "new_tokens", den: str = "verifier_calls"):
        """(num_a, den_a, num_b, den_b) of methods a and b on the prompts both ran (tables.aligned)."""
        return aligned(self.prompts, self.backbone, self.temp, bench, a, b, num, den)

    def on_bench(self, a: str, b: str, bench: str) -> tuple[tuple, int]:
        """(tau of a - tau of b on ``bench``, as (estimate, lo, hi, p)), and the prompts paired."""
        arrays = self.paired(a, b, bench)
        return paired_diff_ci(*arrays, p=True), len(arrays[0])

    def average(self, a: str, b: str, num: str = "new_tokens", den: str = "verifier_calls") -> tuple[tuple,
            int]:
        """(num/den of a - of b, mean over the benchmarks weighted as ``weighting`` says, as (estimate,
        lo, hi, p)), and the fewest prompts paired on a benchmark."""
        groups = [self.paired(a, b, bn, num, den) for bn in self.benches]
        return (paired_avg_diff_ci(groups, p=True, weights=weights(self.benches, self.weighting)),
                min(len(g[0]) for g in groups))

    def speed(self, a: str, b: str) -> tuple[tuple, int]:
        """``average`` in tokens per second (output tokens over wall-clock seconds)."""
        return self.average(a, b, "out_tokens", "wall_time_s")

    def timed(self, *methods: str) -> bool:
        """Whether every row of these methods in the cell has a wall-clock time (tables.timed)."""
        return timed(self.prompts, self.backbone, self.temp, list(methods))

    def timed_apart(self, a: str, b: str) -> bool:
        """Whether a and b were timed in different grid invocations (a resumed run: the machine's load
        may differ, so their speeds are not compared)."""
        if "invocation" not in self.prompts.columns:
            return False
        sets = []
        for m in (a, b):
            inv = self.prompts.filter((pl.col("backbone") == self.backbone)
                                      & (pl.col("temperature") == self.temp)
                                      & (pl.col("method") == m))
            sets.append(sorted(set(inv["invocation"].drop_nulls().to_list())))
        return bool(all(sets) and sets[0] != sets[1])


def every_cell(backbones: list[str], temps: list[float]) -> list[tuple[str, float]]:
    return [(bb, t) for bb in backbones for t in temps]


def one_slot(grid: Grid, backbone: str | None) -> int:
    return 1


def no_numbers(backbone: str, temp: float) -> dict:
    return evidence()


Check = Callable[["Claim", Cell], "list[Row]"]


@dataclass(frozen=True)
class Claim:
    """A claim, in one record. ``family``: ``study`` for the study's claims (on the study's backbones;
    on another backbone they are exploratory, ``family_on``), ``exploratory`` for the project's own
    and the study's proposed next experiments. ``check``: the claim's rows for one cell (``check(claim,
    cell)``). ``study``: the study's numbers for a (backbone, temperature) the run has no rows for.
    ``keys``: the (backbone, temperature) keys a run of these backbones and temperatures checks it on.
    ``slots``: the hypotheses one key of the study family holds under a profile's grid.
    ``across_backbones``: checked once per temperature over every backbone (``Cell.backbone`` None)."""
    name: str
    wording: str
    needs: str
    family: str
    check: Check
    study: Callable[[str, float], dict] = no_numbers
    keys: Callable[[list[str], list[float]], list[tuple[str, float]]] = every_cell
    slots: Callable[[Grid, str | None], int] = one_slot
    across_backbones: bool = False

    def __post_init__(self):
        if self.family not in (STUDY, EXPLORATORY):
            raise ValueError(f"claim {self.name}: family must be {STUDY!r} or {EXPLORATORY!r}, got "
                             f"{self.family!r}")
        if not self.wording or not self.needs:
            raise ValueError(f"claim {self.name}: wording and needs must not be empty")

    def family_on(self, backbone: str | None) -> str:
        """The study's claims on the study's backbones (EAGLE-2, HASS) are the study family; the same claims
        on another backbone (EAGLE-3) extend the study, and are exploratory like the project's own."""
        if self.family != STUDY:
            return EXPLORATORY
        on_study = backbone is None or set(backbone.split("+")) <= set(STUDY_BACKBONES) | {"none"}
        return STUDY if on_study else EXPLORATORY

    def rows(self, cell: Cell) -> list[Row]:
        return self.check(self, cell)

    def row(self, backbone: str, temp: float, what: str, est, lo, hi, v: str, n: int | None = None,
            p: float | None = None, study: dict | None = None, bench: str | None = None,
            family: str | None = None) -> Row:
        """One comparison; a conclusive verdict on fewer than MIN_PROMPTS prompts reads inconclusive. A
        method not lossless at ``temp`` (a post hoc router, the hindsight oracle at T>0) carries ‡ in it."""
        what = mark_comparison(what, temp)
        if n is not None and n < MIN_PROMPTS and v != "inconclusive" and not v.startswith("inconclusive ("):
            v = f"inconclusive (n={n} < {MIN_PROMPTS} prompts)"
        ev = study or evidence()
        return Row(self.name, family or self.family_on(backbone), backbone, temp, bench, what, n, est, lo, hi,
                   NAN if p is None else p, v, self.wording, ev["study"], ev["study_consistent"],
                   ev["study_note"])

    def tested(self, backbone: str, temp: float, what: str, result: tuple, n: int, study: dict | None = None,
               expected_positive: bool = True, bench: str | None = None, family: str | None = None) -> Row:
        """A row from a bootstrap ``result`` (estimate, lo, hi, p) of (claimed better - other)."""
        est, lo, hi, p = result
        return self.row(backbone, temp, what, est, lo, hi, verdict(lo, hi, expected_positive), n, p, study,
                        bench,
                        family)

    def not_run(self, backbone: str, temp: float) -> Row:
        """The row of a key the run has no cells for: inconclusive, saying what the claim needs."""
        return self.row(backbone, temp, "not in this run", None, None, None,
                        f"inconclusive (not in this run: needs {self.needs})", None, None,
                        self.study(backbone, temp))
