"""The training sweep as Ray Tune trials: tune.grid_search over backbone x variant, each trial
running a Ray Train TorchTrainer. An interrupted sweep is restored with Tune's own restore."""
from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

# the hyperparameters a tracker shows for each training cell (Tune logs the trial config as parameters)
SHOWN = ("backbone", "variant", "epochs", "lr", "batch_size", "grad_accum", "warmup_steps", "lr_schedule",
         "grad_clip", "grad_clip_mode", "hass_steps", "topk_from", "bucket", "deepspeed", "zero_stage",
         "precision",
         "init_seed")


RAY_KEYS = {"training_iteration", "timestamp", "time_this_iter_s", "time_total_s", "time_since_restore",
            "iterations_since_restore", "pid", "done"}  # filled in by Ray itself


def _trial(params: dict, configs: dict, resources: dict) -> None:
    from ray import tune

    from workers.train_worker import run_training

    cfg = configs[params["cell"]]  # a TrainConfig, as the driver built it
    final, result = run_training(cfg, num_workers=resources["num_workers"], use_gpu=resources["use_gpu"],
                                 cpus_per_worker=resources["cpus_per_worker"], name=f"train-{params['cell']}",
                                 max_failures=resources.get("max_failures", 1))
    # one Tune result per epoch (Ray Train reported them in its own run), so the tracker callbacks see the
    # curve
    numeric = lambda m: {k: v for k, v in m.items() if isinstance(v, (int, float)) and k not in RAY_KEYS}  # noqa: E731
    history = result.metrics_dataframe
    epochs = history.to_dict("records") if history is not None and len(history) else []
    for row in epochs[:-1]:
        tune.report(numeric(row))
    tune.report(numeric(result.metrics or (epochs[-1] if epochs else {})) | {"final": 1})


# A trial's own actor only starts its Ray Train run, whose workers hold the real resources. It holds
# no CPU: Tune refuses an empty request, so it asks for 1 MiB of memory. With a CPU sliver (0.01)
# per trial, concurrent trials took a sliver on nodes sized to whole workers, and a node that
# lost one fits one worker fewer: two trials could each wait for a worker slot the other's sliver
# held.
TRIAL_RESOURCES = {"cpu": 0, "memory": 2**20}


def sweep_id(configs: dict, resources: dict) -> str:
    """Identity of a sweep: its cells, their configs and resources (restore only the same sweep)."""
    import hashlib
    import json

    blob = json.dumps([{k: dataclasses.asdict(v) for k, v in sorted(configs.items())}, resources],
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def run_sweep(configs: dict, storage_path: str, resources: dict, max_concurrent: int = 1, callbacks=()):
    """configs: {"<backbone>-<variant>": TrainConfig} for the cells still to train (the grid is
    backbone x variant minus finished cells); callbacks: extra Tune callbacks (experiment
    tracking). Returns Tune's ResultGrid."""
    from ray import tune

    from common.storage import is_uri, join

    name = f"train-sweep-{sweep_id(configs, resources)}"
    if not is_uri(storage_path):
        storage_path = str(Path(storage_path).resolve())
    path = join(storage_path, name)
    trainable = tune.with_resources(tune.with_parameters(_trial, configs=dict(configs), resources=resources),
                                    TRIAL_RESOURCES)
    shown = {k: {f: getattr(v, f) for f in SHOWN} for k, v in configs.items()}
    param_space = {"cell": tune.grid_search(list(configs)),  # the caller's order: Tune starts trials in it
                   "train": tune.sample_from(lambda config: shown[config["cell"]])}
    if tune.Tuner.can_restore(path):  # the same sweep was interrupted: Tune's own restore
        tuner = tune.Tuner.restore(path, trainable=trainable, resume_errored=True, param_space=param_space)
    else:
        tuner = tune.Tuner(trainable, param_space=param_space,
                           tune_config=tune.TuneConfig(max_concurrent_trials=max_concurrent),
                           run_config=sweep_run_config(name, storage_path, resources,
                                                       [_TrialLines(len(configs)), *callbacks]))
    return tuner.fit()


def sweep_run_config(name: str, storage_path: str, resources: dict, callbacks=()):
    """The sweep's Tune RunConfig. Its FailureConfig retries a trial whose own actor died (its node
    lost: Ray Train's FailureConfig restarts only the worker group) up to ``resources["max_failures"]``
    times (the profile's ``retries``); a retried trial starts Ray Train again, which resumes from the
    drafter's latest checkpoint at the output (epoch or train.checkpoint_every steps)."""
    from ray import tune

    verbose = 2 if os.environ.get("TASKSPEC_VERBOSE") == "1" else 0  # quiet: one line per finished trial
    return tune.RunConfig(name=name, storage_path=storage_path, verbose=verbose, callbacks=list(callbacks),
                          failure_config=tune.FailureConfig(max_failures=resources.get("max_failures", 1)))


def _trial_lines_class():
    from ray.tune import Callback

    class TrialLines(Callback):
        """One progress line per finished trial (Tune's status table is off unless --verbose): done/total
        of the sweep (Tune's own trial list only holds the trials started so far) and an ETA."""

        def __init__(self, total: int):
            self.t0 = time.time()
            self.done = 0
            self.total = total

        def on_trial_complete(self, iteration, trials, trial, **info):
            self.done += 1
            m = trial.last_result or {}
            agree = m.get("top1_depth1")
            line = trial_line(trial.config.get("cell"), self.done, self.total, time.time() - self.t0, agree)
            print(f"[{time.strftime('%H:%M:%S')}] [train] {line}", flush=True)

        def on_trial_error(self, iteration, trials, trial, **info):
            print(f"[{time.strftime('%H:%M:%S')}] [train] trial {trial.config.get('cell')} FAILED",
                  flush=True)

    return TrialLines


def _TrialLines(total: int):  # noqa: N802 - built lazily: ray.tune is imported inside the sweep only
    return _trial_lines_class()(total)


def trial_line(cell, done: int, total: int, elapsed: float, agree=None) -> str:
    """'trial eagle2-math finished (3/8, elapsed 269s, ETA ~449s, held-out top-1 0.276)'. The ETA
    assumes the remaining trials take the mean time of the finished ones (in this process)."""
    left = max(0, total - done)
    eta = f", ETA ~{elapsed / done * left:.0f}s" if done and left else ""
    top = f", held-out top-1 {agree:.3f}" if isinstance(agree, float) else ""
    return f"trial {cell} finished ({done}/{max(total, done)}, elapsed {elapsed:.0f}s{eta}{top})"

