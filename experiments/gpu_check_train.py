"""The GPU check's training row (experiments/gpu_check.py): one HASS drafter fitted to the verifier.

Two trainers, one data path and one verdict:

- ``ray``: Ray Train with DeepSpeed ZeRO-1, in bf16 on CUDA (and on the CPU, DeepSpeed's bf16), the
  grid's own training path;
- ``torch``: the same ``drafters.train.loop.train`` loop in this process with plain AdamW (bf16 autocast
  on CUDA, float32 on the CPU), for a machine with torch and transformers but no Ray or DeepSpeed.

The run fails the check when its loss is not finite, does not fall from the first epoch to the last,
or when the held-out top-1 agreement at depth 1 ends below ``--min-top1``: a check whose training
does not learn fails. The verifier used for the features is freed before the function returns, so
the decoding rows that follow load their own copy with nothing else on the device.
"""
from __future__ import annotations

import gc
import json
import math
import tempfile
import time
import warnings
from pathlib import Path

import torch

TRAINERS = ("ray", "torch")


def training_failure(losses: list[float], top1: float | None = None, min_top1: float = 0.0) -> str:
    """Why a training run failed the check ('' if it passed): a loss that is not finite, one that did
    not fall from the first epoch to the last, or a final held-out top-1 below ``min_top1``."""
    if not losses or not all(math.isfinite(x) for x in losses):
        return f"loss not finite by epoch: {losses}"
    if len(losses) < 2:
        return f"one epoch only: a falling loss needs two (got losses {losses})"
    if not losses[-1] < losses[0]:
        return f"loss did not fall: first epoch {losses[0]:.3f}, last {losses[-1]:.3f}"
    if top1 is not None and not top1 >= min_top1:
        return f"held-out top-1 {top1:.3f} < {min_top1:.2f}: the drafter did not learn the verifier"
    return ""


def free_verifiers(device: str) -> None:
    """Drop every verifier this process loaded (common.verifiers caches them), so one copy is held
    at a time."""
    from common import verifiers

    verifiers._load_verifier.cache_clear()
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def _config(args, name: str, model, tok, precision: str, deepspeed: bool):
    """Features of the generated corpus (extracted here, on the device) and the run's TrainConfig."""
    from common.verifiers import eos_token_ids
    from drafters.train.config import TrainConfig
    from drafters.variants import DataSpec, ensure_features, heldout_data, variant_data

    root = tempfile.mkdtemp(prefix="gpu-check-features-")
    spec = DataSpec(n=args.train_examples, heldout=8, max_length=256)
    t0 = time.perf_counter()
    caches = {"mathinstruct": ensure_features(model, tok, eos_token_ids(model, tok), name, "mathinstruct",
                                              spec, root)}
    took = time.perf_counter() - t0
    per_epoch = max(1, spec.n // args.train_batch)
    epochs = max(2, math.ceil(args.train_steps / per_epoch))  # two at least: "the loss falls" compares epochs
    cfg = TrainConfig(verifier=name, backbone="hass", variant="math",
                      out_dir=tempfile.mkdtemp(prefix="gpu-check-train-"),
                      train_data=variant_data("math", root, caches, spec.n), heldout_data=heldout_data(root,
                              caches),
                      epochs=epochs, lr=args.train_lr, warmup_steps=epochs * per_epoch // 8,
                      batch_size=args.train_batch, deepspeed=deepspeed, zero_stage=1, precision=precision)
    return cfg, f"features {spec.n} ex in {took:.0f}s"


def _run_ray(cfg, gpu: bool) -> tuple[Path, dict]:
    import ray

    from workers.train_worker import run_training

    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        final, result = run_training(cfg, num_workers=1, use_gpu=gpu, cpus_per_worker=1, name="gpu-check")
    finally:
        ray.shutdown()
    return Path(final), dict(result.metrics or {})


def _run_torch(cfg, model, tok) -> tuple[Path, dict]:
    from drafters.train.loop import train

    seen: dict = {}
    final = train(cfg, model, tokenizer=tok, report=lambda metrics, _dir: seen.update(metrics))
    return Path(final), seen


def check_training(args, table, peak) -> list[Path]:
    """One training run on the device; returns [final checkpoint, mid-run checkpoint] (the decoding
    rows' two drafters: the trained one, and the same run halfway, epoch E // 2, as a weaker second)."""
    from common.verifiers import resolve
    from decoding.verifiers import load_verifier

    name = resolve(args.verifier).name
    gpu = args.device.startswith("cuda")
    ray_path = args.trainer == "ray"
    # bf16 as the paper profile; the CPU's plain-torch run in float32 (autocast to bf16 is slow without AMX)
    precision = "bf16" if gpu or ray_path else "fp32"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, tok = load_verifier(args.verifier, device=args.device, matmul_forms=False)
    cfg, features = _config(args, name, model, tok, precision, deepspeed=ray_path)
    t0 = time.perf_counter()
    if ray_path:  # the worker loads its own verifier: free this one first (one copy on the device at a time)
        del model
        free_verifiers(args.device)
        final, m = _run_ray(cfg, gpu)
    else:
        final, m = _run_torch(cfg, model, tok)
        del model
        free_verifiers(args.device)
    history = json.loads((final / "state.json").read_text())["history"]  # epoch 0: before training
    losses = [h.get("train_loss", float("nan")) for h in history if h["epoch"] > 0]
    last_top1 = history[-1].get("top1_depth1")
    failed = training_failure(losses, last_top1, args.min_top1)
    top1 = " > ".join(f"{h.get('top1_depth1', float('nan')):.3f}" for h in history)
    label = "train (ZeRO-1)" if ray_path else "train (torch)"
    how = "Ray Train start-up included" if ray_path else "in this process, no Ray/DeepSpeed"
    table.add(dict(model=args.model_label or name, dtype="bfloat16" if precision == "bf16" else "float32",
                   check=label, **{"tok/s": f"{m.get('train_tokens_per_s', 0):.0f}"},
                   MISMATCH=1 if failed else "", **{"peak mem": peak()},
                   note=f"{features}; {sum(h.get('steps', 0) for h in history)} steps of batch "
                        f"{args.train_batch}, "
                        f"lr {args.train_lr:g}, in {time.perf_counter() - t0:.0f}s ({how}), loss "
                        f"{m.get('train_loss', 0):.3f} (by epoch {' > '.join(f'{x:.3f}' for x in losses)}), "
                        f"held-out top-1 {top1} (untrained first; pass: >= {args.min_top1:g}) "
                        f"(tok/s: loss tokens){'; FAILED: ' + failed if failed else ''}"))
    epochs = max(h["epoch"] for h in history)
    return [final, final.parent / f"epoch-{max(1, epochs // 2)}"]
