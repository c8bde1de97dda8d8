"""--dry-run: the DAG, cells per stage, the resource plan, a cost estimate and the makespan.
Loads no model.

The GPU-hour estimate comes from stated assumptions (costs.ASSUMPTIONS), not from a measurement.
The features mode's options are costed by orchestrator/plan/feature_modes.py. The makespan comes from
rates (orchestrator/plan/rates/): measured on a finished run or a GPU (--rates), or the same assumptions
marked as an estimate, with the eval step from the project's own GPU measurement where it has one
(the makespan at both ends of its range); every rate and overhead is printed with its source.
"""
from __future__ import annotations

from orchestrator.grid import corpora, merge_cells, plan_summary, train_cells
from orchestrator.plan import feature_modes
from orchestrator.plan import rates as rates_mod
from orchestrator.plan.billing import print_makespan
from orchestrator.plan.concurrency import parse_cluster
from orchestrator.plan.costs import (
    ASSUMPTIONS,
    VERIFIERS,
    checkpoint_bytes,
    final_bytes,
    train_flops_per_token,
)
from orchestrator.plan.preflight import dry_run_checks
from orchestrator.plan.sizing import feature_cache_bytes
from orchestrator.profile import Profile


def estimate(p: Profile) -> dict:
    v = VERIFIERS.get(p.verifier)
    if v is None:  # a local directory or hub id: no constants known, so no silent 8B stand-in
        return {"unknown_verifier": True}
    a = ASSUMPTIONS
    tpe = {c: min(n, p.data.max_length) for c, n in a["tokens_per_example"].items() if c in corpora(p)}
    n = p.data.n
    corpus_tokens = {c: (n + p.data.heldout) * t for c, t in tpe.items()}
    flops_verifier = 2 * v["params"]  # forward FLOPs per token
    per_token = {b: train_flops_per_token(v, b, p.train.for_backbone(b).hass_steps)
                 for b in dict.fromkeys(("eagle2", "hass", *p.train.backbones))}
    eff = a["gpu_peak_flops"] * a["mfu"]
    online = p.data.feature_mode == "online"
    train_h = 0.0
    for c in train_cells(p):
        toks = rates_mod.trial_tokens(c.variant, n, tpe) * p.train.for_backbone(c.backbone).epochs
        f = per_token[c.backbone] + (flops_verifier if online else 0)
        train_h += toks * f / eff / 3600
    feat_h = 0.0 if online else sum(corpus_tokens.values()) * flops_verifier / eff / 3600
    cache = feature_cache_bytes(p)  # EAGLE-3's aux layers included (orchestrator/plan/sizing.py)
    storage_gb = 0.0 if online else cache["total"] / 1e9
    # each drafter keeps its last train.keep_checkpoints epochs (weights + DeepSpeed's state: costs.py) and
    # its final; merges keep weights only. Parameters per backbone: EAGLE-3's own LM head included
    ckpt = 0
    for c in train_cells(p):
        t = p.train.for_backbone(c.backbone)
        kept = min(t.epochs, p.train.keep_checkpoints)
        ckpt += kept * checkpoint_bytes(v, c.backbone, t.precision, t.deepspeed, t.draft_vocab) + \
            final_bytes(v, c.backbone, t.precision, t.deepspeed, t.draft_vocab)
    for m in merge_cells(p):
        t = p.train.for_backbone(m.backbone)
        ckpt += final_bytes(v, m.backbone, t.precision, t.deepspeed, p.train.draft_vocab)
    ckpt_gb = ckpt / 1e9
    return {"features_gpu_h": feat_h, "train_gpu_h": train_h, "feature_storage_gb": storage_gb,
            "checkpoint_storage_gb": ckpt_gb, "corpus_tokens": corpus_tokens}


def print_plan(p: Profile, output: str | None = None, rates: str | None = None,
               clusters: list[str] | None = None) -> None:
    _print_dag(p, output)
    for c in clusters or []:  # a bad --cluster is refused before anything is timed
        parse_cluster(c)
    r = rates_mod.with_scaled_backbones(p, rates_mod.load(rates, p)) if rates else None
    problems = dry_run_checks(p)  # data per corpus, features mode, memory per training GPU
    if problems:  # refused as the preflight would refuse the run: one line each
        raise ValueError("\nerror: ".join(problems))
    e = estimate(p)
    a = ASSUMPTIONS
    if e.get("unknown_verifier"):
        print(f"estimate: none -- no size constants for verifier {p.verifier!r} (known: {sorted(VERIFIERS)})")
        if r is not None:
            print_makespan(p, r, clusters)
        return
    print("estimate (assumptions: tokens/example " + str(a["tokens_per_example"])
          + f", verifier FLOPs/token = 2 x params, "
          f"GPU {a['gpu_peak_flops'] / 1e12:.0f} TFLOP/s peak at {a['mfu']:.0%} MFU; compute only, the "
          "overheads "
          "in the makespan below):")
    print(f"  features : {e['features_gpu_h']:.1f} GPU-h, {e['feature_storage_gb']:.0f} GB cache"
          + (" (online mode: computed inside training, no cache)" if p.data.feature_mode == "online" else ""))
    print(f"  train    : {e['train_gpu_h']:.1f} GPU-h")
    print("  eval     : timed by the makespan below "
          "(its step, tau and packing: each printed with its source)")
    print(f"  storage  : checkpoints {e['checkpoint_storage_gb']:.1f} GB (the last train.keep_checkpoints "
          "epochs with "
          "optimizer state per drafter, finals, merges)")
    gpu = rates_mod._device(p) == "gpu"
    _print_features_mode(p)
    runs = [r] if r is not None else _estimated_runs(p) if gpu else []
    if runs:
        print_checkpoint_interval(p, runs[-1])
        print_makespan(p, runs, clusters)
    else:
        print("makespan: pass --rates RUN_DIR (a finished run on this hardware) or a rates JSON file")


