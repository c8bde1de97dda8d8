"""Profiles: validated, frozen dataclasses loaded from experiments/profiles/*.yaml.

Unknown or misspelled keys are errors; every value is checked before any work starts, each
field against the rule in its class's ``RULES`` (type and range), then the cross-field checks.
A bad profile is refused with one line: the file (and the ``--set`` that caused it), the key,
what is allowed and what was given. ``--set a.b=c`` overrides parse ``c`` as YAML (numbers,
lists, booleans).
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import typing
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from common.dtypes import NAMES as DTYPES
from drafters.corpora import VARIANTS

PROFILE_DIR = Path(__file__).resolve().parents[1] / "experiments" / "profiles"
STRATEGIES = ("autoregressive", "single", "confidence", "entropy", "merged", "switching", "depth_adaptive",
              "hedge")
# the study's own; switching and depth_adaptive are its proposed next steps; hedge the online router (issue 57)
STUDY_STRATEGIES = STRATEGIES[:5]
# the study's routers by name: posthoc_confidence (its code's run_confidence_router_tau.py, computed by the
# report from the single-drafter traces), entropy_heads (its gen_routing_eval.py: lowest draft entropy over
# eval.heads, per prompt turn), prompt_confidence (its text: once per prompt, mean node confidence c(v))
ROUTERS = ("posthoc_confidence", "entropy_heads", "prompt_confidence")
SWITCH_TO = ("specialist", "merged")
BENCHMARKS = ("mt_bench", "gsm8k", "math500", "svamp")
BACKBONES = ("eagle2", "hass", "eagle3")
MERGE_KINDS = ("linear", "task_arithmetic", "ties")
GRANULARITIES = ("step", "turn", "prompt")


class ProfileError(ValueError):
    """A refused profile; ``key`` is the dotted profile key at fault (None: the file as a whole)."""

    def __init__(self, msg: str, key: str | None = None):
        super().__init__(msg)
        self.key = key


def _need(cond: bool, msg: str, key: str | None = None) -> None:
    if not cond:
        raise ProfileError(msg, key)


# ---------------------------------------------------------------- per-field rules: (what is allowed, test)
@dataclass(frozen=True)
class Rule:
    allowed: str  # completes "<key> must be ..."
    ok: Callable[[object], bool]


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)  # YAML true/false are bools, and bool is an int


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _bounds(lo, hi, lo_open: bool) -> str:
    if lo is not None and hi is not None:
        return f" in {'(' if lo_open else '['}{lo:g}, {hi:g}]"
    return f" {'>' if lo_open else '>='} {lo:g}" if lo is not None else ""


def _in(v, lo, hi, lo_open: bool) -> bool:
    return (lo is None or (v > lo if lo_open else v >= lo)) and (hi is None or v <= hi)


def integer(lo: int | None = None, hi: int | None = None) -> Rule:
    return Rule("an integer" + _bounds(lo, hi, False), lambda v: _is_int(v) and _in(v, lo, hi, False))


def number(lo: float | None = None, hi: float | None = None, lo_open: bool = False) -> Rule:
    return Rule("a number" + _bounds(lo, hi, lo_open), lambda v: _is_num(v) and _in(v, lo, hi, lo_open))


def _words(choices) -> str:
    w = ["null" if c is None else str(c) for c in choices]
    return w[0] if len(w) == 1 else ", ".join(w[:-1]) + " or " + w[-1]


def one_of(*choices) -> Rule:  # strings (and None): 1 == True, so never for ints
    return Rule(_words(choices), lambda v: (v is None or isinstance(v, str)) and v in choices)


def optional(rule: Rule) -> Rule:
    return Rule("null or " + rule.allowed, lambda v: v is None or rule.ok(v))


def text(nonempty: bool = False) -> Rule:
    return Rule("a non-empty string" if nonempty else "a string",
                lambda v: isinstance(v, str) and (v.strip() != "" or not nonempty))


def subset(choices, min_len: int = 1) -> Rule:
    n = {0: "a list", 1: "a non-empty list"}.get(min_len, f"a list of >= {min_len}")
    return Rule(f"{n} of distinct values from [{', '.join(choices)}]",
                lambda v: isinstance(v, list) and len(v) >= min_len and len(set(map(str, v))) == len(v)
                and all(isinstance(x, str) and x in choices for x in v))


def numbers(lo: float, hi: float | None = None, nonempty: bool = True) -> Rule:
    return Rule(f"{'a non-empty' if nonempty else 'a'} list of distinct numbers{_bounds(lo, hi, False)}",
                lambda v: isinstance(v, list) and (bool(v) or not nonempty)
                and all(_is_num(x) and _in(x, lo, hi, False) for x in v) and len(set(v)) == len(v))


def booleans() -> Rule:
    return Rule("a non-empty list of distinct true/false values",
                lambda v: isinstance(v, list) and bool(v) and all(isinstance(x, bool) for x in v)
                and len(set(v)) == len(v))


def mapping(of: str) -> Rule:
    return Rule(f"a mapping of {of}", lambda v: isinstance(v, dict))


BOOL = Rule("true or false", lambda v: isinstance(v, bool))
RESOURCE = Rule("a number >= 0 (Ray resources; fractions allowed)", lambda v: _is_num(v) and v >= 0)


def _float_text(v, rule: Rule) -> str:
    """PyYAML reads 3e-5 (no dot) as a string: say so when that is what went wrong."""
    if isinstance(v, str) and "number" in rule.allowed:
        try:
            float(v)
        except ValueError:
            return ""
        return " (a string: YAML 1.1 reads a float without a dot as text; write 3.0e-5, not 3e-5)"
    return ""


def _check_fields(obj, prefix: str) -> None:
    """Every field of ``obj`` (a profile dataclass) against its class's RULES; nested sections recurse."""
    rules = type(obj).RULES
    for f in dataclasses.fields(obj):
        v, key = getattr(obj, f.name), f"{prefix}{f.name}"
        if dataclasses.is_dataclass(v):
            _check_fields(v, key + ".")
            continue
        assert f.name in rules, f"{type(obj).__name__}.{f.name} has no rule"  # every field is checked
        rule = rules[f.name]
        if not rule.ok(v):
            raise ProfileError(f"{key} must be {rule.allowed}, got {v!r}{_float_text(v, rule)}", key)


