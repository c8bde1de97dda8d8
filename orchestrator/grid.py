"""The study's grid as data: which drafters to train and merge, and which evaluation cells to run.

Pure Python (no torch, no Ray): the driver, the dry run and the tests all read the same plan.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from decoding.config import DecodeConfig
from decoding.hedge import HedgeConfig
from drafters.corpora import CORPORA, variant_corpora
from workers.eval_worker import EvalJob

from .keys import key_of
from .profile.schema import Profile


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


# EvalCell fields whose default leaves a cell's key as it was before the field existed (a key rule: the
# values runs had, written out, not DecodeConfig's defaults, which they equal today)
KEY_DEFAULTS = {"tree": "fixed", "route_score": "path", "switch_after": 2, "switch_to": "specialist",
                "switch_depth": 2, "decide_steps": None, "prompts": None, "hedge_learner": "ftl",
                "hedge_feedback": "agreement", "hedge_reset": "turn", "hedge_ties": "lower", "hedge_eta": 0.5}


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
    tree: str = "fixed"  # fixed: the profile's tree; auto: fitted to machine and drafters (decoding/autotree.py)
    # the strategy options the cell sets: DecodeConfig's fields of the same names (decode_config), its defaults
    route_score: str = DecodeConfig.route_score
    switch_after: int = DecodeConfig.switch_after
    switch_to: str = DecodeConfig.switch_to
    switch_depth: int = DecodeConfig.switch_depth
    decide_steps: int | None = None  # turn/prompt routing: None = eval.routing_decide_steps
    prompts: int | None = None  # prompts per benchmark; None = eval.benchmarks' count
    hedge_learner: str = DecodeConfig.hedge_learner  # hedge: decoding/hedge.py's options (the first router's)
    hedge_feedback: str = DecodeConfig.hedge_feedback
    hedge_reset: str = DecodeConfig.hedge_reset
    hedge_ties: str = DecodeConfig.hedge_ties
    hedge_eta: float = DecodeConfig.hedge_eta

    @property
    def key(self) -> str:
        d = asdict(self)
        for k, default in KEY_DEFAULTS.items():  # keys of cells at the defaults are what they were before
            if d[k] == default:
                del d[k]
        return key_of(d)

    @property
    def label(self) -> str:
        g = f"/{self.routing_granularity}" if self.strategy in ROUTED_STRATEGIES else ""
        g += "/node" if self.route_score == "node" and self.strategy in ROUTED_STRATEGIES else ""
        g += f"/k={self.switch_after}" + ("->merged" if self.switch_to == "merged" else "") \
            if self.strategy == "switching" else ""
        g += f"/d={self.switch_depth}" if self.strategy == "depth_adaptive" else ""
        spec = self.hedge.label if self.strategy == "hedge" else ""
        g += f"/{spec.replace(', ', '/')}" if spec else ""
        d = "/dedup" if self.merge_dedup else ""
        b = f"@{self.total_tokens}" if self.budget_matched else ""
        a = "[auto]" if self.tree == "auto" else ""
        n = f"[n={self.prompts}]" if self.prompts is not None else ""
        what = f"{self.backbone}:{self.strategy}{g}{d}:{self.drafter}{b}{a}{n}"
        return f"{what}|{self.benchmark}|T={self.temperature:g}"


    @property
    def hedge(self) -> HedgeConfig:
        return HedgeConfig(eta=self.hedge_eta, reset=self.hedge_reset, learner=self.hedge_learner,
                           feedback=self.hedge_feedback, ties=self.hedge_ties)


ROUTED_STRATEGIES = ("confidence", "entropy", "switching", "depth_adaptive")


def decode_config(p: Profile, cell: EvalCell) -> DecodeConfig:
    """The one DecodeConfig a cell decodes with: its strategy and options, the profile's tree at the
    cell's budget (autoregressive verifies the root alone; its tree keeps the smallest budget, 2)."""
    e = p.eval
    tree = replace(e.tree, total_tokens=2 if cell.strategy == "autoregressive" else cell.total_tokens)
    return DecodeConfig(strategy=cell.strategy, temperature=cell.temperature, max_new_tokens=e.max_new_tokens,
                        seed=e.seed, routing_granularity=cell.routing_granularity,
                        routing_decide_steps=e.routing_decide_steps if cell.decide_steps is None else cell.decide_steps,
                        merge_dedup=cell.merge_dedup, merge_budget=cell.strategy == "merged" and cell.budget_matched,
                        route_score=cell.route_score, switch_after=cell.switch_after, switch_to=cell.switch_to,
                        switch_depth=cell.switch_depth, hedge_learner=cell.hedge_learner,
                        hedge_feedback=cell.hedge_feedback, hedge_reset=cell.hedge_reset, hedge_ties=cell.hedge_ties,
                        hedge_eta=cell.hedge_eta, tree=tree)


