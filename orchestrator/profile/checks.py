"""What one field cannot say alone: the checks across a section's fields and across sections, run
after every field has passed its rule (load.py), each refusal one ProfileError line with its key.
"""
from __future__ import annotations

from common.rules import is_int, is_num
from decoding.config import switch_depth_error
from drafters.data.sources import BENCHMARKS
from orchestrator.profile.batch import batch_plan
from orchestrator.profile.errors import need
from orchestrator.profile.schema import DataCfg, EvalCfg, MergeCfg, Profile, Resources


def check_profile(p: Profile) -> None:
    """Every cross-field check of ``p``, sections first, in a fixed order (the first refusal wins)."""
    data_checks(p.data)
    merge_checks(p.merge)
    eval_section_checks(p.eval)
    resources_checks(p.resources)
    eval_checks(p)
    drafter_checks(p)
    report_checks(p)
    for b in p.train.backbones:  # refuses a global batch the workers cannot split
        batch_plan(p, p.train.for_backbone(b))


def data_checks(d: DataCfg) -> None:
    need(not (d.self_distill and d.feature_mode == "online"),
         "data.self_distill needs data.feature_mode: cached "
         "(the regenerated answers are cached with the features)", "data.self_distill")


def merge_checks(m: MergeCfg) -> None:
    for lam in m.lambdas:
        need(is_num(lam) and 0.0 <= lam <= 1.0,
             "merge.lambdas: each lambda (the math drafter's weight) must be a number in [0, 1], "
             f"got {lam!r}", "merge.lambdas")
    for i, lam in enumerate(m.lambdas):  # each lambda is one averaged drafter: 1 and 1.0 are one
        first = next(x for x in m.lambdas if x == lam)
        need(m.lambdas.index(lam) == i,
             f"merge.lambdas must not repeat a value: {lam!r} repeats {first!r}, got {m.lambdas}",
             "merge.lambdas")


def eval_section_checks(e: EvalCfg) -> None:
    need(bool(e.benchmarks), f"eval.benchmarks must not be empty; choose from {list(BENCHMARKS)}",
         "eval.benchmarks")
    for b, n in e.benchmarks.items():
        need(b in BENCHMARKS, f"eval.benchmarks: unknown benchmark {b!r}; choose from {list(BENCHMARKS)}",
             f"eval.benchmarks.{b}")
        need(n is None or (is_int(n) and n >= 1),
             f"eval.benchmarks.{b} must be a positive integer (prompts) or null (all), got {n!r}",
             f"eval.benchmarks.{b}")


def resources_checks(r: Resources) -> None:
    g = r.eval.num_gpus  # a batch-1 actor decodes on one device; Ray packs fractions onto one GPU
    need(g == 0 or (g <= 1 and abs(1 / g - round(1 / g)) < 1e-6),
         f"resources.eval.num_gpus must be 0 (CPU) or 1/n for a whole n (1, 0.5, 0.25, ...: n eval "
         f"actors share one GPU; an actor decodes on one device), got {g!r}", "resources.eval.num_gpus")