@dataclass(frozen=True)
class DataCfg:
    n: int = 64  # examples per domain (the study: 70,000)
    heldout: int = 16
    max_length: int = 256
    seed: int = 42
    feature_mode: str = "cached"  # cached | online | auto (cached when the cache estimate fits feature_storage_gib)
    # null | greedy | sample: train on the verifier's own answers (held-out stays original)
    self_distill: str | None = None
    # the storage the feature cache may take (orchestrator/sizing.py's estimate, EAGLE-3's aux layers
    # included): auto picks cached within it, and cached over it is refused; null = no budget
    feature_storage_gib: float | None = None

    RULES = {"n": integer(2), "heldout": integer(1), "max_length": integer(16), "seed": integer(0),
             "feature_mode": one_of("cached", "online", "auto"), "self_distill": one_of(None, "greedy", "sample"),
             "feature_storage_gib": optional(number(0, lo_open=True))}

    def validate(self):
        _need(not (self.self_distill and self.feature_mode == "online"),
              "data.self_distill needs data.feature_mode: cached "
              "(the regenerated answers are cached with the features)", "data.self_distill")


@dataclass(frozen=True)
class TrainCfg:
    backbones: list = field(default_factory=lambda: ["eagle2", "hass"])
    variants: list = field(default_factory=lambda: list(VARIANTS))
    epochs: int = 1
    lr: float = 3e-5
    # per worker: examples per micro-batch; with global_batch set, the most one worker holds
    batch_size: int = 8
    grad_accum: int = 1  # with global_batch set: derived (leave at 1), see batch_plan
    # examples per optimizer step over all workers (the study: 8); null = batch_size and grad_accum
    # per worker as written, so the global batch grows with resources.train.num_workers
    global_batch: int | None = None
    warmup_steps: int = 0
    deepspeed: bool = True
    zero_stage: int = 1  # 0-2; ZeRO-3 is refused (rank 0 evaluates and saves, and would hold a shard)
    # fp32 | bf16: what the drafter trains in (DeepSpeed's bf16 engine, or autocast without DeepSpeed); its
    # inputs follow it and the losses stay float32. GPU profiles: bf16; the CPU profiles: fp32
    precision: str = "fp32"
    hass_steps: int = 3
    max_seconds: float | None = None
    init_seed: int = 0
    # reduced draft vocabulary size (one per run, from all trained corpora); null = full
    draft_vocab: int | None = None
    lr_schedule: str = "linear"
    grad_clip_mode: str = "value"
    topk_from: float = 0.5
    loss_mask: str = "next"  # next (decode-time positions) | reference (EAGLE/HASS loaders, one earlier)
    bucket: bool = True
    # a resumable checkpoint every N optimizer steps (weights, optimizer, RNG, data position), so a
    # failure loses at most N steps; null = at epoch ends only. Neither key changes the result.
    checkpoint_every: int | None = None
    keep_checkpoints: int = 2  # epochs kept per drafter (locally, at the URI and in Ray Train's record)
    # per-backbone values of the PER_BACKBONE keys, e.g. {hass: {warmup_steps: 1660}} (the study's code warms
    # EAGLE up for 2,000 steps and HASS for 1% of its steps); the keys above hold for every other backbone
    per_backbone: dict = field(default_factory=dict)

    # variants: a subset of train.variants (e.g. a slower backbone trains only the specialists); the
    # cells that need a variant it lacks (eval.heads, eval.mixed_variant) are left out for it
    PER_BACKBONE = ("epochs", "lr", "batch_size", "global_batch", "warmup_steps", "precision", "hass_steps",
                    "variants", "checkpoint_every")

    def for_backbone(self, backbone: str) -> "TrainCfg":
        """The settings one backbone trains with (its per_backbone values over the shared ones)."""
        return dataclasses.replace(self, per_backbone={}, **self.per_backbone.get(backbone, {}))

    RULES = {"backbones": subset(BACKBONES), "variants": subset(VARIANTS), "epochs": integer(1),
             "lr": number(0, lo_open=True), "batch_size": integer(1), "grad_accum": integer(1),
             "global_batch": optional(integer(1)),
             "warmup_steps": integer(0), "deepspeed": BOOL, "zero_stage": integer(0, 2),
             "precision": one_of("fp32", "bf16"),
             "hass_steps": integer(1),
             "max_seconds": optional(number(0, lo_open=True)), "init_seed": integer(0),
             "draft_vocab": optional(integer(16)), "lr_schedule": one_of("linear", "constant"),
             "grad_clip_mode": one_of("value", "norm"), "topk_from": number(0, 1),
             "loss_mask": one_of("next", "reference"), "bucket": BOOL,
             "checkpoint_every": optional(integer(1)), "keep_checkpoints": integer(1),
             "per_backbone": Rule(f"a mapping of backbone ({', '.join(BACKBONES)}) to {{key: value}} with keys from "
                                  f"[{', '.join(PER_BACKBONE)}], each value valid for that train key",
                                  lambda v: isinstance(v, dict) and all(
                                      b in BACKBONES and isinstance(o, dict) and all(
                                          k in TrainCfg.PER_BACKBONE and TrainCfg.RULES[k].ok(x) for k, x in o.items())
                                      for b, o in v.items()))}


