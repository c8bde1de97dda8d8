"""Preflight: everything a run will need from outside, resolved before any work starts.

Each benchmark the profile evaluates and each corpus its variants train on must be found (local
data root, data package or Hub metadata: ``drafters.data.sources.locate``, no rows read), and
the verifier must resolve: the GGUF file of a GGUF verifier is there (its header is read, not its
weights), any other verifier's config loads. A training corpus must hold ``data.n + data.heldout``
records (counted, not tokenized), and training must fit ``resources.gpu_memory_gib`` per GPU
(orchestrator/plan/sizing.py's estimate). A missing benchmark is reported here, before hours of
training, not when evaluation starts. Each problem is one line; all of them are reported together.
Checked on the driver's node: workers on other nodes resolve the same names on theirs.

Once Ray is up, the cluster is checked too (:func:`check_cluster`): a local output directory on a
multi-node cluster is refused unless ``cluster.shared_mount``, and so is a stage whose unit (a
features task, a training worker, an eval actor) fits on no node the autoscaler can have. At the
training stage (:func:`check_train_resources`), training's resources are compared with the most
the cluster can have (the autoscaler's maximum), or without an autoscaler with the cluster as it
is then, not as it was at the start.
"""
from __future__ import annotations

import os
from pathlib import Path

from drafters.data.sources import DataSourceNotFound, DataSourceTooSmall, SourceOptions, locate
from orchestrator.grid import corpora
from orchestrator.profile import Profile

GGUF_MAGIC = b"GGUF"


class PreflightError(RuntimeError):
    """What the run would miss, one line per problem (``problems``)."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())


def corpus_lines(p: Profile, options: SourceOptions | None = None) -> tuple[list[str], list[str]]:
    """(found lines, problem lines) for the training corpora of ``p``: each must hold
    ``data.n + data.heldout`` records where it is found (counted, not tokenized). A short place is
    passed over; a corpus that every place has too few of is one problem line naming each place,
    what it holds and what was asked. The dry run checks this part."""
    need = p.data.n + p.data.heldout
    found, problems = [], []
    for c in corpora(p):
        try:
            found.append(f"{c}: {locate(c, options or SourceOptions(), need=need)}")
        except DataSourceNotFound as e:
            key = "data.n + data.heldout" if isinstance(e, DataSourceTooSmall) else "train.variants"
            problems.append(f"{key}: {_one_line(e)}")
    return found, problems


def _data(p: Profile, options: SourceOptions) -> tuple[list[str], list[str]]:
    """(found lines, problem lines) for every benchmark and training corpus of ``p``."""
    found, problems = [], []
    for b in p.eval.benchmarks:
        try:
            found.append(f"{b}: {locate(b, options)}")
        except DataSourceNotFound as e:
            problems.append(f"eval.benchmarks: {_one_line(e)}")
    cfound, cproblems = corpus_lines(p, options)
    return found + cfound, problems + cproblems


def _verifier(p: Profile) -> tuple[list[str], list[str]]:
    """The verifier resolves: the GGUF file is there and is a GGUF file, or the config loads."""
    from common.verifiers import resolve, verifier_config

    try:
        source = resolve(p.verifier)
    except (ValueError, FileNotFoundError) as e:
        return [], [f"verifier {p.verifier!r}: {_one_line(e)}"]
    if source.gguf_file:  # AutoConfig would parse the whole GGUF file (~10 s): its header says enough
        path = Path(source.path) / source.gguf_file
        try:
            with open(path, "rb") as f:
                magic = f.read(4)
        except OSError as e:
            return [], [f"verifier {p.verifier!r}: cannot read {path}: {_one_line(e)}"]
        if magic != GGUF_MAGIC:
            return [], [f"verifier {p.verifier!r}: {path} is not a GGUF file (starts with {magic!r})"]
        return [f"verifier: {path}"], []
    try:
        config, meta = verifier_config(p.verifier)
    except Exception as e:  # noqa: BLE001 - what stops the config (network, gated, no file) is the problem
        token = "" if os.environ.get("HF_TOKEN") else " (HF_TOKEN is not set)"
        return [], [f"verifier {p.verifier!r}: its config does not load from {source.path}{token}: "
                    f"{type(e).__name__}: {_one_line(e)[:300]}"]
    found = [f"verifier: {meta['name_or_path']} ({', '.join(map(str, meta['architectures']))})"]
    return found, [line for line in [_eagle3_layers_problem(p, config)] if line]


def _eagle3_layers_problem(p: Profile, config: dict) -> str | None:
    """EAGLE-3 fuses three distinct verifier layers (drafters.eagle3.default_aux_layers); a verifier
    too shallow to give three is refused here, not in the training task after the cluster is up."""
    if "eagle3" not in p.train.backbones or not isinstance(config.get("num_hidden_layers"), int):
        return None
    from drafters.eagle3 import default_aux_layers

    n = config["num_hidden_layers"]
    aux = default_aux_layers(n)
    if len(set(aux)) == len(aux):
        return None
    return ("train.backbones: eagle3 fuses the verifier's layers (2, L // 2, L - 3), but verifier "
            f"{p.verifier!r} "
            f"has {n} decoder layers, which gives {list(aux)} (not distinct); use a verifier of 7 or more "
            "layers, or drop eagle3 from train.backbones")


def preflight(p: Profile, options: SourceOptions | None = None) -> list[str]:
    """Resolve every data set and the verifier's config of ``p``; returns one line per thing found.
    Raises :class:`PreflightError` listing every problem (one line each) when anything is missing."""
    from orchestrator.plan.sizing import memory_problem

    found, problems = _data(p, options or SourceOptions())
    vfound, vproblems = _verifier(p)
    memory = memory_problem(p)  # training that the profile's GPUs cannot hold (resources.gpu_memory_gib)
    problems = problems + vproblems + ([memory] if memory else [])
    if problems:
        raise PreflightError(problems)
    return found + vfound


# ---------------------------------------------------------------- the cluster (after ray.init)
def output_problem(local_output: bool, shared_mount: bool, nodes: int, max_nodes: float | None) -> str | None:
    """A local output directory on a cluster of more than one node (now, or once the autoscaler
    adds one) is seen by the driver's node only: Ray Train fails at its first checkpoint."""
    multi = nodes > 1 or (max_nodes or 0) > 1
    if not local_output or shared_mount or not multi:
        return None
    size = f"{nodes} nodes" if nodes > 1 else f"1 node now, up to {max_nodes:g} with the autoscaler"
    return (f"output: a local directory on a multi-node Ray cluster ({size}) is not shared with the other "
            f"nodes; use a URI (s3://, gs://, ...) or, if it is the same mount on every node, set "
            f"cluster.shared_mount: true")


