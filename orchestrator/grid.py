"""The study's grid as data: which drafters to train and merge, and which evaluation cells to run.

Pure Python (no torch, no Ray): the driver, the dry run and the tests all read the same plan.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import partial

from decoding.config import OPTION_COLUMNS, TREE_MODES, DecodeConfig, TreeConfig
from drafters.corpora import CORPORA, variant_corpora
from orchestrator.keys import key_of
from orchestrator.profile.schema import Profile
from workers.eval_worker import EvalJob


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
    """One evaluation cell: the DecodeConfig it decodes with (strategy, temperature, routing, the
    profile's tree at the cell's budget, the strategy's options: their defaults are DecodeConfig's)
    and what picks its drafters, prompts and tree beside it. ``record`` is the cell as runs record and
    key it, under the names records have always used."""

    backbone: str  # "none" for the autoregressive baseline
    drafter: str  # display name: variant, merge name, "math+chat" for compositions, "-" for AR
    benchmark: str
    decode: DecodeConfig
    drafters: tuple = field(default_factory=tuple)  # checkpoint names (train/merge cell names)
    budget_matched: bool = False
    tree_mode: str = TREE_MODES[0]  # fixed: decode.tree; auto: fitted on the actor (decoding/autotree.py)
    decide_steps: int | None = None  # the cell's own routing_decide_steps; None: eval.routing_decide_steps
    prompts: int | None = None  # prompts per benchmark; None = eval.benchmarks' count

    def __post_init__(self):
        if self.tree_mode not in TREE_MODES:
            raise ValueError(f"tree_mode must be one of {list(TREE_MODES)}, got {self.tree_mode!r}")

    @property
    def strategy(self) -> str:
        return self.decode.strategy

    @property
    def temperature(self) -> float:
        return self.decode.temperature

    @property
    def routing_granularity(self) -> str:
        return self.decode.routing_granularity

    @property
    def merge_dedup(self) -> bool:
        return self.decode.merge_dedup

    @property
    def total_tokens(self) -> int:
        return self.decode.budget

    @property
    def record(self) -> dict:
        """The cell as the manifest records it and its key hashes: flat, ``total_tokens`` the budget,
        ``tree`` the tree mode (its name in records and keys), the options of CELL_OPTIONS."""
        d = self.decode
        return {"backbone": self.backbone, "drafter": self.drafter, "strategy": d.strategy,
                "routing_granularity": d.routing_granularity, "merge_dedup": d.merge_dedup,
                "benchmark": self.benchmark, "temperature": d.temperature, "total_tokens": d.budget,
                "drafters": self.drafters, "budget_matched": self.budget_matched, "tree": self.tree_mode,
                **{k: getattr(d, k) for k in CELL_OPTIONS}, "decide_steps": self.decide_steps,
                "prompts": self.prompts}

    @property
    def key(self) -> str:
        d = self.record
        for k, default in KEY_DEFAULTS.items():  # keys of cells at the defaults are what they were before
            if d[k] == default:
                del d[k]
        return key_of(d)

    @property
    def label(self) -> str:
        o = self.decode
        g = f"/{o.routing_granularity}" if o.strategy in ROUTED_STRATEGIES else ""
        g += "/node" if o.route_score == "node" and o.strategy in ROUTED_STRATEGIES else ""
        g += f"/k={o.switch_after}" + ("->merged" if o.switch_to == "merged" else "") \
            if o.strategy == "switching" else ""
        g += f"/d={o.switch_depth}" if o.strategy == "depth_adaptive" else ""
        spec = o.hedge.label if o.strategy == "hedge" else ""
        g += f"/{spec.replace(', ', '/')}" if spec else ""
        d = "/dedup" if o.merge_dedup else ""
        b = f"@{self.total_tokens}" if self.budget_matched else ""
        a = "[auto]" if self.tree_mode == "auto" else ""
        n = f"[n={self.prompts}]" if self.prompts is not None else ""
        what = f"{self.backbone}:{o.strategy}{g}{d}:{self.drafter}{b}{a}{n}"
        return f"{what}|{self.benchmark}|T={o.temperature:g}"


ROUTED_STRATEGIES = ("confidence", "entropy", "switching", "depth_adaptive")
# the strategy options a cell's record carries (DecodeConfig's fields; hedge_prior: no cell sets it)
CELL_OPTIONS = OPTION_COLUMNS + tuple(f"hedge_{k}" for k in ("learner", "feedback", "reset", "ties", "eta"))
# record fields whose default leaves a cell's key as it was before the field existed (a key rule: each
# at its home's default, DecodeConfig's or EvalCell's; tests/test_keys_unchanged.py holds the keys)
KEY_DEFAULTS = {"tree": EvalCell.tree_mode, **{k: getattr(DecodeConfig, k) for k in CELL_OPTIONS},
                "decide_steps": EvalCell.decide_steps, "prompts": EvalCell.prompts}


def make_cell(p: Profile, backbone: str, drafter: str, benchmark: str, drafters: tuple = (),
              budget_matched: bool = False, tree_mode: str = TREE_MODES[0], decide_steps: int | None = None,
              total_tokens: int | None = None, **options) -> EvalCell:
    """A cell with its DecodeConfig: ``options`` (strategy, temperature and the others the cell sets)
    over the profile's decode settings, the profile's tree at ``total_tokens`` (None: the profile's)."""
    e, strategy = p.eval, options["strategy"]
    budget = TreeConfig.SMALLEST if strategy == "autoregressive" else total_tokens or e.tree.total_tokens
    steps = e.routing_decide_steps if decide_steps is None else decide_steps
    decode = DecodeConfig(max_new_tokens=e.max_new_tokens, seed=e.seed, routing_decide_steps=steps,
                          merge_budget=strategy == "merged" and budget_matched,
                          tree=replace(e.tree, total_tokens=budget), **options)
    return EvalCell(backbone, drafter, benchmark, decode, drafters, budget_matched, tree_mode, decide_steps)


def eval_job(p: Profile, cell: EvalCell) -> EvalJob:
    """What the driver sends an eval actor for one cell (workers/eval_worker.py)."""
    return EvalJob(cell.decode, cell.key, cell.drafter, cell.benchmark, cell.budget_matched, cell.tree_mode,
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
            mk = partial(make_cell, p, benchmark=bench, temperature=float(temp))
            if "autoregressive" in e.strategies:
                cells.append(mk(backbone="none", drafter="-", strategy="autoregressive"))
            for b in p.train.backbones:
                cells += _backbone_cells(p, b, mk)
    return [_rq1_sized(p, c) for c in cells]


def _backbone_cells(p: Profile, b: str, mk) -> list[EvalCell]:
    """One backbone's cells for one benchmark and temperature (``mk`` fills those in)."""
    e, out = p.eval, []
    variants = p.train.for_backbone(b).variants  # (train.per_backbone may train fewer)
    names = [v for v in e.route_pair if v in variants]
    pair, pair_name = tuple(f"{b}-{v}" for v in names), "+".join(names)
    if "single" in e.strategies:
        out += _single_cells(p, b, mk, variants, pair)
    for s in ("confidence", "entropy"):
        if s in e.strategies:
            for g in e.routing_granularities:
                out.append(mk(backbone=b, drafter=pair_name, strategy=s, routing_granularity=g,
                              drafters=pair))
    merged = partial(mk, backbone=b, drafter=pair_name, strategy="merged", drafters=pair)
    if "merged" in e.strategies:
        for dd in e.merge_dedup:
            out.append(merged(merge_dedup=bool(dd)))
            if e.budget_matched:  # the union reranked to one tree's budget, beside the concatenation
                out.append(merged(merge_dedup=bool(dd), budget_matched=True))
    for s in e.tree_auto:  # the same compositions with the tree fitted to this machine
        if s == "single":
            out += [mk(backbone=b, drafter=v, strategy=s, drafters=(d,), tree_mode="auto")
                    for v, d in zip(names, pair)]
        else:
            out.append(mk(backbone=b, drafter=pair_name, strategy=s, drafters=pair, tree_mode="auto"))
    # the study's routers (posthoc_confidence has no cell: the report computes it from the single cells)
    merged_names = {m.name.split("-", 1)[1] for m in merge_cells(p) if m.backbone == b}
    heads_ok = set(e.heads) <= set(variants) | merged_names
    # its code: lowest draft entropy over heads, per prompt turn
    if "entropy_heads" in e.routers and heads_ok:
        out.append(mk(backbone=b, drafter="+".join(e.heads), strategy="entropy", routing_granularity="turn",
                      decide_steps=1, drafters=tuple(f"{b}-{h}" for h in e.heads)))
    # its text's router: once per prompt on mean node confidence; switching and depth_adaptive start from it
    per_prompt = dict(routing_granularity="prompt", route_score="node", decide_steps=1)
    if "prompt_confidence" in e.routers:
        out.append(mk(backbone=b, drafter=pair_name, strategy="confidence", drafters=pair, **per_prompt))
    if "switching" in e.strategies:
        for k in e.switch_after:
            for to in e.switch_to:
                out.append(mk(backbone=b, drafter=pair_name, strategy="switching", drafters=pair,
                              switch_after=k,
                              switch_to=to, **per_prompt))
    # the online router over the route pair (decoding/hedge.py), per learner x reset
    if "hedge" in e.strategies:
        for learner in e.hedge_learners:
            for reset in e.hedge_resets:
                out.append(mk(backbone=b, drafter=pair_name, strategy="hedge", drafters=pair,
                              hedge_learner=learner, hedge_reset=reset, hedge_feedback=e.hedge_feedback,
                              hedge_ties=e.hedge_ties, hedge_eta=e.hedge_eta))
    if "depth_adaptive" in e.strategies and e.mixed_variant in variants:  # (mixed, specialists), one budget
        out.append(mk(backbone=b, drafter=f"{e.mixed_variant}+{pair_name}", strategy="depth_adaptive",
                      drafters=(f"{b}-{e.mixed_variant}", *pair), switch_depth=e.switch_depth, **per_prompt))
        # its budget-matched rival, merged@total_tokens
        if not (e.budget_matched and "merged" in e.strategies):
            out.append(merged(budget_matched=True))
    return out


def _single_cells(p: Profile, b: str, mk, variants: list[str], pair: tuple) -> list[EvalCell]:
    """One backbone's single-drafter cells: each variant, each merge, and (budget_matched) each drafter of
    the route pair at a merged tree's budget."""
    e, out = p.eval, []
    for v in variants:
        out.append(mk(backbone=b, drafter=v, strategy="single", drafters=(f"{b}-{v}",)))
    for m in merge_cells(p):
        if m.backbone == b:
            out.append(mk(backbone=b, drafter=m.name.split("-", 1)[1], strategy="single",
                          drafters=(m.name,)))
    if e.budget_matched and "merged" in e.strategies:
        budget = len(pair) * (e.tree.total_tokens - 1) + 1  # a merged tree verifies every drafter's nodes
        for d in pair:
            out.append(mk(backbone=b, drafter=d.split("-", 1)[1], strategy="single", drafters=(d,),
                          total_tokens=budget, budget_matched=True))
    return out


def rq1_backbone(p: Profile) -> str:
    return p.eval.rq1_backbone or p.train.backbones[0]


def _rq1_sized(p: Profile, c: EvalCell) -> EvalCell:
    """RQ1's cells (single math / chat, fixed tree, T=0, eval.rq1_backbone) get eval.rq1_prompts prompts."""
    e = p.eval
    if e.rq1_prompts is None or c.strategy != "single" or c.drafter not in ("math",
            "chat") or c.budget_matched \
            or c.tree_mode != "fixed" or c.temperature != 0.0 or c.backbone != rq1_backbone(p):
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


# prompts each (local copies)
BENCHMARK_SIZES = {"mt_bench": 80, "gsm8k": 1319, "math500": 500, "svamp": 1000}


def corpora(p: Profile) -> list[str]:
    """The corpora the trained variants read (math: mathinstruct; chat: sharegpt; mixed: both)."""
    need = {c for v in p.train.variants for c in variant_corpora(v)}
    return [c for c in CORPORA if c in need]


def plan_summary(p: Profile) -> dict:
    t = train_cells(p)
    m = merge_cells(p)
    ev = eval_cells(p)
    per_bench = {b: (n or BENCHMARK_SIZES[b]) for b, n in pool_sizes(p).items()}  # null = every prompt
    n_prompt_runs = sum(cell_prompts(p, c) or BENCHMARK_SIZES[c.benchmark] for c in ev)
    return {"features": corpora(p), "train": [c.name for c in t], "merge": [c.name for c in m],
            "eval_cells": len(ev), "eval_prompt_runs": n_prompt_runs,
            "prompts_total": sum(per_bench.values())}