@dataclass(frozen=True)
class MergeCfg:
    lambdas: list = field(default_factory=lambda: [0.5])
    kinds: list = field(default_factory=lambda: ["linear"])
    sweep_backbones: list = field(default_factory=lambda: ["hass"])  # where the whole lambda list runs
    ties_density: float = 0.2

    RULES = {"lambdas": Rule("a list of numbers", lambda v: isinstance(v, list)),  # each: validate()
             "kinds": subset(MERGE_KINDS, 0), "sweep_backbones": subset(BACKBONES, 0),
             "ties_density": number(0, 1, lo_open=True)}

    def validate(self):
        for lam in self.lambdas:
            _need(_is_num(lam) and 0.0 <= lam <= 1.0,
                  "merge.lambdas: each lambda (the math drafter's weight) must be a number in [0, 1], "
                  f"got {lam!r}", "merge.lambdas")
        for i, lam in enumerate(self.lambdas):  # each lambda is one averaged drafter: 1 and 1.0 are one
            first = next(x for x in self.lambdas if x == lam)
            _need(self.lambdas.index(lam) == i,
                  f"merge.lambdas must not repeat a value: {lam!r} repeats {first!r}, got {self.lambdas}",
                  "merge.lambdas")


@dataclass(frozen=True)
class TreeCfg:
    top_k: int = 4
    depth: int = 4
    total_tokens: int = 16

    RULES = {"top_k": integer(1), "depth": integer(1), "total_tokens": integer(2)}