def eval_job(p: Profile, cell: EvalCell) -> EvalJob:
    """What the driver sends an eval actor for one cell (workers/eval_worker.py)."""
    return EvalJob(decode_config(p, cell), cell.key, cell.drafter, cell.benchmark, cell.budget_matched, cell.tree,
                   p.eval.paired_baseline, p.eval.system_prompt)


def train_cells(p: Profile) -> list[TrainCell]:
    return [TrainCell(b, v) for b in p.train.backbones for v in p.train.for_backbone(b).variants]


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
    cells = []
    for bench in e.benchmarks:
        for temp in e.temperatures:
            base = dict(benchmark=bench, temperature=float(temp), routing_granularity="step", merge_dedup=False,
                        total_tokens=e.tree.total_tokens)
            mk = lambda **kw: EvalCell(**(base | kw))  # noqa: E731
            if "autoregressive" in e.strategies:
                cells.append(mk(backbone="none", drafter="-", strategy="autoregressive", total_tokens=1))
            for b in p.train.backbones:
                cells += _backbone_cells(p, b, mk)
    return [_rq1_sized(p, c) for c in cells]


def _backbone_cells(p: Profile, b: str, mk) -> list[EvalCell]:
    """One backbone's cells for one benchmark and temperature (``mk`` fills those in)."""
    e, tt, out = p.eval, p.eval.tree.total_tokens, []
    variants = p.train.for_backbone(b).variants  # (train.per_backbone may train fewer)
    names = [v for v in e.route_pair if v in variants]
    pair, pair_name = tuple(f"{b}-{v}" for v in names), "+".join(names)
    if "single" in e.strategies:
        for v in variants:
            out.append(mk(backbone=b, drafter=v, strategy="single", drafters=(f"{b}-{v}",)))
        for m in merge_cells(p):
            if m.backbone == b:
                out.append(mk(backbone=b, drafter=m.name.split("-", 1)[1], strategy="single", drafters=(m.name,)))
        if e.budget_matched and "merged" in e.strategies:
            budget = len(pair) * (tt - 1) + 1  # a merged tree verifies every drafter's nodes
            for d in pair:
                out.append(mk(backbone=b, drafter=d.split("-", 1)[1], strategy="single", drafters=(d,),
                              total_tokens=budget, budget_matched=True))
    for s in ("confidence", "entropy"):
        if s in e.strategies:
            for g in e.routing_granularities:
                out.append(mk(backbone=b, drafter=pair_name, strategy=s, routing_granularity=g, drafters=pair))
    merged = lambda **kw: mk(backbone=b, drafter=pair_name, strategy="merged", drafters=pair, **kw)  # noqa: E731
    if "merged" in e.strategies:
        for dd in e.merge_dedup:
            out.append(merged(merge_dedup=bool(dd)))
            if e.budget_matched:  # the union reranked to one tree's budget, beside the concatenation
                out.append(merged(merge_dedup=bool(dd), budget_matched=True))
    for s in e.tree_auto:  # the same compositions with the tree fitted to this machine
        if s == "single":
            out += [mk(backbone=b, drafter=d.split("-", 1)[1], strategy="single", drafters=(d,), tree="auto")
                    for d in pair]
        else:
            out.append(mk(backbone=b, drafter=pair_name, strategy=s, drafters=pair, tree="auto"))
    # the study's routers (posthoc_confidence has no cell: the report computes it from the single cells)
    merged_names = {m.name.split("-", 1)[1] for m in merge_cells(p) if m.backbone == b}
    heads_ok = set(e.heads) <= set(variants) | merged_names
    if "entropy_heads" in e.routers and heads_ok:  # its code: lowest draft entropy over heads, per prompt turn
        out.append(mk(backbone=b, drafter="+".join(e.heads), strategy="entropy", routing_granularity="turn",
                      decide_steps=1, drafters=tuple(f"{b}-{h}" for h in e.heads)))
    # its text's router: once per prompt on mean node confidence; switching and depth_adaptive start from it
    per_prompt = dict(routing_granularity="prompt", route_score="node", decide_steps=1)
    if "prompt_confidence" in e.routers:
        out.append(mk(backbone=b, drafter=pair_name, strategy="confidence", drafters=pair, **per_prompt))
    if "switching" in e.strategies:
        for k in e.switch_after:
            for to in e.switch_to:
                out.append(mk(backbone=b, drafter=pair_name, strategy="switching", drafters=pair, switch_after=k,
                              switch_to=to, **per_prompt))
    if "hedge" in e.strategies:  # the online router over the route pair (decoding/hedge.py), per learner x reset
        for learner in e.hedge_learners:
            for reset in e.hedge_resets:
                out.append(mk(backbone=b, drafter=pair_name, strategy="hedge", drafters=pair,
                              hedge_learner=learner, hedge_reset=reset, hedge_feedback=e.hedge_feedback,
                              hedge_ties=e.hedge_ties, hedge_eta=e.hedge_eta))
    if "depth_adaptive" in e.strategies and e.mixed_variant in variants:  # (mixed, specialists), one budget
        out.append(mk(backbone=b, drafter=f"{e.mixed_variant}+{pair_name}", strategy="depth_adaptive",
                      drafters=(f"{b}-{e.mixed_variant}", *pair), switch_depth=e.switch_depth, **per_prompt))
        if not (e.budget_matched and "merged" in e.strategies):  # its budget-matched rival, merged@total_tokens
            out.append(merged(budget_matched=True))
    return out


