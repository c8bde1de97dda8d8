"""Ray Train wrapper: a TorchTrainer whose workers run drafters.train.loop.train with DeepSpeed."""
from __future__ import annotations

import os
import time
from pathlib import Path


def _worker_env() -> None:
    try:
        import torch

        if not torch.cuda.is_available():
            os.environ.setdefault("DS_ACCELERATOR", "cpu")  # DeepSpeed's CPU accelerator (gloo)
            torch.set_num_threads(max(1, int(os.environ.get("TASKSPEC_TRAIN_THREADS", os.cpu_count() or 1))))
    except ImportError:
        pass


def train_loop_per_worker(config: dict) -> None:
    """Runs in each Ray Train worker: load the frozen verifier, train, report each epoch."""
    t0 = time.time()
    _worker_env()
    import psutil
    import ray.train

    from decoding.verifiers import load_verifier
    from drafters.features import reading_through
    from drafters.train.loop import train
    from workers import artifacts

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    local_rank = node_local_rank(rank, world)
    t1 = time.time()
    cfg = config["train"]  # the TrainConfig itself (frozen, torch-free: it crosses Ray as it is)
    shards = artifacts.shard_cache(cfg, rank)  # this node's bounded cache of the shards at URIs
    # with out_uri: cache manifests, draft vocabulary, last checkpoint
    cfg = artifacts.prepare(cfg, local_rank)
    t2 = time.time()
    model, tok = load_verifier(cfg.verifier, dtype=cfg.verifier_dtype, device="cuda" if _cuda() else "cpu",
                               matmul_forms=False)  # training never takes the inference forms
    # where a trial's start-up goes (a short trial is mostly this; DeepSpeed: the trainer's line)
    if rank == 0:
        age = t0 - psutil.Process().create_time()
        print(f"[train {cfg.backbone}-{cfg.variant}] worker start-up: process {age:.1f}s "
              f"before the loop, imports {t1 - t0:.1f}s, inputs {t2 - t1:.1f}s, "
              f"verifier {time.time() - t2:.1f}s", flush=True)

    # with a URI every checkpoint is uploaded there in the background while training goes on, one at
    # a time (the trainer settles the last upload before it writes the next checkpoint and at the end)
    uploads = artifacts.Uploads.for_rank(cfg, rank, local_rank, world)

    def report(metrics: dict, ckpt_dir: Path) -> None:
        # Ray Train records a pointer to the epoch's checkpoint at the URI (no second copy of the
        # weights; the URI, where it is complete once its state.json is there, is what a restart
        # resumes from: artifacts.prepare); without a URI Ray Train keeps a copy of the directory
        uploads.start(ckpt_dir)
        ckpt = None
        if rank == 0:
            ckpt_ref = artifacts.pointer(cfg, ckpt_dir) if cfg.out_uri else ckpt_dir
            ckpt = ray.train.Checkpoint.from_directory(str(ckpt_ref))
        ray.train.report({k: v for k, v in metrics.items() if isinstance(v, (int, float))}, checkpoint=ckpt)

    with reading_through(shards), uploads:  # a rank downloads only the shards it reads
        final = train(cfg, model, rank=rank, world=world, report=report, tokenizer=tok, saved=uploads.start,
                      settle=uploads.settle)
    if shards.downloaded:
        print(f"[train {cfg.backbone}-{cfg.variant}] rank {rank}: downloaded {len(shards.downloaded)} "
              "feature "
              f"shard(s), {shards.bytes_read / 2**20:.1f} MiB, waited {shards.wait_s:.1f}s for shards "
              "(read-ahead "
              f"{shards.read_ahead} on {shards.streams} streams); the node holds "
              f"{shards.nbytes() / 2**20:.1f} of "
              f"{shards.budget / 2**20:.0f} MiB", flush=True)
    artifacts.publish_final(cfg, final, rank)


def node_local_rank(rank: int, world: int) -> int:
    """This rank's index among the ranks on its Ray node (0: the one that fetches and uploads the
    node's files). Ray Train's local rank counts ranks per IP address; two Ray nodes can share one
    (several raylets on a host, as in ray.cluster_utils.Cluster), each with its own node-local staging
    dir, and then a local rank 1 would skip the fetch that its own node needs."""
    import ray
    import torch.distributed as dist

    node = ray.get_runtime_context().get_node_id()
    if world == 1 or not (dist.is_available() and dist.is_initialized()):
        return 0
    nodes = [None] * world
    dist.all_gather_object(nodes, node)
    return nodes[:rank].count(node)


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def trainer_for(cfg, num_workers: int = 1, use_gpu: bool = False, cpus_per_worker: int = 1,
                storage_path: str | None = None, name: str | None = None, max_failures: int = 1):
    """A TorchTrainer for one drafter run (backend gloo on CPU, nccl on GPU). ``max_failures``:
    worker-group restarts (the profile's ``retries``), each resuming from the latest checkpoint;
    Ray Train keeps the records of the last ``cfg.keep_checkpoints`` epochs."""
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    if storage_path is None:  # next to the checkpoints: the run's URI if it has one, else the local dir
        parent = cfg.out_uri.rsplit("/", 1)[0] if cfg.out_uri else str(Path(cfg.out_dir).resolve().parent)
        storage_path = f"{parent}/_ray_train"
    # the batch each optimizer step sees (train.global_batch in a profile; orchestrator.profile.batch_plan)
    print(f"[train {cfg.backbone}-{cfg.variant}] global batch "
          f"{num_workers * cfg.batch_size * cfg.grad_accum} = "
          f"{num_workers} worker(s) x per-worker batch {cfg.batch_size} x gradient accumulation "
          f"{cfg.grad_accum}",
          flush=True)
    return TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"train": cfg},
        torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo"),
        scaling_config=ScalingConfig(num_workers=num_workers, use_gpu=use_gpu,
                                     resources_per_worker={"CPU": cpus_per_worker}),
        run_config=RunConfig(name=name or f"train-{cfg.backbone}-{cfg.variant}", storage_path=storage_path,
                             failure_config=FailureConfig(max_failures=max_failures),
                             checkpoint_config=CheckpointConfig(num_to_keep=cfg.keep_checkpoints)),
    )


def run_training(cfg, **kwargs):
    """Fit one drafter with Ray Train; the final checkpoint lands in cfg.out_dir/final (and, with
    cfg.out_uri, at out_uri/final: then out_dir is only the training node's copy)."""
    result = trainer_for(cfg, **kwargs).fit()
    if result.error:
        raise result.error
    return Path(cfg.out_dir) / "final", result