@dataclass(frozen=True)
class EvalCfg:
    benchmarks: dict = field(default_factory=lambda: {b: 2 for b in BENCHMARKS})  # name -> prompts (null = all)
    temperatures: list = field(default_factory=lambda: [0.0, 1.0])
    strategies: list = field(default_factory=lambda: list(STUDY_STRATEGIES))
    routing_granularities: list = field(default_factory=lambda: ["step"])
    routing_decide_steps: int = 1  # turn/prompt routing: verifier calls whose mean scores decide (the study: 1)
    route_pair: list = field(default_factory=lambda: ["math", "chat"])  # the specialists composed
    merge_dedup: list = field(default_factory=lambda: [False])
    budget_matched: bool = True
    max_new_tokens: int = 64
    tree: TreeCfg = field(default_factory=TreeCfg)
    tree_auto: list = field(default_factory=list)  # strategies also run with tree auto (single: the route pair)
    # every cell times transformers' generate on its own inputs, right after decoding each one, and its
    # speedup divides by that (paired: machine drift between cells stays out of the ratio; eval costs
    # about twice as much). False: only the autoregressive cell times generate, every cell divides by it.
    paired_baseline: bool = False
    seed: int = 42
    shard_size: int = 4
    routers: list = field(default_factory=list)  # the study's routers (ROUTERS) beside the project's own
    heads: list = field(default_factory=lambda: ["math", "chat", "mixed_full", "avg0.5"])  # entropy_heads' drafters
    mixed_variant: str = "mixed_full"  # the mixed checkpoint: post hoc near-ties, depth_adaptive's shallow levels
    switch_after: list = field(default_factory=lambda: [2])  # switching: one cell per k (steps with nothing accepted)
    switch_to: list = field(default_factory=lambda: ["specialist"])  # switching: to the other specialist / merged
    switch_depth: int = 2  # depth_adaptive: tree levels <= this come from the mixed drafter
    # RQ1's cells (single math and chat drafters, fixed tree, T=0, one backbone) read this many prompts per
    # benchmark instead of eval.benchmarks' count (a superset of the other cells' prompts); null = off
    rq1_prompts: int | None = None
    rq1_backbone: str | None = None  # null: the first of train.backbones
    # a system turn before every benchmark prompt's first user turn (the study's evaluation sets one for the
    # Llama-3 chat template); null: none, or the chat template's own default where it has one (SmolLM2's)
    system_prompt: str | None = None

    RULES = {"benchmarks": mapping("benchmark: prompts (null = all)"), "temperatures": numbers(0),
             "strategies": subset(STRATEGIES),
             "routing_granularities": subset(GRANULARITIES), "routing_decide_steps": integer(1),
             "route_pair": subset(VARIANTS, 2), "merge_dedup": booleans(), "budget_matched": BOOL,
             "max_new_tokens": integer(1),
             "tree_auto": subset(("single", "confidence", "entropy", "merged"), 0),
             "paired_baseline": BOOL, "seed": integer(0), "shard_size": integer(1),
             "routers": subset(ROUTERS, 0),
             "heads": Rule("a list of >= 3 distinct drafter names (trained variants or avg0.5)",
                           lambda v: isinstance(v, list) and len(v) >= 3 and all(isinstance(x, str) for x in v)
                           and len(set(v)) == len(v)),
             "mixed_variant": one_of("mixed_half", "mixed_full"),
             "switch_after": Rule("a non-empty list of distinct integers in [1, 5]",
                                  lambda v: isinstance(v, list) and bool(v) and len(set(v)) == len(v)
                                  and all(_is_int(x) and 1 <= x <= 5 for x in v)),
             "switch_to": subset(SWITCH_TO), "switch_depth": integer(1),
             "rq1_prompts": optional(integer(1)), "rq1_backbone": one_of(None, *BACKBONES),
             "system_prompt": optional(Rule("a non-empty string", lambda v: isinstance(v, str) and bool(v.strip())))}

    def validate(self):
        _need(bool(self.benchmarks), f"eval.benchmarks must not be empty; choose from {list(BENCHMARKS)}",
              "eval.benchmarks")
        for b, n in self.benchmarks.items():
            _need(b in BENCHMARKS, f"eval.benchmarks: unknown benchmark {b!r}; choose from {list(BENCHMARKS)}",
                  f"eval.benchmarks.{b}")
            _need(n is None or (_is_int(n) and n >= 1),
                  f"eval.benchmarks.{b} must be a positive integer (prompts) or null (all), got {n!r}",
                  f"eval.benchmarks.{b}")