def train_problem(p: Profile, capacity: dict, source: str) -> str | None:
    """resources.train against ``capacity`` (the most CPU/GPU the cluster can have)."""
    r = p.resources.train
    need_cpu = r.num_workers * r.cpus_per_worker  # the Tune trial's own actor holds no CPU
    cpu, gpu = capacity.get("CPU", 0), capacity.get("GPU", 0)
    if need_cpu <= cpu and (not r.use_gpu or r.num_workers <= gpu):
        return None
    return (f"resources.train asks for {r.num_workers} worker(s) x {r.cpus_per_worker} CPU"
            f"{' + 1 GPU' if r.use_gpu else ''} but {source} is {cpu:g} CPU / {gpu:g} GPU: lower "
            f"resources.train or add nodes")


def placement_problems(p: Profile, shapes: list[dict], stages=("features", "train", "eval")) -> list[str]:
    """One line per stage of ``stages`` whose unit (a features task, a training worker, an eval
    actor) fits on no node ``shapes`` names (those the cluster has or its autoscaler can add): Ray
    would wait for that placement for ever, whatever the cluster's totals."""
    r = p.resources
    units = {"features": (r.features.num_cpus, r.features.num_gpus),
             "train": (r.train.cpus_per_worker, 1 if r.train.use_gpu else 0),
             "eval": (r.eval.num_cpus, r.eval.num_gpus)}
    out = []
    for stage in stages:
        key, (cpu, gpu) = f"resources.{stage}", units[stage]
        if not shapes or any(s.get("CPU", 0) >= cpu and s.get("GPU", 0) >= gpu for s in shapes):
            continue
        largest = max(shapes, key=lambda s: (s.get("GPU", 0) if gpu else 0, s.get("CPU", 0)))
        out.append(f"{key} asks for {cpu:g} CPU{f' + {gpu:g} GPU' if gpu else ''} on one node, but no node "
                   f"of this cluster (nor any the autoscaler can add) has that: the largest has "
                   f"{largest.get('CPU', 0):g} CPU / {largest.get('GPU', 0):g} GPU")
    return out


