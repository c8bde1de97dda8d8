"""Several evaluation actors packed onto one GPU, on a CPU: a local Ray that declares one (logical)
GPU and two CPUs, the smoke profile with resources.eval.num_gpus 0.25 and num_cpus 0.5, the plan
the driver derives there (4 actors), the driver's own actor pool (orchestrator.run.driver.eval_pool:
real EvalWorkers with the real verifier, the real EvalPool) decoding real GSM8K prompts. Ray's
resource accounting and placement are the real ones; only the GPU is declared, not present, so
the actors decode on the CPU (CUDA_VISIBLE_DEVICES names the GPU they share)."""
from __future__ import annotations

import socket
import sys
import time
import warnings

import pytest

from orchestrator.grid import eval_cells, eval_job
from orchestrator.plan.sizing import load_profile
from workers.eval_worker import EvalWorker

PACKED = ["resources.eval.num_gpus=0.25", "resources.eval.num_cpus=0.5", "resources.eval_actors=8",
          "eval.temperatures=[0.0]", "eval.benchmarks={gsm8k: 2}"]


class _Placed(EvalWorker):
    """The real actor, which also says where Ray put it."""

    def placement(self) -> tuple:
        import os

        import ray

        ctx = ray.get_runtime_context()
        return ray.get_gpu_ids(), ctx.get_assigned_resources(), ctx.get_node_id(), os.getpid()


@pytest.fixture()
def one_gpu_ray(tmp_path):
    import ray

    with socket.socket() as sock:  # a free port for Ray's minimal dashboard (never 8265: other tests use it)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # _Placed travels by value
    ray.init(address="local", num_cpus=2, num_gpus=1, include_dashboard=False, dashboard_port=port,
             # no CPU kernel tuning per actor: not tested here
             log_to_driver=False, runtime_env={"env_vars": {
                 "TASKSPEC_STAGING": str(tmp_path / "node"), "TOKENIZERS_PARALLELISM": "false",
                 "TASKSPEC_CPU_SPEED": "0"}})
    yield ray
    ray.shutdown()


@pytest.mark.slow
@pytest.mark.full  # breadth: tests/test_rehearsal.py's paper rehearsal packs eval actors too (make test-full)
def test_four_actors_share_one_gpu_through_the_drivers_pool(one_gpu_ray, random_drafter_dirs):
    from drafters.data.sources import load_benchmark
    from orchestrator.plan.concurrency import derive
    from orchestrator.run.cluster import cluster_nodes, eval_pool

    ray = one_gpu_ray
    p = load_profile("smoke", PACKED)
    nodes, _ = cluster_nodes()
    plan = derive(p, nodes, eval_units=4)
    assert plan.eval.units == 4 and "eval 4 actors x 0.25 GPU = 1/1 GPUs" in plan.line(), plan.line()
    t0 = time.time()
    pool = eval_pool(p, plan.eval.units, log=lambda m: None, worker=_Placed)
    where = ray.get([a.placement.remote() for a in pool.actors], timeout=900)  # all four alive at once
    started = time.time() - t0
    assert [w[0] for w in where] == [[0]] * 4  # one GPU, shared by the four
    assert all(w[1] == {"CPU": 0.5, "GPU": 0.25} for w in where) and len({w[3] for w in where}) == 4
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prompts = load_benchmark("gsm8k")[0][:2]
    cells = {c.strategy: c for c in eval_cells(p) if c.strategy in ("autoregressive", "single")}
    names = sorted({d for c in cells.values() for d in c.drafters})  # eagle2-chat, eagle2-math
    ckpt = dict(zip(names, random_drafter_dirs))
    queue = [(c, pr) for c in cells.values() for pr in prompts]  # 4 one-prompt shards, one per actor
    out, ran_on = {}, set()
    while queue or pool.running:
        while queue and pool.free:
            cell, prompt = item = queue.pop(0)
            pool.submit(lambda a, cell=cell, prompt=prompt: ran_on.add(a._actor_id.hex()) or a.run.remote(
                # smoke's tree, 8 new tokens
                eval_job(p, cell), [ckpt[d] for d in cell.drafters], [prompt]), item)
        got = pool.next()
        if got is None:
            continue
        (cell, prompt), result, err = got
        assert err is None, err
        out[(cell.strategy, prompt.id)] = result[0][0]["output_token_ids"]
    pool.close()
    print(f"4 eval actors on 1 GPU (0.25 each) and 2 CPUs (0.5 each): started in {started:.0f} s, "
          f"4 shards in {time.time() - t0:.0f} s in all")
    assert len(out) == 4 and len(ran_on) == 4
    for pr in prompts:  # lossless at T=0 through the packed actors
        assert list(out[("single", pr.id)]) == list(out[("autoregressive", pr.id)])