def eval_checks(p: "Profile") -> None:
    """What the eval keys need from the rest of the profile (one ProfileError line each)."""
    e, t = p.eval, p.train
    pair = [v for v in e.route_pair if v in t.variants]
    composing = sorted({"confidence", "entropy", "merged", "switching", "depth_adaptive", "hedge"}
                       & set(e.strategies))
    routers = sorted({"prompt_confidence", "posthoc_confidence"} & set(e.routers))
    users = f"strategies {composing}" + (f" and routers {routers}" if routers else "") if composing \
        else f"routers {routers}"
    _need(not (composing or routers) or len(pair) >= 2, f"{users} need two drafters, but eval.route_pair "
          f"{e.route_pair} names only {len(pair)} trained variant(s) of train.variants {t.variants}",
          "eval.route_pair")
    if "entropy_heads" in e.routers:
        ok = list(t.variants) + (["avg0.5"] if "linear" in p.merge.kinds else [])
        bad = [h for h in e.heads if h not in ok]
        _need(not bad, f"eval.heads {bad} are not drafters of this profile: each must be one of {ok} "
              "(avg0.5 needs merge kind 'linear')", "eval.heads")
    mixed_users = (["depth_adaptive"] if "depth_adaptive" in e.strategies else []) + \
        (["posthoc_confidence"] if "posthoc_confidence" in e.routers else [])
    _need(not mixed_users or e.mixed_variant in t.variants, f"{mixed_users} use eval.mixed_variant "
          f"{e.mixed_variant!r}, which train.variants {t.variants} does not train", "eval.mixed_variant")
    if "depth_adaptive" in e.strategies:
        _need(e.switch_depth < e.tree.depth, f"eval.switch_depth must be < eval.tree.depth ({e.tree.depth}) so "
              f"the specialist drafts the deeper levels, got {e.switch_depth}", "eval.switch_depth")
    if "posthoc_confidence" in e.routers:
        _need("single" in e.strategies, "eval.routers posthoc_confidence reads the single-drafter traces: "
              "eval.strategies must include single", "eval.routers")
    if e.rq1_prompts is not None:
        _need("single" in e.strategies and {"math", "chat"} <= set(t.variants) and 0.0 in e.temperatures,
              "eval.rq1_prompts sizes the single math and chat cells at T=0: it needs strategy single, "
              "train.variants math and chat, and 0 in eval.temperatures", "eval.rq1_prompts")
        _need(e.rq1_backbone is None or e.rq1_backbone in t.backbones, f"eval.rq1_backbone {e.rq1_backbone!r} "
              f"is not in train.backbones {t.backbones}", "eval.rq1_backbone")


@dataclass(frozen=True)
class StageResources:
    num_cpus: float = 1
    num_gpus: float = 0

    RULES = {"num_cpus": RESOURCE, "num_gpus": RESOURCE}


@dataclass(frozen=True)
class EvalResources(StageResources):
    drafter_cache_gb: float = 4.0  # drafters each eval actor keeps loaded (least recently used go first)
    # fetched checkpoint files one node keeps on disk for its eval actors (least recently used go first;
    # a checkpoint being fetched or loaded stays): keep it well under the node's staging volume
    checkpoint_disk_gb: float = 20.0

    RULES = {**StageResources.RULES, "drafter_cache_gb": number(0, lo_open=True),
             "checkpoint_disk_gb": number(0, lo_open=True)}


@dataclass(frozen=True)
class TrainResources:
    num_workers: int = 1
    cpus_per_worker: int = 1
    use_gpu: bool = False
    max_concurrent_trials: int = 1

    RULES = {"num_workers": integer(1), "cpus_per_worker": integer(1), "use_gpu": BOOL,
             "max_concurrent_trials": integer(1)}


