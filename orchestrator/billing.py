"""The dry run's makespan on clusters: the plan the driver would derive there
(orchestrator/plan.py), the grid scheduled with it (orchestrator/makespan.py), and per stage its
span, the billed GPU-hours (every GPU of every node for that span: what a cluster held for the
run costs) and the used ones (the GPU-time its tasks held). Pure Python; loads no model.
"""
from __future__ import annotations

from . import packing
from . import rates as rates_mod
from .costs import VERIFIERS
from .grid import train_cells
from .makespan import STAGE_ORDER, schedule
from .plan import Cluster, actors_per_gpu, derive, eval_cpu_problem, parse_cluster
from .profile import Profile

DEFAULT_CLUSTERS = ("1x8", "2x8", "4x8", "8x8")  # NODESxGPUS a GPU profile's makespan is shown on


def fmt(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds < 3 * 3600 else f"{seconds / 3600:.1f} h"


def _run(tasks: list, devices: float, caps: dict) -> dict:
    s = schedule(tasks, devices, caps, barriers=True)
    free = schedule(tasks, devices, caps, barriers=False)
    spans = {st: b - a for st, (a, b) in s["stages"].items()}
    billed = {st: devices * spans.get(st, 0.0) / 3600 for st in STAGE_ORDER}
    used = {st: s["stage_busy"].get(st, 0.0) / 3600 for st in STAGE_ORDER}
    return {"devices": devices, "caps": caps, "stages": spans, "total": s["makespan"],
            "pipelined": free["makespan"], "billed": billed, "used": used,
            "billed_total": devices * s["makespan"] / 3600, "used_total": s["busy"] / 3600,
            "utilisation": s["busy"] / (devices * s["makespan"]) if s["makespan"] else 0.0}


def on_cluster(p: Profile, r: rates_mod.Rates, cluster: Cluster, tasks: list | None = None) -> dict:
    """The grid on ``cluster`` at the concurrency the driver would derive there (the profile's
    numbers as caps): spans, makespan, billed and used GPU-hours per stage and in all."""
    tasks = tasks if tasks is not None else rates_mod.tasks(p, r)
    plan = derive(p, cluster.node_list(), trials=len(train_cells(p)),
                  eval_units=sum(t.stage == "eval" for t in tasks))
    caps = {"train": plan.train.units, "eval": plan.eval.units, "merge": 1}
    out = _run(tasks, float(cluster.nodes * cluster.gpus), caps)
    return out | {"cluster": cluster, "plan": plan}


def as_configured(p: Profile, r: rates_mod.Rates, tasks: list | None = None) -> dict:
    """The profile's own concurrency on as many devices as it uses (a CPU profile: its machine)."""
    tasks = tasks if tasks is not None else rates_mod.tasks(p, r)
    return _run(tasks, rates_mod.profile_devices(p), rates_mod.caps(p)) | {"cluster": None, "plan": None}


def _packing_lines(p: Profile, r: rates_mod.Rates) -> list[str]:
    """The eval packing model's lines (GPU profiles), with the memory k actors hold on one GPU."""
    g = p.resources.eval.num_gpus
    if rates_mod._device(p) != "gpu" or g <= 0:
        return []
    k = actors_per_gpu(g)
    pk = rates_mod.packing_model(p, r)
    lines = [f"eval packing (orchestrator/packing.py): {k} actor(s) per GPU (resources.eval.num_gpus {g:g})"]
    lines += ["  " + x for x in packing.describe(pk, k)]
    v = VERIFIERS.get(p.verifier)
    if v is not None:
        each = packing.actor_memory_gb(v, packing.DTYPE_BYTES[p.verifier_dtype],
                                       p.resources.eval.drafter_cache_gb)
        cap = packing.ASSUMED_GPU_MEMORY_GB
        warn = "" if k * each <= cap else "  WARNING: more than the GPU holds; lower the packing"
        lines.append(f"  memory: {k} x {each:.1f} GB (verifier weights, resources.eval.drafter_cache_gb, "
                     f"{packing.ACTOR_WORKING_GB:g} GB working) = {k * each:.1f} GB of an "
                     f"{packing.ASSUMED_GPU}'s {cap:g} GB (estimate){warn}")
    return lines


def _table(rows: list[dict], unit: str) -> list[str]:
    head = (f"  {'cluster':<26}{'features':>10}{'train':>10}{'merge':>10}{'eval':>10}{'total':>10}"
            f"{'no barriers':>13}{'billed ' + unit + '-h':>14}{'used ' + unit + '-h':>13}{'used':>6}")
    out = [head]
    for m in rows:
        c = m["cluster"]
        label = (f"{c.nodes}x{c.gpus} ({m['caps']['train']} trials, {m['caps']['eval']} actors)" if c
                 else f"{m['devices']:g} {unit} (as configured)")
        cols = "".join(f"{fmt(m['stages'].get(s, 0.0)):>10}" for s in ("features", "train", "merge", "eval"))
        out.append(f"  {label:<26}{cols}{fmt(m['total']):>10}{fmt(m['pipelined']):>13}"
                   f"{m['billed_total']:>14,.0f}{m['used_total']:>13,.0f}{m['utilisation']:>6.0%}")
    return out


def _detail(m: dict) -> list[str]:
    """One cluster's plan and its stages: span, billed and used GPU-hours."""
    c = m["cluster"]
    out = [f"on {c.nodes}x{c.gpus}: {c.describe()}", "  " + m["plan"].line()]
    out.append(f"  {'stage':<10}{'span':>10}{'billed GPU-h':>14}{'used GPU-h':>12}{'used':>6}")
    for st in STAGE_ORDER:
        b, u = m["billed"][st], m["used"][st]
        share = u / b if b else 0.0
        out.append(f"  {st:<10}{fmt(m['stages'].get(st, 0.0)):>10}{b:>14,.1f}{u:>12,.1f}{share:>6.0%}")
    out.append(f"  {'total':<10}{fmt(m['total']):>10}{m['billed_total']:>14,.1f}{m['used_total']:>12,.1f}"
               f"{m['utilisation']:>6.0%}")
    return out


def print_makespan(p: Profile, r: rates_mod.Rates, clusters: list[str] | None = None) -> None:
    """The makespan section of the dry run: rates and their sources, the packing model, a table
    over clusters (``clusters``, NODESxGPUS, or DEFAULT_CLUSTERS for a GPU profile) and, for each
    cluster asked for, its plan and per-stage billed and used GPU-hours."""
    gpu = rates_mod._device(p) == "gpu"
    if clusters and not gpu:
        raise ValueError(f"--cluster sizes a GPU cluster; profile {p.name!r} runs on CPUs")
    specs = [parse_cluster(c) for c in clusters or []]
    kind = "measured" if r.measured else "ESTIMATE, not measured"
    print(f"makespan from rates ({kind}: {r.hardware}; from {r.source}):")
    for what, src in r.sources.items():
        print(f"  rate of {what}: {src}")
    for note in r.notes:
        print(f"  note: {note}")
    for line in _packing_lines(p, r):
        print("  " + line)
    tasks = rates_mod.tasks(p, r)
    rows = [on_cluster(p, r, c, tasks) for c in (specs or [parse_cluster(x) for x in DEFAULT_CLUSTERS])] \
        if gpu else [as_configured(p, r, tasks)]
    for line in _table(rows, "GPU" if gpu else "CPU"):
        print(line)
    print("  (total: stage after stage, as the driver runs; no barriers: the same graph if stages "
          "overlapped; billed: every device of the cluster for the total; used: device time the tasks held)")
    for m in rows if specs else []:
        for line in _detail(m):
            print("  " + line)
        problem = eval_cpu_problem(p, m["cluster"].node_list()[0])
        if problem:
            print(f"  warning: {problem}")
