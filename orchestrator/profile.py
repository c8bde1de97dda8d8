"""Profiles: validated, frozen dataclasses loaded from experiments/profiles/*.yaml.

Unknown or misspelled keys are errors; every value is checked before any work starts.
``--set a.b=c`` overrides parse ``c`` as YAML (numbers, lists, booleans).
"""
from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path

PROFILE_DIR = Path(__file__).resolve().parents[1] / "experiments" / "profiles"
STRATEGIES = ("autoregressive", "single", "confidence", "entropy", "merged")
BENCHMARKS = ("mt_bench", "gsm8k", "math500", "svamp")
VARIANTS = ("math", "chat", "mixed_half", "mixed_full")
MERGE_KINDS = ("linear", "task_arithmetic", "ties")


class ProfileError(ValueError):
    pass


def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise ProfileError(msg)


@dataclass(frozen=True)
class DataCfg:
    n: int = 64  # examples per domain (the study: 70,000)
    heldout: int = 16
    max_length: int = 256
    seed: int = 42
    feature_mode: str = "cached"  # cached | online
    self_distill: str | None = None  # null | greedy | sample: train on the verifier's own answers (held-out stays original)

    def validate(self):
        _need(self.n >= 2, f"data.n must be >= 2, got {self.n}")
        _need(self.heldout >= 1, f"data.heldout must be >= 1, got {self.heldout}")
        _need(self.max_length >= 16, f"data.max_length must be >= 16, got {self.max_length}")
        _need(self.feature_mode in ("cached", "online"), f"data.feature_mode must be cached or online, got {self.feature_mode!r}")
        _need(self.self_distill in (None, "greedy", "sample"),
              f"data.self_distill must be null, greedy or sample, got {self.self_distill!r}")
        _need(not (self.self_distill and self.feature_mode == "online"),
              "data.self_distill needs data.feature_mode: cached (the regenerated answers are cached with the features)")


@dataclass(frozen=True)
class TrainCfg:
    backbones: list = field(default_factory=lambda: ["eagle2", "hass"])
    variants: list = field(default_factory=lambda: list(VARIANTS))
    epochs: int = 1
    lr: float = 3e-5
    batch_size: int = 8
    grad_accum: int = 1
    warmup_steps: int = 0
    deepspeed: bool = True
    zero_stage: int = 1
    hass_steps: int = 3
    max_seconds: float | None = None
    init_seed: int = 0
    draft_vocab: int | None = None  # reduced draft vocabulary size (one per run, from all trained corpora); null = full
    lr_schedule: str = "linear"
    grad_clip_mode: str = "value"
    topk_from: float = 0.5
    loss_mask: str = "next"  # next (decode-time positions) | reference (EAGLE/HASS loaders, one earlier)
    bucket: bool = True

    def validate(self):
        _need(bool(self.backbones) and set(self.backbones) <= {"eagle2", "hass"}, f"train.backbones must be a non-empty subset of [eagle2, hass], got {self.backbones}")
        _need(bool(self.variants) and set(self.variants) <= set(VARIANTS), f"train.variants must be a non-empty subset of {list(VARIANTS)}, got {self.variants}")
        _need(self.epochs >= 1, f"train.epochs must be >= 1, got {self.epochs}")
        _need(self.lr > 0, f"train.lr must be > 0, got {self.lr}")
        _need(self.batch_size >= 1, f"train.batch_size must be >= 1, got {self.batch_size}")
        _need(self.zero_stage in (0, 1, 2, 3), f"train.zero_stage must be 0-3, got {self.zero_stage}")
        _need(self.draft_vocab is None or (isinstance(self.draft_vocab, int) and self.draft_vocab >= 16),
              f"train.draft_vocab must be null or an int >= 16, got {self.draft_vocab!r}")
        _need(self.lr_schedule in ("linear", "constant"), f"train.lr_schedule must be linear or constant, got {self.lr_schedule!r}")
        _need(self.grad_clip_mode in ("value", "norm"), f"train.grad_clip_mode must be value or norm, got {self.grad_clip_mode!r}")
        _need(0.0 <= self.topk_from <= 1.0, f"train.topk_from must be in [0, 1], got {self.topk_from!r}")
        _need(self.loss_mask in ("next", "reference"), f"train.loss_mask must be next or reference, got {self.loss_mask!r}")


