"""The dry run's makespan on clusters: the plan the driver would derive there
(orchestrator/plan/concurrency.py), the grid scheduled with it (orchestrator/plan/makespan.py), and per
stage its span and three GPU-hour figures: billed (every GPU of every node for that span: what a cluster held
for the run costs; the report, on the driver's CPU, bills the GPU nodes only until the autoscaler
returns them), allocated (the GPU-time its tasks held) and busy (the part of that the devices
computed: orchestrator/plan/rates/overheads.py for training and extraction, the packing model's
k x t_dev / step(k) for evaluation). Pure Python; loads no model.
"""
from __future__ import annotations

import dataclasses
import re

from orchestrator.grid import BENCHMARK_SIZES, cell_prompts, eval_cells, train_cells
from orchestrator.plan import packing
from orchestrator.plan import rates as rates_mod
from orchestrator.plan.concurrency import Cluster, actors_per_gpu, derive, eval_cpu_problem, parse_cluster
from orchestrator.plan.costs import ASSUMPTIONS, VERIFIERS
from orchestrator.plan.makespan import GRAPH_BARRIERS, STAGE_ORDER, schedule
from orchestrator.plan.rates import overheads
from orchestrator.plan.rates.taskgraph import _for
from orchestrator.profile import Profile

DEFAULT_CLUSTERS = ("1x8", "2x8", "4x8", "8x8")  # NODESxGPUS a GPU profile's makespan is shown on


