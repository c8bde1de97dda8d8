"""The Ray cluster as the driver sees it: starting or joining it, what it holds (for the plan and for
the record of where stage times were measured), and the pool of evaluation actors."""
from __future__ import annotations

import os

import ray

from common import storage
from orchestrator.plan.concurrency import max_nodes
from orchestrator.plan.rates import hardware
from orchestrator.profile import Profile
from orchestrator.run.eval_pool import EvalPool
from workers.eval_worker import EvalWorker


def ray_init(p: Profile) -> None:
    if ray.is_initialized():
        return
    env = {"TOKENIZERS_PARALLELISM": "false", "TASKSPEC_VERBOSE": os.environ.get("TASKSPEC_VERBOSE", "0")}
    if env["TASKSPEC_VERBOSE"] != "1":  # transformers' GGUF loader draws a plain tqdm bar per process
        env["TQDM_DISABLE"] = "1"
    env.update(storage.endpoint_env())  # an S3-compatible endpoint set here reaches every worker
    # quiet: workers' own output stays in Ray's log files (/tmp/ray/session_latest/logs, the dashboard);
    # the console gets the driver's stage lines and summary. Failures reach the manifest and the report.
    quiet = {} if env["TASKSPEC_VERBOSE"] == "1" else {"log_to_driver": False, "logging_level": "WARNING"}
    if os.environ.get("RAY_ADDRESS"):  # inside `ray job submit` or a configured cluster
        ray.init(address=os.environ["RAY_ADDRESS"], runtime_env={"env_vars": env}, **quiet)
    else:  # TASKSPEC_METRICS_PORT: where the local head serves Prometheus metrics (default: a random port)
        port = os.environ.get("TASKSPEC_METRICS_PORT")
        extra = {"_metrics_export_port": int(port)} if port else {}
        ray.init(dashboard_host="127.0.0.1", include_dashboard=True, runtime_env={"env_vars": env},
                 **quiet, **extra)


def machine() -> str:
    """What the stage times were measured on: the driver's host and the Ray cluster's totals."""
    res = ray.cluster_resources()
    kinds = sorted(k.split(":", 1)[1] for k in res if k.startswith("accelerator_type:"))
    gpus = f" {res.get('GPU', 0):g} GPU" + (f" ({', '.join(kinds)})" if kinds else "")
    return f"driver {hardware()}; cluster {len(ray.nodes())} node(s), {res.get('CPU', 0):g} CPU,{gpus}"


def cluster_nodes() -> tuple[list[dict], str]:
    """(per-node resources, where they come from) that the plan is derived from: the autoscaler's
    maximum when it publishes a cluster config (the alive nodes plus what each node group's
    max_count can still add, orchestrator.plan.concurrency.max_nodes), else the alive nodes."""
    from ray._private.state import state

    alive = [dict(n.get("Resources") or {}) for n in ray.nodes() if n["Alive"]]
    try:
        config = state.get_cluster_config()
    except Exception:  # noqa: BLE001 - an older Ray or no GCS entry: the cluster as it is
        config = None
    groups = [(dict(g.resources), g.max_count) for g in (config.node_group_configs if config else [])]
    if not groups:
        return alive, f"the Ray cluster as it is now ({len(alive)} node(s); no autoscaler config)"
    nodes, notes = max_nodes(alive, groups)
    return nodes, f"the autoscaler's maximum ({len(nodes)} node(s))" + "".join(f"; {n}" for n in notes)


def eval_pool(p: Profile, n: int, log=print, worker=EvalWorker, num_gpus: float | None = None) -> EvalPool:
    """``n`` evaluation actors with ``p``'s resources.eval: a fractional num_gpus packs several onto
    one GPU (Ray places 1/num_gpus per GPU), each with num_cpus CPUs (its torch threads). ``num_gpus``:
    the plan's share (resources.eval.packing auto, orchestrator/plan/concurrency.py), else the profile's."""
    r = p.resources.eval
    gpus = r.num_gpus if num_gpus is None else num_gpus
    cls = ray.remote(num_cpus=r.num_cpus, num_gpus=gpus, max_restarts=-1, max_task_retries=0)(worker)
    args = (p.verifier, p.verifier_dtype, max(1, int(r.num_cpus)), r.drafter_cache_gb, r.checkpoint_disk_gb,
            r.verify_batch)
    return EvalPool(lambda name: cls.options(name=name).remote(*args), n, log=log)