def rq1_backbone(p: Profile) -> str:
    return p.eval.rq1_backbone or p.train.backbones[0]


def _rq1_sized(p: Profile, c: EvalCell) -> EvalCell:
    """RQ1's cells (single math / chat, fixed tree, T=0, eval.rq1_backbone) get eval.rq1_prompts prompts."""
    e = p.eval
    if e.rq1_prompts is None or c.strategy != "single" or c.drafter not in ("math", "chat") or c.budget_matched \
            or c.tree != "fixed" or c.temperature != 0.0 or c.backbone != rq1_backbone(p):
        return c
    return replace(c, prompts=e.rq1_prompts)


def cell_prompts(p: Profile, cell: EvalCell) -> int | None:
    """Prompts a cell reads per benchmark (None = all of them)."""
    return cell.prompts if cell.prompts is not None else p.eval.benchmarks[cell.benchmark]


def pool_sizes(p: Profile) -> dict:
    """Per benchmark, the most prompts any cell reads (None = all): the driver draws this pool with
    eval.seed, then each cell with fewer draws its own from the pool (so its prompts are a subset)."""
    out = dict(p.eval.benchmarks)
    for c in eval_cells(p):
        n, have = cell_prompts(p, c), out[c.benchmark]
        out[c.benchmark] = None if n is None or have is None else max(n, have)
    return out


BENCHMARK_SIZES = {"mt_bench": 80, "gsm8k": 1319, "math500": 500, "svamp": 1000}  # prompts each (local copies)


def corpora(p: Profile) -> list[str]:
    """The corpora the trained variants read (math: mathinstruct; chat: sharegpt; mixed: both)."""
    need = {c for v in p.train.variants for c in variant_corpora(v)}
    return [c for c in CORPORA if c in need]


def plan_summary(p: Profile) -> dict:
    t, m, ev = train_cells(p), merge_cells(p), eval_cells(p)
    per_bench = {b: (n or BENCHMARK_SIZES[b]) for b, n in pool_sizes(p).items()}  # null = every prompt
    n_prompt_runs = sum(cell_prompts(p, c) or BENCHMARK_SIZES[c.benchmark] for c in ev)
    return {"features": corpora(p), "train": [c.name for c in t], "merge": [c.name for c in m],
            "eval_cells": len(ev), "eval_prompt_runs": n_prompt_runs, "prompts_total": sum(per_bench.values())}