def _print_dag(p: Profile, output: str | None) -> None:
    """The plan's header: the profile, the output location and each stage's size and resources."""
    s = plan_summary(p)
    r = p.resources
    print(f"profile {p.name!r}: verifier {p.verifier}; {p.description}")
    if output:
        from common.storage import is_uri

        how = ("a URI: every artifact moves through it with pyarrow filesystems; node-local copies go to "
               "$TASKSPEC_STAGING"
               if is_uri(output)
               else "a directory: a multi-node run needs it on a filesystem every node mounts at this path")
        print(f"output: {output} -- {how}")
    print("DAG: features -> train (Tune grid over backbone x variant, each a Ray Train TorchTrainer + "
          "DeepSpeed) "
          "-> merges -> evaluation (actor pool, sharded over prompts) -> report; "
          + ("as a task graph: each checkpoint's merges and evaluation start as it is trained, while other "
             "trials train (cluster.schedule)" if p.cluster.graph(r.train.use_gpu)
             else "stage after stage (cluster.schedule)"))
    print(f"  features : {len(s['features'])} corpora {s['features']} (mode: {p.data.feature_mode}; "
          f"n={p.data.n}/domain, max_length {p.data.max_length})"
          + (f"; self-distilled ({p.data.self_distill}): the verifier first regenerates the {p.data.n} "
             f"training answers of {_distilled(p, s['features'])} "
             "(decode time not in the estimate below)" if p.data.self_distill else ""))
    epochs = {b: p.train.for_backbone(b).epochs for b in p.train.backbones}
    ep = f"{p.train.epochs}" if set(epochs.values()) == {p.train.epochs} else \
        ", ".join(f"{b} {n}" for b, n in epochs.items())
    print(f"  train    : {len(s['train'])} runs, {ep} epochs, ZeRO-{p.train.zero_stage}, "
          f"{r.train.num_workers} worker(s) x {r.train.cpus_per_worker} "
          f"CPU{' + 1 GPU' if r.train.use_gpu else ''}, "
          f"up to {r.train.max_concurrent_trials} concurrent trial(s) (the driver fills the cluster to this "
          "cap)")
    print(f"  merge    : {len(s['merge'])} checkpoints {s['merge']}")
    print(f"  eval     : {s['eval_cells']} cells, {s['eval_prompt_runs']} prompt runs, "
          f"up to {r.eval_actors} actor(s) x ({r.eval.num_cpus} CPU, {r.eval.num_gpus} GPU"
          + ("; packing auto: the plan's share on each cluster" if r.eval.packing == "auto" else "")
          + f"), shard size {p.eval.shard_size}")


def _distilled(p: Profile, names: list[str]) -> str:
    """Which of the run's corpora self-distillation regenerates, in words."""
    named = [c for c in names if p.data.distills(c)]
    return "every corpus" if named == list(names) else ", ".join(named) or "no corpus of this run"


def _print_features_mode(p: Profile) -> None:
    """Each features mode's cost per backbone and the choice (GPU training profiles)."""
    if not p.resources.train.use_gpu:
        return
    print("features mode by cost (orchestrator/plan/feature_modes.py; GPU-h of the trials' compute and shard "
          "reads at the assumed rates, beside the overheads every mode shares):")
    for line in feature_modes.lines(p):
        print(line)


def _estimated_runs(p: Profile) -> list:
    """Rates for a GPU profile without --rates: at both ends of the project's GPU measurement of the
    eval step where it has one for the verifier (measured ones win), else the stated assumptions."""
    if rates_mod.estimates.project_measurement(p) is None:
        return [rates_mod.estimated(p)]
    return [rates_mod.estimated(p, end) for end in rates_mod.estimates.ENDS]


def print_checkpoint_interval(p: Profile, r) -> None:
    """Minutes between a trial's step checkpoints per backbone (train.checkpoint_every x the optimizer
    step at ``r``, fastest to slowest corpus): what a lost node costs at most."""
    steps = rates_mod.optimizer_step_seconds(p, r)
    parts = []
    for b in p.train.backbones:
        every = p.train.for_backbone(b).checkpoint_every
        mine = [s for (bb, _), s in steps.items() if bb == b]
        parts.append(f"{b} every {every} steps = {every * min(mine) / 60:.1f}-{every * max(mine) / 60:.1f} "
                     "min"
                     if every else f"{b} at epoch ends only")
    print("  checkpoints: " + "; ".join(parts) + " (train.checkpoint_every: a lost node loses at most that)")