@dataclass(frozen=True)
class Resources:
    features: StageResources = field(default_factory=StageResources)
    train: TrainResources = field(default_factory=TrainResources)
    eval: EvalResources = field(default_factory=EvalResources)
    # caps: the driver runs as many trials and eval actors at once as the cluster holds, up to these
    eval_actors: int = 2
    # memory of one GPU of the node type the profile runs on (A100 80GB: 80): training that needs more
    # (orchestrator/sizing.py's estimate) is refused before any work; null = not checked
    gpu_memory_gib: float | None = None

    RULES = {"eval_actors": integer(1), "gpu_memory_gib": optional(number(0, lo_open=True))}

    def validate(self):
        g = self.eval.num_gpus  # a batch-1 actor decodes on one device; Ray packs fractions onto one GPU
        _need(g == 0 or (g <= 1 and abs(1 / g - round(1 / g)) < 1e-6),
              f"resources.eval.num_gpus must be 0 (CPU) or 1/n for a whole n (1, 0.5, 0.25, ...: n eval "
              f"actors share one GPU; an actor decodes on one device), got {g!r}", "resources.eval.num_gpus")


@dataclass(frozen=True)
class TrackingCfg:
    backend: str = "none"  # none | mlflow | wandb
    uri: str | None = None  # mlflow: tracking URI (default: a file store under <output>/mlruns); wandb: its dir
    experiment: str | None = None  # default: taskspec-<profile>

    RULES = {"backend": one_of("none", "mlflow", "wandb"), "uri": optional(text(True)),
             "experiment": optional(text(True))}


@dataclass(frozen=True)
class ClusterCfg:
    # the output directory is the same mount on every node (NFS, Lustre...): a local --output-dir
    # is refused on a multi-node cluster without it (use a URI, or declare the mount here)
    shared_mount: bool = False
    lease_s: int = 120  # a driver's lease on its output lasts this long unless renewed (every lease_s / 4)

    RULES = {"shared_mount": BOOL, "lease_s": integer(10)}


@dataclass(frozen=True)
class Profile:
    name: str
    verifier: str = "smollm2-135m-instruct"
    description: str = ""
    data: DataCfg = field(default_factory=DataCfg)
    train: TrainCfg = field(default_factory=TrainCfg)
    merge: MergeCfg = field(default_factory=MergeCfg)
    eval: EvalCfg = field(default_factory=EvalCfg)
    resources: Resources = field(default_factory=Resources)
    retries: int = 2  # per unit: features tasks, eval shards, Ray Train's FailureConfig(max_failures)
    verifier_dtype: str | None = None
    tracking: TrackingCfg = field(default_factory=TrackingCfg)
    cluster: ClusterCfg = field(default_factory=ClusterCfg)

    RULES = {"name": Rule("a non-empty string without '/' (it names runs/<name>)",
                          lambda v: isinstance(v, str) and v.strip(" .") != "" and not {"/", "\\"} & set(v)),
             "verifier": Rule("a non-empty string (a registry name, a local model directory or a hub id)",
                              lambda v: isinstance(v, str) and v.strip() != ""),
             "description": text(), "retries": integer(0), "verifier_dtype": one_of(None, *DTYPES)}

    def validate(self) -> "Profile":
        _check_fields(self, "")  # types and ranges of every field, then what one field cannot say alone
        self.data.validate()
        self.merge.validate()
        self.eval.validate()
        self.resources.validate()
        eval_checks(self)
        if "linear" in self.merge.kinds:
            _need({"math", "chat"} <= set(self.train.variants),
                  "merge kind 'linear' averages the math and chat drafters: train.variants must include both",
                  "train.variants")
        for b, o in self.train.per_backbone.items():
            own = o.get("variants", self.train.variants)
            need = [v for v in self.eval.route_pair if v in self.train.variants] + (
                ["math", "chat"] if "linear" in self.merge.kinds else [])
            _need(set(own) <= set(self.train.variants) and set(need) <= set(own),
                  f"train.per_backbone.{b}.variants {own} must be a subset of train.variants "
                  f"{self.train.variants} that includes {sorted(set(need))} (eval.route_pair, the average)",
                  f"train.per_backbone.{b}.variants")
        sweep = [b for b in self.train.backbones if b in self.merge.sweep_backbones]
        _need(set(self.merge.lambdas) <= {0.5} or "linear" not in self.merge.kinds or sweep,
              f"merge.lambdas {self.merge.lambdas} would not run: the lambda sweep runs on the trained "
              f"backbones named in merge.sweep_backbones (got {self.merge.sweep_backbones}, trained: "
              f"{self.train.backbones}); elsewhere only lambda 0.5 runs", "merge.lambdas")
        _need(self.train.deepspeed or self.resources.train.num_workers == 1,
              f"train.deepspeed: false trains without gradient synchronisation, so "
              f"resources.train.num_workers {self.resources.train.num_workers} would train that many separate "
              "drafters; set train.deepspeed: true or num_workers: 1", "train.deepspeed")
        for b in self.train.backbones:  # refuses a global batch the workers cannot split
            batch_plan(self, self.train.for_backbone(b))
        from .sizing import resolve_feature_mode  # (sizing imports this module)

        return resolve_feature_mode(self)  # data.feature_mode auto -> cached or online, by the cache estimate