def fmt(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds < 3 * 3600 else f"{seconds / 3600:.1f} h"


def _run(tasks: list, devices: float, caps: dict, release: bool = False, graph: bool = False) -> dict:
    """The graph scheduled as the driver runs it (``graph``: training after every cache, merges and
    evaluation on what is ready, cluster.schedule; else stage after stage) and the other way; per stage its
    span, and its allocated and busy device-hours; billed per stage when the stages do not overlap.
    ``release``: the report bills the devices only until the autoscaler returns them (ASSUMPTIONS'
    idle_release_s)."""
    staged = schedule(tasks, devices, caps, barriers=True)
    free = schedule(tasks, devices, caps, barriers=False)
    s = schedule(tasks, devices, caps, barriers=GRAPH_BARRIERS) if graph else staged
    spans = {st: b - a for st, (a, b) in s["stages"].items()}
    held = {st: spans.get(st, 0.0) for st in STAGE_ORDER}
    if release:
        held["report"] = min(held["report"], ASSUMPTIONS["idle_release_s"])
    billed = None if graph else {st: devices * held[st] / 3600 for st in STAGE_ORDER}  # (spans overlap)
    used = {st: s["stage_busy"].get(st, 0.0) / 3600 for st in STAGE_ORDER}
    busy = {st: s["stage_device"].get(st, 0.0) / 3600 for st in STAGE_ORDER}
    report_start = s["stages"]["report"][0] if "report" in s["stages"] else s["makespan"]
    total_billed = devices * (report_start + held["report"]) / 3600
    return {"devices": devices, "caps": caps, "stages": spans, "total": s["makespan"], "graph": graph,
            "staged": staged["makespan"],
            # (greedy list scheduling without the barriers can come out a little longer than with
            # them, an anomaly of the heuristic, not of the graph: the bound is the shorter)
            "pipelined": min(free["makespan"], staged["makespan"]), "billed": billed, "used": used,
            "busy": busy,
            "billed_total": total_billed, "used_total": s["busy"] / 3600, "busy_total": sum(busy.values()),
            "utilisation": s["busy"] / 3600 / total_billed if total_billed else 0.0}


def eval_shards(p: Profile) -> int:
    """Eval units (shards) of ``p``'s grid."""
    size = p.eval.shard_size
    return sum(-(-min(cell_prompts(p, c) or BENCHMARK_SIZES[c.benchmark],
                      BENCHMARK_SIZES[c.benchmark]) // size)
               for c in eval_cells(p))


def packed(p: Profile, gpus: float) -> Profile:
    """``p`` with the eval actors' GPU share the plan derived (resources.eval.packing auto)."""
    e = p.resources.eval
    if abs(gpus - e.num_gpus) < 1e-12:
        return p
    return dataclasses.replace(p, resources=dataclasses.replace(
        p.resources, eval=dataclasses.replace(e, num_gpus=gpus)))


def on_cluster(p: Profile, r: rates_mod.Rates, cluster: Cluster) -> dict:
    """The grid on ``cluster`` at the concurrency (and eval packing) the driver would derive there (the
    profile's numbers as caps): spans, makespan, billed, allocated and busy GPU-hours."""
    plan = derive(p, cluster.node_list(), trials=len(train_cells(p)), eval_units=eval_shards(p))
    pc = packed(p, plan.eval.gpus)
    devices = float(cluster.nodes * cluster.gpus)
    tasks = rates_mod.tasks(pc, r, gpus=devices, actors=plan.eval.units)
    caps = {"train": plan.train.units, "eval": plan.eval.units, "merge": 1}
    graph = p.cluster.graph(p.resources.train.use_gpu)
    return _run(tasks, devices, caps, release=True, graph=graph) | {"cluster": cluster, "plan": plan,
                                                                    "profile": pc, "rates": r}


def as_configured(p: Profile, r: rates_mod.Rates) -> dict:
    """The profile's own concurrency on as many devices as it uses (a CPU profile: its machine)."""
    tasks = rates_mod.tasks(p, r)
    graph = p.cluster.graph(p.resources.train.use_gpu)
    return _run(tasks, rates_mod.profile_devices(p), rates_mod.caps(p), graph=graph) | {
        "cluster": None, "plan": None, "profile": p, "rates": r}


def step_label(r: rates_mod.Rates) -> str:
    """The eval step a set of rates times evaluation with, and what kind of figure it is."""
    ms = 1e3 / _for(r.eval_steps_per_s, "single")
    src = r.sources.get("eval steps", "")
    end = re.search(r"the (\w+) end", src)
    kind = f"{end.group(1)} end" if end else src.split(":", 1)[0].split(" (")[0] or "measured"
    return f"{ms:.0f} ms ({kind})"


def _packing_lines(p: Profile, r: rates_mod.Rates) -> list[str]:
    """The eval packing model's lines (GPU profiles), with the memory k actors hold on one GPU."""
    g = p.resources.eval.num_gpus
    if rates_mod._device(p) != "gpu" or g <= 0:
        return []
    k = actors_per_gpu(g)
    pk = rates_mod.packing_model(p, r)
    auto = "; resources.eval.packing auto: the plan's packing on each cluster, below" \
        if p.resources.eval.packing == "auto" else ""
    lines = [f"eval packing at {step_label(r)} (orchestrator/plan/packing.py): {k} actor(s) per GPU "
             f"(resources.eval.num_gpus {g:g}){auto}"]
    lines += ["  " + x for x in packing.describe(pk, k)]
    v = VERIFIERS.get(p.verifier)
    if v is not None:
        rows = p.resources.eval.verify_batch
        each = packing.actor_memory_gb(v, packing.DTYPE_BYTES[p.verifier_dtype],
                                       p.resources.eval.drafter_cache_gb, rows)
        gib = p.resources.gpu_memory_gib
        cap = gib * 2**30 / 1e9 if gib else packing.ASSUMED_GPU_MEMORY_GB
        of = f"resources.gpu_memory_gib {gib:g}" if gib else f"an {packing.ASSUMED_GPU}"
        warn = "" if k * each <= cap else "  WARNING: more than the GPU holds; lower the packing"
        kv = packing.kv_row_gb(v, packing.DTYPE_BYTES[p.verifier_dtype])
        more = (f", {rows - 1} more prompt KV cache(s) of {packing.ROW_CONTEXT_TOKENS:,} tokens "
                f"({kv:.2f} GB each)") if rows > 1 else ""
        lines.append(f"  memory: {k} x {each:.1f} GB (verifier weights, resources.eval.drafter_cache_gb, "
                     f"{packing.ACTOR_WORKING_GB:g} GB working{more}) = {k * each:.1f} GB of {cap:.1f} GB "
                     f"({of}; estimate){warn}")
    lines += _batching_lines(p, r)
    lines.append(f"  busy: k actors keep a GPU computing k x t_dev of each packed step: {k} x "
                 f"{pk['t_dev_s'] * 1e3:.1f}"
                 f" / {packing.step_time(pk['t_step_s'], pk['t_dev_s'], k) * 1e3:.1f} ms = "
                 f"{min(1.0, k * pk['t_dev_s'] / packing.step_time(pk['t_step_s'], pk['t_dev_s'], k)):.0%} "
                 "of it")
    return lines


def _batching_lines(p: Profile, r: rates_mod.Rates) -> list[str]:
    """What resources.eval.verify_batch does to the plan, and where its figure comes from."""
    b = p.resources.eval.verify_batch
    if b <= 1:
        return []
    gain, share = rates_mod.eval_batching(p, r, b)
    if not any(int(m) <= b for m in r.eval_batch_gain):
        return [f"  batching: resources.eval.verify_batch {b} has no measured rate (a GPU rates file's "
                "batched rows, experiments/gpu_rates.sh): planned one prompt at a time"]
    return [f"  batching: an actor decodes up to {b} prompts in lock step: {gain:.2f}x the tokens/s of one "
            f"at a time ({r.sources.get('eval batching', 'measured')}); device work per prompt step "
            f"{share:.0%} of one at a time (the verifier's and drafters' weights read once for the batch: "
            "a bytes estimate without KV-cache reads); "
            "the packing model's contention is batch 1's; a shard with fewer prompts batches fewer"]


def _derived_packing(m: dict, p: Profile) -> list[str]:
    """Why the plan packs the eval actors as it does on this cluster, and what it buys by the model."""
    why = m["plan"].eval.packing
    if not why:
        return []
    pk = rates_mod.packing_model(p, m["rates"])
    t, d = pk["t_step_s"], pk["t_dev_s"]
    k, k0 = actors_per_gpu(m["plan"].eval.gpus), actors_per_gpu(p.resources.eval.num_gpus)
    gain = (k / packing.step_time(t, d, k)) / (k0 / packing.step_time(t, d, k0))
    return [f"eval packing: {why}; by the packing model at {step_label(m['rates'])}: {gain:.2f}x the steps/s "
            f"per GPU of {k0} (resources.eval.num_gpus {p.resources.eval.num_gpus:g}), k* = {t / d:.1f}"]


COLUMNS = (("features", "features"), ("train", "train"), ("merge", "merge"), ("eval", "eval"), ("report",
        "report"))


def _other(m: dict) -> str:
    """The schedule the driver does not run, for comparison: its column's heading."""
    return "stage after stage" if m["graph"] else "no barriers"


def _table(rows: list[dict], unit: str) -> list[str]:
    other = _other(rows[0])
    head = (f"  {'cluster':<27}{'eval step':>20}" + "".join(f"{h:>10}" for _, h in COLUMNS)
            + f"{'total':>9}{other:>19}{'billed ' + unit + '-h':>14}{'allocated':>11}{'busy':>9}"
            + f"{'busy%':>6}")
    out = [head]
    for m in rows:
        c = m["cluster"]
        label = (f"{c.nodes}x{c.gpus} ({m['caps']['train']} trials, {m['caps']['eval']} actors)" if c
                 else f"{m['devices']:g} {unit} (as configured)")
        cols = "".join(f"{fmt(m['stages'].get(s, 0.0)):>10}" for s, _ in COLUMNS)
        share = m["busy_total"] / m["billed_total"] if m["billed_total"] else 0.0
        alt = m["staged"] if m["graph"] else m["pipelined"]
        out.append(f"  {label:<27}{step_label(m['rates']):>20}{cols}{fmt(m['total']):>9}{fmt(alt):>19}"
                   f"{m['billed_total']:>14,.0f}{m['used_total']:>11,.0f}{m['busy_total']:>9,.0f}{share:>6.0%}")
    return out


def _detail(m: dict) -> list[str]:
    """One cluster's plan and its stages: span, billed (stage after stage), allocated and busy GPU-hours."""
    c = m["cluster"]
    out = [f"on {c.nodes}x{c.gpus}, eval step {step_label(m['rates'])}: {c.describe()}",
           "  " + m["plan"].line()]
    if m["graph"]:
        out.append("  (the task graph: the stages' spans overlap, so only the total is billed; alloc% and "
                   "busy% of a stage are of its span's devices)")
    out.append(f"  {'stage':<10}{'span':>10}{'billed GPU-h':>14}{'allocated':>11}{'busy':>9}"
               f"{'alloc%':>8}{'busy%':>7}  (% of billed)")
    per = m["billed"] or {st: m["devices"] * m["stages"].get(st, 0.0) / 3600 for st in STAGE_ORDER}
    rows = [(st, m["stages"].get(st, 0.0), per[st], m["used"][st], m["busy"][st]) for st in STAGE_ORDER]
    rows.append(("total", m["total"], m["billed_total"], m["used_total"], m["busy_total"]))
    for st, span, b, u, d in rows:
        shown = "-" if m["graph"] and st != "total" else f"{b:,.1f}"
        out.append(f"  {st:<10}{fmt(span):>10}{shown:>14}{u:>11,.1f}{d:>9,.1f}"
                   f"{u / b if b else 0.0:>8.0%}{d / b if b else 0.0:>7.0%}")
    return out


def _sources(runs: list[rates_mod.Rates]) -> list[str]:
    """Every rate with its source: the first set's all, the others' only where they differ."""
    first = runs[0]
    out = [f"rate of {what}: {src}" for what, src in first.sources.items()]
    for r in runs[1:]:
        out += [f"rate of {what} ({step_label(r)}): {src}" for what, src in r.sources.items()
                if first.sources.get(what) != src]
    return out


def print_makespan(p: Profile, runs, clusters: list[str] | None = None) -> None:
    """The makespan section of the dry run for each set of rates in ``runs`` (one Rates, or several:
    the ends of a measured range): rates and their sources, overheads and theirs, the packing model,
    a table over clusters (``clusters``, NODESxGPUS, or DEFAULT_CLUSTERS for a GPU profile) and, for
    each cluster asked for, its plan and per-stage billed, allocated and busy GPU-hours."""
    runs = [runs] if isinstance(runs, rates_mod.Rates) else list(runs)
    gpu = rates_mod._device(p) == "gpu"
    if clusters and not gpu:
        raise ValueError(f"--cluster sizes a GPU cluster; profile {p.name!r} runs on CPUs")
    specs = [parse_cluster(c) for c in clusters or []]
    r0 = runs[0]
    kind = "measured" if r0.measured else "ESTIMATE, not measured"
    print(f"makespan from rates ({kind}: {r0.hardware}; from {r0.source}):")
    for line in _sources(runs) + [f"note: {n}" for n in r0.notes]:
        print("  " + line)
    if r0.modelled_overheads:
        for line in overheads.sources(p):
            print(f"  overhead: {line}")
    for r in runs:
        for line in _packing_lines(p, r):
            print("  " + line)
    grid = specs or [parse_cluster(x) for x in DEFAULT_CLUSTERS]
    rows = [on_cluster(p, r, c) for c in grid for r in runs] if gpu else [as_configured(p, r) for r in runs]
    for line in _table(rows, "GPU" if gpu else "CPU"):
        print(line)
    how = ("total: as the driver runs it (cluster.schedule graph: merges and evaluation start as their "
           "inputs exist); stage after stage: each stage after the last" if rows[0]["graph"] else
           "total: stage after stage, as the driver runs (cluster.schedule stages); no barriers: the same "
           "graph if stages overlapped")
    print(f"  ({how}; billed: every device of the cluster for the total, the report's GPUs until the "
          "autoscaler returns them; allocated: device time the tasks held; busy: the part of it the devices "
          "computed)")
    for m in rows if specs else []:
        for line in _derived_packing(m, p) + _detail(m):
            print("  " + line)
        problem = eval_cpu_problem(m["profile"], m["cluster"].node_list()[0])
        if problem:
            print(f"  warning: {problem}")
