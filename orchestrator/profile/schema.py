"""The profile's schema: one frozen dataclass per section, each field with its rule (``RULES``:
type and range, in common/rules.py's words). Declarations only: the checks that span fields are
checks.py's, reading YAML is load.py's. The values the decoding settings may take are decoding's
(decoding/config.py): ``eval.tree`` is its TreeConfig, and the eval lists draw on its names.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from common.dtypes import NAMES as DTYPES
from common.rules import (
    BOOL,
    Rule,
    booleans,
    integer,
    integers,
    is_num,
    mapping,
    number,
    numbers,
    one_of,
    optional,
    subset,
    text,
)
from decoding.config import GRANULARITIES, STRATEGY_NAMES, SWITCH_AFTER, SWITCH_TO, DecodeConfig, TreeConfig
from decoding.hedge import FEEDBACKS, LEARNERS, RESETS, TIES
from drafters.config import BACKBONES
from drafters.corpora import VARIANTS
from drafters.data.sources import BENCHMARKS
from drafters.data.spec import DataSpec
from drafters.train.config import TrainSettings

# the study's own; switching and depth_adaptive are its proposed next steps; hedge the online router (issue
# 57)
STUDY_STRATEGIES = STRATEGY_NAMES[:5]
# the study's routers by name: posthoc_confidence (its code's run_confidence_router_tau.py, computed by the
# report from the single-drafter traces), entropy_heads (its gen_routing_eval.py: lowest draft entropy over
# eval.heads, per prompt turn), prompt_confidence (its text: once per prompt, mean node confidence c(v))
ROUTERS = ("posthoc_confidence", "entropy_heads", "prompt_confidence")
MERGE_KINDS = ("linear", "task_arithmetic", "ties")
RESOURCE = Rule("a number >= 0 (Ray resources; fractions allowed)", lambda v: is_num(v) and v >= 0)


@dataclass(frozen=True)
class DataCfg(DataSpec):
    """Which examples (drafters/data/spec.py's DataSpec, each with its rule there, read here as
    data.<key>) and where their features live."""

    # cached | online | auto (cached when the cache estimate fits feature_storage_gib)
    feature_mode: str = "cached"
    # the storage the feature cache may take (orchestrator/plan/sizing.py's estimate, EAGLE-3's aux layers
    # included): auto picks cached within it, and cached over it is refused; null = no budget
    feature_storage_gib: float | None = None

    RULES = {**DataSpec.RULES, "feature_mode": one_of("cached", "online", "auto"),
             "feature_storage_gib": optional(number(0, lo_open=True))}
    PREFIX = "data."


@dataclass(frozen=True)
class TrainCfg(TrainSettings):
    """The hyperparameters (drafters/train/config.py's TrainSettings, each with its rule there, read
    here as train.<key>) and which cells train with them."""

    backbones: list = field(default_factory=lambda: ["eagle2", "hass"])
    # variants: a subset of train.variants (e.g. a slower backbone trains only the specialists); the
    # cells that need a variant it lacks (eval.heads, eval.mixed_variant) are left out for it
    variants: list = field(default_factory=lambda: list(VARIANTS))
    # examples per optimizer step over all workers (the study: 8); null = batch_size and grad_accum
    # per worker as written, so the global batch grows with resources.train.num_workers
    global_batch: int | None = None
    # reduced draft vocabulary size (one per run, from all trained corpora); null = full
    draft_vocab: int | None = None
    # per-backbone values of the PER_BACKBONE keys, e.g. {hass: {warmup_steps: 1660}} (the study's code warms
    # EAGLE up for 2,000 steps and HASS for 1% of its steps); the keys above hold for every other backbone
    per_backbone: dict = field(default_factory=dict)

    PER_BACKBONE = ("epochs", "lr", "batch_size", "global_batch", "warmup_steps", "precision", "hass_steps",
                    "variants", "checkpoint_every")
    PREFIX = "train."

    def for_backbone(self, backbone: str) -> TrainCfg:
        """The settings one backbone trains with (its per_backbone values over the shared ones)."""
        return dataclasses.replace(self, per_backbone={}, **self.per_backbone.get(backbone, {}))

    RULES = {**TrainSettings.RULES, "backbones": subset(BACKBONES), "variants": subset(VARIANTS),
             "global_batch": optional(integer(1)), "draft_vocab": optional(integer(16)),
             "per_backbone": Rule(f"a mapping of backbone ({', '.join(BACKBONES)}) to {{key: value}} with "
                                  "keys from "
                                  f"[{', '.join(PER_BACKBONE)}], each value valid for that train key",
                                  lambda v: isinstance(v, dict) and all(
                                      b in BACKBONES and isinstance(o, dict) and all(
                                          k in TrainCfg.PER_BACKBONE and TrainCfg.RULES[k].ok(x)
                                          for k, x in o.items())
                                      for b, o in v.items()))}


@dataclass(frozen=True)
class MergeCfg:
    lambdas: list = field(default_factory=lambda: [0.5])
    kinds: list = field(default_factory=lambda: ["linear"])
    sweep_backbones: list = field(default_factory=lambda: ["hass"])  # where the whole lambda list runs
    ties_density: float = 0.2

    RULES = {"lambdas": Rule("a list of numbers", lambda v: isinstance(v, list)),  # each: checks.py
             "kinds": subset(MERGE_KINDS, 0), "sweep_backbones": subset(BACKBONES, 0),
             "ties_density": number(0, 1, lo_open=True)}


@dataclass(frozen=True)
class EvalCfg:
    # name -> prompts (null = all)
    benchmarks: dict = field(default_factory=lambda: {b: 2 for b in BENCHMARKS})
    temperatures: list = field(default_factory=lambda: [0.0, 1.0])
    strategies: list = field(default_factory=lambda: list(STUDY_STRATEGIES))
    routing_granularities: list = field(default_factory=lambda: ["step"])
    # turn/prompt routing: verifier calls whose mean scores decide (the study: 1, DecodeConfig's default)
    routing_decide_steps: int = DecodeConfig.routing_decide_steps
    route_pair: list = field(default_factory=lambda: ["math", "chat"])  # the specialists composed
    merge_dedup: list = field(default_factory=lambda: [False])
    budget_matched: bool = True
    max_new_tokens: int = 64
    tree: TreeConfig = field(default_factory=TreeConfig)  # decoding/config.py's, with its RULES
    # strategies also run with tree auto (single: the route pair)
    tree_auto: list = field(default_factory=list)
    # every cell times transformers' generate on its own inputs, right after decoding each one, and its
    # speedup divides by that (paired: machine drift between cells stays out of the ratio; eval costs
    # about twice as much). False: only the autoregressive cell times generate, every cell divides by it.
    paired_baseline: bool = False
    seed: int = 42
    shard_size: int = 4
    routers: list = field(default_factory=list)  # the study's routers (ROUTERS) beside the project's own
    # entropy_heads' drafters
    heads: list = field(default_factory=lambda: ["math", "chat", "mixed_full", "avg0.5"])
    # the mixed checkpoint: post hoc near-ties, depth_adaptive's shallow levels
    mixed_variant: str = "mixed_full"
    # the strategies' options below default to DecodeConfig's defaults (decoding/config.py), which keep
    # the keys cells had before each option existed (orchestrator/grid.py KEY_DEFAULTS)
    # switching: one cell per k (steps with nothing accepted) and per target (the other specialist / merged)
    switch_after: list = field(default_factory=lambda: [DecodeConfig.switch_after])
    switch_to: list = field(default_factory=lambda: [DecodeConfig.switch_to])
    switch_depth: int = DecodeConfig.switch_depth  # depth_adaptive: levels <= this from the mixed drafter
    # RQ1's cells (single math and chat drafters, fixed tree, T=0, one backbone) read this many prompts per
    # benchmark instead of eval.benchmarks' count (a superset of the other cells' prompts); null = off
    rq1_prompts: int | None = None
    rq1_backbone: str | None = None  # null: the first of train.backbones
    # a system turn before every benchmark prompt's first user turn (the study's evaluation sets one for the
    # Llama-3 chat template); null: none, or the chat template's own default where it has one (SmolLM2's)
    system_prompt: str | None = None
    # hedge (decoding/hedge.py): one cell per learner x reset over eval.route_pair, each with this feedback,
    # tie rule and learning rate; the defaults are the first online router's (ftl on agreement, ties to
    # the lower index, fresh weights every turn), so the keys of runs made before these settings stay
    hedge_learners: list = field(default_factory=lambda: [DecodeConfig.hedge_learner])
    hedge_resets: list = field(default_factory=lambda: [DecodeConfig.hedge_reset])
    hedge_feedback: str = DecodeConfig.hedge_feedback
    hedge_ties: str = DecodeConfig.hedge_ties
    hedge_eta: float = DecodeConfig.hedge_eta

    RULES = {"benchmarks": mapping("benchmark: prompts (null = all)"), "temperatures": numbers(0),
             "strategies": subset(STRATEGY_NAMES),
             "routing_granularities": subset(GRANULARITIES), "routing_decide_steps": integer(1),
             "route_pair": subset(VARIANTS, 2), "merge_dedup": booleans(), "budget_matched": BOOL,
             "max_new_tokens": integer(1),
             "tree_auto": subset(("single", "confidence", "entropy", "merged"), 0),
             "paired_baseline": BOOL, "seed": integer(0), "shard_size": integer(1),
             "routers": subset(ROUTERS, 0),
             "heads": Rule("a list of >= 3 distinct drafter names (trained variants or avg0.5)",
                           lambda v: isinstance(v, list) and len(v) >= 3 and all(isinstance(x, str)
                                   for x in v)
                           and len(set(v)) == len(v)),
             "mixed_variant": one_of("mixed_half", "mixed_full"),
             "switch_after": integers(SWITCH_AFTER[0], SWITCH_AFTER[-1]),
             "switch_to": subset(SWITCH_TO), "switch_depth": integer(1),
             "rq1_prompts": optional(integer(1)), "rq1_backbone": one_of(None, *BACKBONES),
             "system_prompt": optional(Rule("a non-empty string", lambda v: isinstance(v, str)
                                            and bool(v.strip()))),
             "hedge_learners": subset(LEARNERS), "hedge_resets": subset(RESETS),
             "hedge_feedback": one_of(*FEEDBACKS),
             "hedge_ties": one_of(*TIES), "hedge_eta": number(0, lo_open=True)}


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
    # fixed: num_gpus as written. auto (a GPU profile): the plan packs as many batch-1 actors on a GPU as
    # its memory (resources.gpu_memory_gib over each actor's, orchestrator/plan/packing.py) and the node's
    # CPUs
    # (num_cpus each) hold, up to plan.PACK_MOST; num_gpus stays the share where it cannot tell (no memory
    # set)
    packing: str = "fixed"
    # prompts an eval actor decodes at once, one verifier pass a step for all of them (decoding/batch.py;
    # lossless as one at a time). 1: one prompt at a time. Above 1 a trace's seconds are a request's under
    # batching, and hedge_reset "stream" carries weights across the prompts of one row
    verify_batch: int = 1

    RULES = {**StageResources.RULES, "drafter_cache_gb": number(0, lo_open=True),
             "checkpoint_disk_gb": number(0, lo_open=True), "packing": one_of("fixed", "auto"),
             "verify_batch": integer(1, 256)}


@dataclass(frozen=True)
class NodeIO:
    """What one GPU node moves feature shards and checkpoints with: the dry run's I/O term
    (orchestrator/plan/io_cost.py) and the features mode's cost (orchestrator/plan/feature_modes.py).
    Defaults: the deploy files' node type, p4de.24xlarge (AWS's EC2 P4 page: 8 x 1,000 GB NVMe SSD instance
    store; AWS's "Amazon EC2 P4d instances deep dive": 2.7 GB/s a device, about 16 GB/s read across 8
    in RAID 0). The object store: Amazon S3 from one node with parallel ranged GETs (AWS's S3
    performance guidelines: one connection per 85-90 MB/s, up to 100 Gb/s for one instance): 2.5 GB/s
    is about 30 connections, a stated figure for a read-ahead client, not measured here."""

    object_store_gb_s: float = 2.5  # GB/s one node reads from (and writes to) the object store
    # node-local disk the feature shards may fill (0: none; every epoch from the store)
    disk_gb: float = 8000.0
    disk_gb_s: float = 16.0  # its read throughput, GB/s

    RULES = {"object_store_gb_s": number(0, 100, lo_open=True), "disk_gb": number(0, 1e6),
             "disk_gb_s": number(0, 200, lo_open=True)}


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
    # (orchestrator/plan/sizing.py's estimate) is refused before any work; null = not checked
    gpu_memory_gib: float | None = None
    node: NodeIO = field(default_factory=NodeIO)  # object store and local disk, per node (cost model only)

    RULES = {"eval_actors": integer(1), "gpu_memory_gib": optional(number(0, lo_open=True))}


@dataclass(frozen=True)
class TrackingCfg:
    backend: str = "none"  # none | mlflow | wandb
    # mlflow: tracking URI (default: a file store under <output>/mlruns); wandb: its dir
    uri: str | None = None
    experiment: str | None = None  # default: taskspec-<profile>

    RULES = {"backend": one_of("none", "mlflow", "wandb"), "uri": optional(text(True)),
             "experiment": optional(text(True))}


@dataclass(frozen=True)
class ClusterCfg:
    # the output directory is the same mount on every node (NFS, Lustre...): a local --output-dir
    # is refused on a multi-node cluster without it (use a URI, or declare the mount here)
    shared_mount: bool = False
    lease_s: int = 120  # a driver's lease on its output lasts this long unless renewed (every lease_s / 4)
    # graph: a checkpoint's merges and evaluation start as soon as their inputs exist, while other
    # trials train (orchestrator/run/graph.py); stages: features, training, merges, evaluation, each
    # after the last; auto: graph when training uses GPUs (on a CPU node the stages would share the
    # same cores, and a run's stage times, which `--rates` measures, would overlap)
    schedule: str = "auto"

    RULES = {"shared_mount": BOOL, "lease_s": integer(10), "schedule": one_of("auto", "graph", "stages")}

    def graph(self, use_gpu: bool) -> bool:
        """Whether the driver runs the task graph (``use_gpu``: resources.train.use_gpu)."""
        return self.schedule == "graph" or (self.schedule == "auto" and use_gpu)


# the deployable strategies a report may name for its speed headline: lossless at T=0, and none needs
# to see finished generations (single: each benchmark's home specialist, the task known in advance)
HEADLINE_STRATEGIES = ("single", "confidence", "entropy", "merged", "switching", "depth_adaptive", "hedge")


@dataclass(frozen=True)
class ReportCfg:
    # the strategy whose speedup over generate (T=0, mean over benchmarks 1 chat : 3 math, with its interval)
    # the report's first screen names: chosen in the profile before the run, not picked from its results;
    # null: the first screen names none
    headline_strategy: str | None = None
    headline_tree: str = "auto"  # auto: its eval.tree_auto cells; fixed: its eval.tree cells

    RULES = {"headline_strategy": one_of(None, *HEADLINE_STRATEGIES),
             "headline_tree": one_of("auto", "fixed")}


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
    report: ReportCfg = field(default_factory=ReportCfg)

    RULES = {"name": Rule("a non-empty string without '/' (it names runs/<name>)",
                          lambda v: isinstance(v, str) and v.strip(" .") != "" and not {"/", "\\"} & set(v)),
             "verifier": Rule("a non-empty string (a registry name, a local model directory or a hub id)",
                              lambda v: isinstance(v, str) and v.strip() != ""),
             "description": text(), "retries": integer(0), "verifier_dtype": one_of(None, *DTYPES)}