def eval_checks(p: Profile) -> None:
    """What the eval keys need from the rest of the profile (one ProfileError line each)."""
    e, t = p.eval, p.train
    pair = [v for v in e.route_pair if v in t.variants]
    composing = sorted({"confidence", "entropy", "merged", "switching", "depth_adaptive", "hedge"}
                       & set(e.strategies))
    routers = sorted({"prompt_confidence", "posthoc_confidence"} & set(e.routers))
    users = f"strategies {composing}" + (f" and routers {routers}" if routers else "") if composing \
        else f"routers {routers}"
    need(not (composing or routers) or len(pair) >= 2, f"{users} need two drafters, but eval.route_pair "
         f"{e.route_pair} names only {len(pair)} trained variant(s) of train.variants {t.variants}",
         "eval.route_pair")
    if "entropy_heads" in e.routers:
        ok = list(t.variants) + (["avg0.5"] if "linear" in p.merge.kinds else [])
        bad = [h for h in e.heads if h not in ok]
        need(not bad, f"eval.heads {bad} are not drafters of this profile: each must be one of {ok} "
             "(avg0.5 needs merge kind 'linear')", "eval.heads")
    mixed_users = (["depth_adaptive"] if "depth_adaptive" in e.strategies else []) + \
        (["posthoc_confidence"] if "posthoc_confidence" in e.routers else [])
    need(not mixed_users or e.mixed_variant in t.variants, f"{mixed_users} use eval.mixed_variant "
         f"{e.mixed_variant!r}, which train.variants {t.variants} does not train", "eval.mixed_variant")
    if "depth_adaptive" in e.strategies:  # (the rule's one statement: decoding/config.py)
        why = switch_depth_error(e.switch_depth, e.tree.depth)
        need(why is None, f"eval.{why}", "eval.switch_depth")
    if "posthoc_confidence" in e.routers:
        need("single" in e.strategies, "eval.routers posthoc_confidence reads the single-drafter traces: "
             "eval.strategies must include single", "eval.routers")
    if e.rq1_prompts is not None:
        need("single" in e.strategies and {"math", "chat"} <= set(t.variants) and 0.0 in e.temperatures,
             "eval.rq1_prompts sizes the single math and chat cells at T=0: it needs strategy single, "
             "train.variants math and chat, and 0 in eval.temperatures", "eval.rq1_prompts")
        need(e.rq1_backbone is None or e.rq1_backbone in t.backbones, f"eval.rq1_backbone {e.rq1_backbone!r} "
             f"is not in train.backbones {t.backbones}", "eval.rq1_backbone")


def drafter_checks(p: Profile) -> None:
    """The drafters the merges and the per-backbone variants need, and how the ranks train them."""
    t, m = p.train, p.merge
    if "linear" in m.kinds:
        need({"math", "chat"} <= set(t.variants),
             "merge kind 'linear' averages the math and chat drafters: train.variants must include both",
             "train.variants")
    for b, o in t.per_backbone.items():
        own = o.get("variants", t.variants)
        needed = [v for v in p.eval.route_pair if v in t.variants] + (["math", "chat"]
                                                                      if "linear" in m.kinds else [])
        need(set(own) <= set(t.variants) and set(needed) <= set(own),
             f"train.per_backbone.{b}.variants {own} must be a subset of train.variants "
             f"{t.variants} that includes {sorted(set(needed))} (eval.route_pair, the average)",
             f"train.per_backbone.{b}.variants")
    sweep = [b for b in t.backbones if b in m.sweep_backbones]
    need(set(m.lambdas) <= {0.5} or "linear" not in m.kinds or sweep,
         f"merge.lambdas {m.lambdas} would not run: the lambda sweep runs on the trained "
         f"backbones named in merge.sweep_backbones (got {m.sweep_backbones}, trained: "
         f"{t.backbones}); elsewhere only lambda 0.5 runs", "merge.lambdas")
    need(t.deepspeed or p.resources.train.num_workers == 1,
         f"train.deepspeed: false trains without gradient synchronisation, so "
         f"resources.train.num_workers {p.resources.train.num_workers} would train that many separate "
         "drafters; set train.deepspeed: true or num_workers: 1", "train.deepspeed")


def report_checks(p: Profile) -> None:
    """The speed headline's strategy must be a cell of the grid: in eval.strategies, at T=0, and in
    eval.tree_auto when it is read with tree auto."""
    r, e = p.report, p.eval
    if r.headline_strategy is None:
        return
    s = r.headline_strategy
    need(s in e.strategies and 0.0 in e.temperatures, f"report.headline_strategy {s!r} is timed at T=0: it "
         f"needs {s!r} in eval.strategies {e.strategies} and 0 in eval.temperatures {e.temperatures}",
         "report.headline_strategy")
    need(r.headline_tree == "fixed" or s in e.tree_auto, f"report.headline_strategy {s!r} with "
         f"report.headline_tree auto needs {s!r} in eval.tree_auto {e.tree_auto}", "report.headline_tree")
