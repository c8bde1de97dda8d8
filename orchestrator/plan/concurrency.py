"""The plan: how many training trials and evaluation actors a cluster holds. Pure Python (no
Ray, no torch): the driver feeds it the nodes Ray reports, the dry run a ``--cluster NODESxGPUS``
spec, the tests a hand-made list. How fast packed actors decode: orchestrator/plan/packing.py.

Concurrency (:func:`derive`): a training trial holds ``resources.train.num_workers`` workers of
``cpus_per_worker`` CPUs (+ 1 GPU each with ``use_gpu``), an eval actor ``resources.eval``'s CPUs
and GPU share; each node holds as many as its CPUs and GPUs allow (a fractional GPU request must fit
on one GPU, as Ray places it), and the profile's numbers (``max_concurrent_trials``,
``eval_actors``) are caps, not the plan.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

EPS = 1e-9
PACK_MOST = 8  # the most batch-1 eval actors resources.eval.packing auto puts on one GPU
CPUS_PER_GPU = 12  # a --cluster spec without CPUs: a p4d/p4de.24xlarge's 96 vCPUs for 8 GPUs


# ---------------------------------------------------------------- the cluster
@dataclass(frozen=True)
class Cluster:
    nodes: int
    gpus: int  # per node
    cpus: int  # per node
    cpus_assumed: bool  # True: CPUS_PER_GPU x gpus, not given

    def node_list(self) -> list[dict]:
        return [{"CPU": float(self.cpus), "GPU": float(self.gpus)}] * self.nodes

    def describe(self) -> str:
        cpus = f"{self.cpus} CPUs each"
        if self.cpus_assumed:
            cpus += (f" (assumed: {CPUS_PER_GPU} per GPU, as a p4d/p4de.24xlarge; write "
                     f"{self.nodes}x{self.gpus}xCPUS to set them)")
        return f"{self.nodes} node(s) x {self.gpus} GPU(s) = {self.nodes * self.gpus} GPUs, {cpus}"


def parse_cluster(spec: str) -> Cluster:
    """``NODESxGPUS`` or ``NODESxGPUSxCPUS`` (per node), e.g. 4x8 or 4x8x96; one ValueError line otherwise."""
    m = re.fullmatch(r"\s*(\d+)\s*x\s*(\d+)\s*(?:x\s*(\d+)\s*)?", str(spec))
    if not m or any(int(x) < 1 for x in m.groups() if x is not None):
        raise ValueError(f"--cluster must be NODESxGPUS or NODESxGPUSxCPUS with positive numbers "
                         f"(e.g. 4x8 or 4x8x96), got {spec!r}")
    n, g = int(m.group(1)), int(m.group(2))
    return Cluster(n, g, int(m.group(3)) if m.group(3) else CPUS_PER_GPU * g, m.group(3) is None)


def max_nodes(alive: list[dict], groups: list[tuple[dict, int]]) -> tuple[list[dict], list[str]]:
    """The most nodes the cluster can have: the ``alive`` nodes' resources, plus for each autoscaler
    node group (its resources, its max_count) as many more of its shape as max_count leaves once its
    alive nodes (those with its CPU and GPU counts) are counted. A group without a limit (-1) adds
    nothing it has not got: (nodes, notes) says so."""
    nodes, notes = [dict(a) for a in alive], []
    for shape, most in groups:
        if most == 0 or not shape:
            continue
        if most < 0:
            notes.append(f"node group {shape} has no max_count: planned on its alive nodes only")
            continue
        have = sum(1 for a in alive if all(abs(a.get(k, 0) - shape.get(k, 0)) < EPS for k in ("CPU", "GPU")))
        nodes += [dict(shape)] * max(0, most - have)
    return nodes, notes


# ---------------------------------------------------------------- concurrency
def actors_per_gpu(num_gpus: float) -> int:
    """Eval actors Ray places on one GPU at ``num_gpus`` each (1 for a whole GPU or more, 0 for none)."""
    if num_gpus <= 0:
        return 0
    return max(1, int(math.floor(1.0 / num_gpus + EPS)))


def _eval_slots(node: dict, cpus: float, gpus: float) -> float:
    by_cpu = math.floor(node.get("CPU", 0) / cpus + EPS) if cpus > 0 else math.inf
    if gpus <= 0:
        by_gpu = math.inf
    elif gpus < 1:
        by_gpu = math.floor(node.get("GPU", 0) + EPS) * actors_per_gpu(gpus)
    else:
        by_gpu = math.floor(node.get("GPU", 0) / gpus + EPS)
    return min(by_cpu, by_gpu)


def _worker_slots(node: dict, cpus: int, use_gpu: bool) -> float:
    by_cpu = math.floor(node.get("CPU", 0) / cpus + EPS) if cpus > 0 else math.inf
    return min(by_cpu, math.floor(node.get("GPU", 0) + EPS) if use_gpu else math.inf)


@dataclass(frozen=True)
class StagePlan:
    units: int  # trials or actors to run at once
    fits: float  # how many the cluster holds (inf: nothing limits them)
    cpus: float  # per unit
    gpus: float  # per unit
    limit: str  # what set ``units``
    packing: str = ""  # eval with resources.eval.packing auto: actors per GPU and why


@dataclass(frozen=True)
class Plan:
    train: StagePlan
    eval: StagePlan
    cpus: float  # the cluster's, in all
    gpus: float
    device: str  # "GPU" | "CPU": what the profile's stages are measured in

    def line(self) -> str:
        """``plan: training 8 trials x 4 GPUs = 32/32 GPUs; eval 64 actors x 0.5 GPU = 32/32 GPUs``"""
        key, total = ("gpus", self.gpus) if self.device == "GPU" else ("cpus", self.cpus)

        def part(name: str, s: StagePlan, what: str) -> str:
            per = getattr(s, key)
            each = f"{per:g}" if len(f"{per:g}") <= 5 else f"1/{round(1 / per)}"
            out = (f"{name} {s.units} {what}{'s' if s.units != 1 else ''} x {each} "
                   f"{self.device}{'s' if per > 1 else ''}")
            return out + f" = {s.units * per:.4g}/{total:g} {self.device}s ({s.limit})"

        return f"plan: {part('training', self.train, 'trial')}; {part('eval', self.eval, 'actor')}"


def _pick(cap: int, cap_key: str, want: int | None, want_what: str, fits: float) -> tuple[int, str]:
    """min(cap, want, fits), at least 1, and which of them set it."""
    options = [(cap, f"capped by {cap_key} {cap}"), (fits, f"the cluster holds {fits:g}")]
    if want is not None:
        options.append((want, f"{want} {want_what}"))
    n, why = min(options, key=lambda o: o[0])
    if fits < 1:
        return 1, "the cluster holds none now: 1, waiting for a node that fits"
    return max(1, int(n)), why


def derive(p, nodes: list[dict], trials: int | None = None, eval_units: int | None = None) -> Plan:
    """Trial concurrency and eval actors for profile ``p`` on ``nodes`` (each node's resources, as
    ``ray.nodes()`` gives them), capped by the profile's ``max_concurrent_trials`` and ``eval_actors``
    and by the work there is (``trials`` drafters to train, ``eval_units`` shards; None: no limit)."""
    r = p.resources
    t, e = r.train, r.eval
    workers = sum(_worker_slots(n, t.cpus_per_worker, t.use_gpu) for n in nodes)
    fits_t = math.floor(workers / t.num_workers) if math.isfinite(workers) else math.inf
    n_t, why_t = _pick(t.max_concurrent_trials, "resources.train.max_concurrent_trials", trials,
                       "drafters to train", fits_t)
    packed = pack_per_gpu(p, nodes)
    share = 1.0 / packed[0] if packed else e.num_gpus
    fits_e = sum(_eval_slots(n, e.num_cpus, share) for n in nodes)
    n_e, why_e = _pick(r.eval_actors, "resources.eval_actors", eval_units, "shards to run", fits_e)
    gpu = t.use_gpu or e.num_gpus > 0 or r.features.num_gpus > 0
    return Plan(StagePlan(n_t, fits_t, t.num_workers * t.cpus_per_worker, t.num_workers if t.use_gpu else 0,
                          why_t),
                StagePlan(n_e, fits_e, e.num_cpus, share, why_e, packed[1] if packed else ""),
                cpus=sum(n.get("CPU", 0) for n in nodes), gpus=sum(n.get("GPU", 0) for n in nodes),
                device="GPU" if gpu else "CPU")


def pack_per_gpu(p, nodes: list[dict]) -> tuple[int, str] | None:
    """Eval actors per GPU under ``resources.eval.packing: auto``, and why: the fewest per GPU that
    place the most actors on a node, within what one GPU's memory holds (resources.gpu_memory_gib over
    packing.actor_memory_gb), what the node's CPUs feed (its CPUs over resources.eval.num_cpus; the
    GPU nodes with the fewest CPUs per GPU decide) and PACK_MOST. Batch-1 actors are host-bound, so
    by the packing model every actor added raises a GPU's steps/s (orchestrator/plan/packing.py); memory
    and CPUs are what stop it. None where the profile packs as written or nothing says (no
    gpu_memory_gib, a verifier of unknown size, no GPU nodes)."""
    from orchestrator.plan.costs import (
        VERIFIERS,  # (pure modules; imported here to keep plan.py's own imports bare)
    )
    from orchestrator.plan.packing import DTYPE_BYTES, actor_memory_gb

    r, e = p.resources, p.resources.eval
    v, gpu_nodes = VERIFIERS.get(p.verifier), [n for n in nodes if n.get("GPU", 0) >= 1]
    if e.packing != "auto" or e.num_gpus <= 0 or r.gpu_memory_gib is None or v is None or not gpu_nodes:
        return None
    each = actor_memory_gb(v, DTYPE_BYTES[p.verifier_dtype], e.drafter_cache_gb, e.verify_batch)
    cap = r.gpu_memory_gib * 2**30 / 1e9
    by_mem = max(1, int(math.floor(cap / each + EPS)))
    node = min(gpu_nodes, key=lambda n: n.get("CPU", 0) / n["GPU"])
    gpus = int(math.floor(node["GPU"] + EPS))
    fed = int(math.floor(node.get("CPU", 0) / e.num_cpus + EPS)) if e.num_cpus > 0 else gpus * PACK_MOST
    k = min(range(1, min(by_mem, PACK_MOST) + 1), key=lambda k: (-min(gpus * k, fed), k))
    return k, (f"{k} per GPU (resources.eval.packing auto): the most actors a node places, "
               f"{min(gpus * k, fed)} "
               f"on its {gpus} GPUs; memory holds {by_mem} a GPU ({each:.1f} GB each of {cap:.1f} GB, "
               f"resources.gpu_memory_gib {r.gpu_memory_gib:g}), its {node.get('CPU', 0):g} CPUs feed {fed} "
               f"(resources.eval.num_cpus {e.num_cpus:g}), at most {PACK_MOST} a GPU")


def eval_cpu_problem(p, node: dict) -> str | None:
    """One line when the eval actors' CPUs, not the GPUs, limit how many a node of this type holds
    (its GPUs then sit partly idle through evaluation); None when the GPUs do."""
    e = p.resources.eval
    if e.num_gpus <= 0 or e.num_cpus <= 0:
        return None
    by_gpu = _eval_slots({"GPU": node.get("GPU", 0)}, 0, e.num_gpus)
    by_cpu = math.floor(node.get("CPU", 0) / e.num_cpus + EPS)
    if by_cpu >= by_gpu:
        return None
    return (f"eval actors are CPU-bound on this node type: {by_gpu:g} actors x {e.num_cpus:g} CPUs = "
            f"{by_gpu * e.num_cpus:g} > {node.get('CPU', 0):g} CPUs per node, so {by_cpu:g} actors use "
            f"{by_cpu * e.num_gpus:g} of {node.get('GPU', 0):g} GPUs; set resources.eval.num_cpus <= "
            f"{math.floor(node.get('CPU', 0) / by_gpu * 100) / 100:g}")