@dataclass(frozen=True)
class MergeCfg:
    lambdas: list = field(default_factory=lambda: [0.5])
    kinds: list = field(default_factory=lambda: ["linear"])
    sweep_backbones: list = field(default_factory=lambda: ["hass"])  # where the whole lambda list runs
    ties_density: float = 0.2

    def validate(self):
        for lam in self.lambdas:
            _need(isinstance(lam, (int, float)) and 0.0 <= lam <= 1.0, f"merge.lambdas: lambda must be in [0, 1], got {lam!r}")
        _need(set(self.kinds) <= set(MERGE_KINDS), f"merge.kinds must be a subset of {list(MERGE_KINDS)}, got {self.kinds}")
        _need(0 < self.ties_density <= 1, f"merge.ties_density must be in (0, 1], got {self.ties_density}")


@dataclass(frozen=True)
class TreeCfg:
    top_k: int = 4
    depth: int = 4
    total_tokens: int = 16

    def validate(self):
        _need(self.top_k >= 1 and self.depth >= 1 and self.total_tokens >= 2, f"eval.tree must have top_k>=1, depth>=1, total_tokens>=2, got {self}")


@dataclass(frozen=True)
class EvalCfg:
    benchmarks: dict = field(default_factory=lambda: {b: 2 for b in BENCHMARKS})  # name -> prompts (null = all)
    temperatures: list = field(default_factory=lambda: [0.0, 1.0])
    strategies: list = field(default_factory=lambda: list(STRATEGIES))
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

    def validate(self):
        _need(bool(self.benchmarks), "eval.benchmarks must not be empty")
        for b, n in self.benchmarks.items():
            _need(b in BENCHMARKS, f"eval.benchmarks: unknown benchmark {b!r}; choose from {list(BENCHMARKS)}")
            _need(n is None or (isinstance(n, int) and n >= 1), f"eval.benchmarks.{b} must be a positive int or null, got {n!r}")
        _need(bool(self.temperatures) and all(isinstance(t, (int, float)) and t >= 0 for t in self.temperatures), f"eval.temperatures must be a non-empty list of numbers >= 0, got {self.temperatures}")
        _need(bool(self.strategies) and set(self.strategies) <= set(STRATEGIES), f"eval.strategies must be a non-empty subset of {list(STRATEGIES)}, got {self.strategies}")
        _need(set(self.routing_granularities) <= {"step", "turn", "prompt"} and bool(self.routing_granularities), f"eval.routing_granularities must be a subset of [step, turn, prompt], got {self.routing_granularities}")
        _need(isinstance(self.routing_decide_steps, int) and self.routing_decide_steps >= 1,
              f"eval.routing_decide_steps must be a positive int, got {self.routing_decide_steps!r}")
        _need(len(self.route_pair) >= 2 and set(self.route_pair) <= set(VARIANTS), f"eval.route_pair must name >= 2 data variants, got {self.route_pair}")
        _need(self.max_new_tokens >= 1, f"eval.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        _need(self.shard_size >= 1, f"eval.shard_size must be >= 1, got {self.shard_size}")
        _need(set(self.tree_auto) <= {"single", "confidence", "entropy", "merged"},
              f"eval.tree_auto must name speculative strategies (single, confidence, entropy, merged), got {self.tree_auto}")
        _need(isinstance(self.paired_baseline, bool), f"eval.paired_baseline must be true or false, got {self.paired_baseline!r}")
        self.tree.validate()


@dataclass(frozen=True)
class StageResources:
    num_cpus: float = 1
    num_gpus: float = 0


@dataclass(frozen=True)
class TrainResources:
    num_workers: int = 1
    cpus_per_worker: int = 1
    use_gpu: bool = False
    max_concurrent_trials: int = 1


@dataclass(frozen=True)
class Resources:
    features: StageResources = field(default_factory=StageResources)
    train: TrainResources = field(default_factory=TrainResources)
    eval: StageResources = field(default_factory=StageResources)
    eval_actors: int = 2


@dataclass(frozen=True)
class TrackingCfg:
    backend: str = "none"  # none | mlflow | wandb
    uri: str | None = None  # mlflow: tracking URI (default: a file store under <output>/mlruns); wandb: its dir
    experiment: str | None = None  # default: taskspec-<profile>

    def validate(self):
        _need(self.backend in ("none", "mlflow", "wandb"),
              f"tracking.backend must be none, mlflow or wandb, got {self.backend!r}")


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
    retries: int = 2
    verifier_dtype: str | None = None
    tracking: TrackingCfg = field(default_factory=TrackingCfg)

    def validate(self) -> "Profile":
        self.tracking.validate()
        self.data.validate()
        self.train.validate()
        self.merge.validate()
        self.eval.validate()
        _need(self.retries >= 0, f"retries must be >= 0, got {self.retries}")
        composing = {"confidence", "entropy", "merged"} & set(self.eval.strategies)
        pair = [v for v in self.eval.route_pair if v in self.train.variants]
        _need(not composing or len(pair) >= 2,
              f"strategies {sorted(composing)} need two drafters, but eval.route_pair {self.eval.route_pair} names "
              f"only {len(pair)} trained variant(s) of train.variants {self.train.variants}")
        if "linear" in self.merge.kinds:
            _need({"math", "chat"} <= set(self.train.variants), "merge kind 'linear' averages the math and chat drafters: train.variants must include both")
        return self


def _build(cls, data: dict, path: str):
    if not isinstance(data, dict):
        raise ProfileError(f"{path or 'profile'} must be a mapping, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    unknown = set(data) - set(fields)
    if unknown:
        raise ProfileError(f"unknown key(s) {sorted(unknown)} in {path or 'profile'}; allowed: {sorted(fields)}")
    kwargs = {}
    for k, v in data.items():
        hint = hints[k]
        where = f"{path}.{k}" if path else k
        if dataclasses.is_dataclass(hint):
            kwargs[k] = _build(hint, v, where)
        else:
            kwargs[k] = _check_type(v, hint, where)
    return cls(**kwargs)


def _check_type(v, hint, where):
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if hint is float or (origin is typing.Union and float in args) or (hasattr(hint, "__args__") and float in args):
        if v is None and type(None) in args:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ProfileError(f"{where} must be a number, got {v!r}")
        return float(v)
    if hint is int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise ProfileError(f"{where} must be an integer, got {v!r}")
    elif hint is bool:
        if not isinstance(v, bool):
            raise ProfileError(f"{where} must be true or false, got {v!r}")
    elif hint is str:
        if not isinstance(v, str):
            raise ProfileError(f"{where} must be a string, got {v!r}")
    elif hint is list:
        if not isinstance(v, list):
            raise ProfileError(f"{where} must be a list, got {v!r}")
    elif hint is dict:
        if not isinstance(v, dict):
            raise ProfileError(f"{where} must be a mapping, got {v!r}")
    return v


def _apply_set(data: dict, assignment: str) -> None:
    import yaml

    if "=" not in assignment:
        raise ProfileError(f"--set expects key=value, got {assignment!r}")
    key, raw = assignment.split("=", 1)
    parts = key.strip().split(".")
    node = data
    for p in parts[:-1]:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ProfileError(f"--set {key}: {p} is not a section")
    node[parts[-1]] = yaml.safe_load(raw)


def load_profile(name_or_path: str, overrides: list[str] = ()) -> Profile:
    """Load a profile by name (experiments/profiles/NAME.yaml) or path, apply --set, validate."""
    import yaml

    path = Path(name_or_path)
    if not path.suffix:
        path = PROFILE_DIR / f"{name_or_path}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))
        raise ProfileError(f"profile {name_or_path!r} not found (looked for {path}); shipped profiles: {known}")
    data = yaml.safe_load(path.read_text()) or {}
    for s in overrides:
        _apply_set(data, s)
    data.setdefault("name", path.stem)
    return _build(Profile, data, "").validate()


def profile_dict(p: Profile) -> dict:
    return dataclasses.asdict(p)