def cluster_capacity() -> tuple[dict, str, int, float | None, list[dict], bool]:
    """(most CPU/GPU, where that number comes from, alive nodes, most nodes or None, node shapes,
    whether the shapes are every kind of node there can be). The maximum is the autoscaler's (Ray's
    own reading of the cluster config the autoscaler publishes in the GCS, as Ray Train uses it);
    without an autoscaler it is the current size, and says so. The shapes are the alive nodes'
    resources and those of every node group the autoscaler can add."""
    import ray
    from ray._private.state import state

    alive = [n for n in ray.nodes() if n["Alive"]]
    now, nodes = ray.cluster_resources(), len(alive)
    shapes = [dict(n.get("Resources") or {}) for n in alive]
    try:
        most, config = state.get_max_resources_from_cluster_config(), state.get_cluster_config()
    except Exception:  # noqa: BLE001 - an older Ray or no GCS entry: the current size stands
        most, config = None, None
    if not most:
        return now, "the Ray cluster's current size (no autoscaler config found)", nodes, None, shapes, False
    groups = list(config.node_group_configs) if config else []
    counts = [g.max_count for g in groups]
    max_nodes = float("inf") if -1 in counts else float(sum(counts)) if counts else None
    shapes += [dict(g.resources) for g in groups if g.max_count != 0]
    merged = {k: max(now.get(k, 0), most.get(k, 0)) for k in ("CPU", "GPU")}
    return merged, "the autoscaler's maximum for this cluster", nodes, max_nodes, shapes, True


def check_train_resources(p: Profile) -> None:
    """At the training stage, against the cluster as it is then (nodes may have joined since the
    start): the workers' total CPUs/GPUs, and one worker's placement on some node."""
    capacity, source, _, _, shapes, _ = cluster_capacity()
    total = train_problem(p, capacity, source)
    problems = ([total] if total else []) + placement_problems(p, shapes, ("train",))
    if problems:
        raise PreflightError(problems[:1])


def check_cluster(p: Profile, local_output: bool) -> None:
    """Before any work: refuse (PreflightError) a local output on a multi-node cluster without
    ``cluster.shared_mount``, and a stage whose unit fits on no node the autoscaler knows of. Without
    an autoscaler config, the nodes now may not be all (pods still starting), so a unit that fits
    none of them is one warning line here, and the training stage checks again."""
    capacity, source, nodes, max_nodes, shapes, complete = cluster_capacity()
    problem = output_problem(local_output, p.cluster.shared_mount, nodes, max_nodes)
    placement = placement_problems(p, shapes)
    if problem or (placement and complete):
        raise PreflightError(([problem] if problem else []) + (placement if complete else []))
    for line in placement:
        print(f"warning: {line} now; its units wait until such a node joins", flush=True)
    print(f"cluster: {nodes} node(s); resources checked against {source}: {capacity.get('CPU', 0):g} CPU / "
          f"{capacity.get('GPU', 0):g} GPU", flush=True)


# ---------------------------------------------------------------- what the dry run checks (no model, no Ray)
def dry_run_checks(p: Profile, options: SourceOptions | None = None) -> list[str]:
    """Print what the dry run can check of ``p`` without a model or a cluster: the records each
    training corpus can give against ``data.n + data.heldout``, the features mode and why, and the
    memory one training GPU needs per backbone against ``resources.gpu_memory_gib``. Returns the
    problem lines (the same lines the preflight refuses with)."""
    from orchestrator.plan.sizing import feature_mode_reason, memory_problem, profile_memory

    found, problems = corpus_lines(p, options)
    for line in found:
        print(f"  data     : {line}")
    print(f"  features : mode {feature_mode_reason(p)}")
    mem = profile_memory(p)
    if mem:
        cap = p.resources.gpu_memory_gib
        limit = f"resources.gpu_memory_gib {cap:g}" if cap is not None else \
            "resources.gpu_memory_gib not set: unchecked"
        print(f"  memory   : per training GPU (estimate; {limit}):")
        for m in mem.values():
            print(f"             {m.describe()}")
    problem = memory_problem(p)
    return problems + ([problem] if problem else [])