@dataclass(frozen=True)
class BatchPlan:
    """One optimizer step: ``workers`` x ``per_worker`` examples x ``grad_accum`` micro-steps."""

    workers: int
    per_worker: int
    grad_accum: int
    derived: bool  # True: from train.global_batch; False: train.batch_size/grad_accum as written

    @property
    def global_batch(self) -> int:
        return self.workers * self.per_worker * self.grad_accum

    def describe(self) -> str:
        how = "train.global_batch" if self.derived else "train.batch_size per worker; no train.global_batch"
        return (f"train batch: global {self.global_batch} = {self.workers} worker(s) x per-worker batch "
                f"{self.per_worker} x gradient accumulation {self.grad_accum} (from {how})")


def batch_plan(p: Profile, train: TrainCfg | None = None) -> BatchPlan:
    """Per-worker batch and gradient accumulation for ``p``'s training (pure; the trainer takes
    ``per_worker`` as its batch_size and ``grad_accum`` as is).

    With ``train.global_batch`` G on W = ``resources.train.num_workers`` workers: per-worker batch
    b = min(train.batch_size, G // W) and accumulation G / (W x b); a G that W x b does not divide
    is refused (one ProfileError line). Without it: train.batch_size and train.grad_accum per worker."""
    t, w = train or p.train, p.resources.train.num_workers
    if t.global_batch is None:
        return BatchPlan(w, t.batch_size, t.grad_accum, derived=False)
    g = t.global_batch
    _need(t.grad_accum == 1, f"train.grad_accum is derived from train.global_batch ({g}); leave it at 1, "
          f"got {t.grad_accum!r}", "train.grad_accum")
    _need(g >= w, f"train.global_batch {g} is smaller than resources.train.num_workers {w}: "
          "every worker needs at least one example per step", "train.global_batch")
    b = min(t.batch_size, g // w)
    _need(g % (w * b) == 0, f"train.global_batch {g} is not divisible by resources.train.num_workers {w} x "
          f"per-worker batch {b} (= {w * b}; per-worker batch = min(train.batch_size {t.batch_size}, "
          f"{g} // {w})); choose a worker count and train.batch_size whose product divides it",
          "train.global_batch")
    return BatchPlan(w, b, g // (w * b), derived=True)


def _float_hint(hint) -> bool:
    return hint is float or float in typing.get_args(hint)


def _build(cls, data, path: str):
    """``data`` (parsed YAML) into ``cls``: structure only (sections are mappings, no unknown keys);
    values are checked by Profile.validate. Valid ints for float fields become floats, as before."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    if not isinstance(data, dict):
        what = f"{path} must be a mapping" if path else "the profile must be a mapping (key: value lines)"
        got = f"{type(data).__name__} {_short(data)}"
        raise ProfileError(f"{what} of keys {sorted(fields)}, got {got}", path or None)
    hints = typing.get_type_hints(cls)
    for k in data:
        if k not in fields:
            where = f"{path}.{k}" if path else str(k)
            close = difflib.get_close_matches(str(k), fields, n=1)
            guess = f" (did you mean {(f'{path}.' if path else '') + close[0]!r}?)" if close else ""
            section = path or "the profile"
            raise ProfileError(f"unknown key {where!r}{guess}; allowed in {section}: {sorted(fields)}", where)
    kwargs = {}
    for k, v in data.items():
        hint, where = hints[k], f"{path}.{k}" if path else k
        if dataclasses.is_dataclass(hint):
            kwargs[k] = _build(hint, v, where)
        elif _float_hint(hint) and _is_int(v) and cls.RULES[k].ok(v):  # 2 -> 2.0: stable unit keys
            kwargs[k] = float(v)
        else:  # (a refused value stays as written, for the message)
            kwargs[k] = v
    return cls(**kwargs)


def _short(v) -> str:
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (PyYAML keeps the last silently)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for k, _ in node.value:
            if k.tag == "tag:yaml.org,2002:merge":  # '<<: *anchor' may be overridden by explicit keys
                continue
            key = self.construct_object(k, deep=deep)
            if isinstance(key, Hashable) and key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", k.start_mark)
            if isinstance(key, Hashable):
                seen.add(key)
        return super().construct_mapping(node, deep)


def _yaml_problem(e: yaml.YAMLError) -> str:
    """A YAML error in one line: where, and what the parser expected."""
    mark = getattr(e, "problem_mark", None)
    at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    what = getattr(e, "problem", None) or str(e)
    ctx = getattr(e, "context", None)
    return " ".join(f"{at}{what}{f' ({ctx})' if ctx else ''}".split())


def _apply_set(data: dict, assignment: str) -> str:
    """Apply one ``--set a.b=c`` to ``data``; returns the dotted key."""
    if "=" not in assignment:
        raise ProfileError(f"expected key=value (e.g. train.epochs=2), got {assignment!r}")
    key, raw = assignment.split("=", 1)
    parts = [p.strip() for p in key.split(".")]
    if not all(parts):
        raise ProfileError(f"expected a dotted key such as train.epochs before '=', got {key!r}")
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError as e:
        raise ProfileError(f"the value {raw!r} is not valid YAML: {_yaml_problem(e)}", key) from None
    node = data
    for i, p in enumerate(parts[:-1]):
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            section = ".".join(parts[: i + 1])
            raise ProfileError(f"{section} is a value ({_short(node)}), not a section with keys", key)
    node[parts[-1]] = value
    return ".".join(parts)


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def load_profile(name_or_path: str, overrides: list[str] = ()) -> Profile:
    """Load a profile by name (experiments/profiles/NAME.yaml) or path, apply --set, validate.

    Every refusal is one ProfileError line:
    ``<file>[ with --set <assignment>]: <key> must be <what is allowed>, got <value>``."""
    path = Path(name_or_path)
    if not path.suffix:
        path = PROFILE_DIR / f"{name_or_path}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))
        raise ProfileError(f"profile {name_or_path!r} not found (looked for {path}); shipped profiles: {known}")
    shown = _shown(path)
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_Loader)
    except yaml.YAMLError as e:
        raise ProfileError(f"{shown}: not valid YAML: {_yaml_problem(e)}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ProfileError(f"{shown}: cannot be read: {e}") from None
    data = {} if data is None else data  # an empty file: every default
    if not isinstance(data, dict):  # a list or a scalar: _build says what a profile is instead
        _fail_at(shown, lambda: _build(Profile, data, ""))
    set_keys = {}
    for s in overrides:
        try:
            set_keys[_apply_set(data, s)] = s
        except ProfileError as e:
            raise ProfileError(f"{shown} with --set {s}: {e}", e.key) from None
    data.setdefault("name", path.stem)
    return _fail_at(shown, lambda: _build(Profile, data, "").validate(), set_keys=set_keys)


def _fail_at(shown: str, fn, set_keys: dict | None = None):
    """Run ``fn``; a ProfileError gets the file (and the --set that set the key at fault) in front."""
    try:
        return fn()
    except ProfileError as e:
        k = e.key or ""
        culprits = [s for key, s in (set_keys or {}).items()
                    if k == key or k.startswith(key + ".") or key.startswith(k + ".")] if k else []
        where = shown + "".join(f" with --set {s}" for s in culprits)
        raise ProfileError(f"{where}: {e}", e.key) from None


def profile_dict(p: Profile) -> dict:
    return dataclasses.asdict(p)
