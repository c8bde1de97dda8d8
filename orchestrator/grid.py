"""The study's grid as data: which drafters to train and merge, and which evaluation cells to run.

Pure Python (no torch, no Ray): the driver, the dry run and the tests all read the same plan.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field

from .profile import Profile


def key_of(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class TrainCell:
    backbone: str
    variant: str

    @property
    def name(self) -> str:
        return f"{self.backbone}-{self.variant}"


@dataclass(frozen=True)
class MergeCell:
    backbone: str
    kind: str  # linear | task_arithmetic | ties
    lam: float | None = None

    @property
    def name(self) -> str:
        return f"{self.backbone}-avg{self.lam:g}" if self.kind == "linear" else f"{self.backbone}-{self.kind}"


@dataclass(frozen=True)
class EvalCell:
    backbone: str  # "none" for the autoregressive baseline
    drafter: str  # display name: variant, merge name, "math+chat" for compositions, "-" for AR
    strategy: str
    routing_granularity: str
    merge_dedup: bool
    benchmark: str
    temperature: float
    total_tokens: int
    drafters: tuple = field(default_factory=tuple)  # checkpoint names (train/merge cell names)
    budget_matched: bool = False
    tree: str = "fixed"  # fixed: the profile's tree; auto: fitted to the machine and drafters (decoding/autotree.py)

    @property
    def key(self) -> str:
        d = asdict(self)
        if d["tree"] == "fixed":  # keys of fixed-tree cells are what they were before tree auto existed
            del d["tree"]
        return key_of(d)

    @property
    def label(self) -> str:
        g = f"/{self.routing_granularity}" if self.strategy in ("confidence", "entropy") else ""
        d = "/dedup" if self.merge_dedup else ""
        b = f"@{self.total_tokens}" if self.budget_matched else ""
        a = "[auto]" if self.tree == "auto" else ""
        return f"{self.backbone}:{self.strategy}{g}{d}:{self.drafter}{b}{a}|{self.benchmark}|T={self.temperature:g}"


def train_cells(p: Profile) -> list[TrainCell]:
    return [TrainCell(b, v) for b in p.train.backbones for v in p.train.variants]


def merge_cells(p: Profile) -> list[MergeCell]:
    out = []
    for b in p.train.backbones:
        if "linear" in p.merge.kinds:
            lams = p.merge.lambdas if b in p.merge.sweep_backbones else [0.5]
            out += [MergeCell(b, "linear", float(lam)) for lam in sorted(set(lams) | {0.5})]
        for kind in ("task_arithmetic", "ties"):  # the stronger merges, beside the lambda sweep
            if kind in p.merge.kinds and b in p.merge.sweep_backbones:
                out.append(MergeCell(b, kind))
    return out


def eval_cells(p: Profile) -> list[EvalCell]:
    e = p.eval
    tt = e.tree.total_tokens
    cells = []
    for bench in e.benchmarks:
        for temp in e.temperatures:
            temp = float(temp)
            mk = lambda **kw: EvalCell(benchmark=bench, temperature=temp, **{"routing_granularity": "step", "merge_dedup": False, "total_tokens": tt, **kw})  # noqa: E731
            if "autoregressive" in e.strategies:
                cells.append(mk(backbone="none", drafter="-", strategy="autoregressive", total_tokens=1))
            for b in p.train.backbones:
                pair = tuple(f"{b}-{v}" for v in e.route_pair if v in p.train.variants)
                pair_name = "+".join(v for v in e.route_pair if v in p.train.variants)
                if "single" in e.strategies:
                    for v in p.train.variants:
                        cells.append(mk(backbone=b, drafter=v, strategy="single", drafters=(f"{b}-{v}",)))
                    for m in merge_cells(p):
                        if m.backbone == b:
                            cells.append(mk(backbone=b, drafter=m.name.split("-", 1)[1], strategy="single", drafters=(m.name,)))
                    if e.budget_matched and "merged" in e.strategies:
                        budget = len(pair) * (tt - 1) + 1  # a merged tree verifies every drafter's nodes
                        for d in pair:
                            cells.append(mk(backbone=b, drafter=d.split("-", 1)[1], strategy="single", drafters=(d,),
                                            total_tokens=budget, budget_matched=True))
                for s in ("confidence", "entropy"):
                    if s in e.strategies:
                        for g in e.routing_granularities:
                            cells.append(mk(backbone=b, drafter=pair_name, strategy=s, routing_granularity=g, drafters=pair))
                if "merged" in e.strategies:
                    for dd in e.merge_dedup:
                        cells.append(mk(backbone=b, drafter=pair_name, strategy="merged", merge_dedup=bool(dd), drafters=pair))
                        if e.budget_matched:  # the union reranked to one tree's budget, beside the concatenation
                            cells.append(mk(backbone=b, drafter=pair_name, strategy="merged", merge_dedup=bool(dd),
                                            drafters=pair, budget_matched=True))
                for s in e.tree_auto:  # the same compositions with the tree fitted to this machine
                    if s == "single":
                        for d in pair:
                            cells.append(mk(backbone=b, drafter=d.split("-", 1)[1], strategy="single", drafters=(d,), tree="auto"))
                    else:
                        cells.append(mk(backbone=b, drafter=pair_name, strategy=s, drafters=pair, tree="auto"))
    return cells


BENCHMARK_SIZES = {"mt_bench": 80, "gsm8k": 1319, "math500": 500, "svamp": 1000}  # prompts each (local copies)


def corpora(p: Profile) -> list[str]:
    """The corpora the trained variants read (math: mathinstruct; chat: sharegpt; mixed: both)."""
    vs = set(p.train.variants)
    return [c for c, need in (("mathinstruct", vs - {"chat"}), ("sharegpt", vs - {"math"})) if need]


def plan_summary(p: Profile) -> dict:
    t, m, ev = train_cells(p), merge_cells(p), eval_cells(p)
    per_bench = {b: (n or BENCHMARK_SIZES[b]) for b, n in p.eval.benchmarks.items()}  # null = every prompt
    n_prompt_runs = sum(per_bench[c.benchmark] for c in ev)
    return {"features": corpora(p), "train": [c.name for c in t], "merge": [c.name for c in m],
            "eval_cells": len(ev), "eval_prompt_runs": n_prompt_runs, "prompts_total": sum(per_bench.values())}
