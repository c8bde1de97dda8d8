"""The training sweep as Ray Tune trials: tune.grid_search over backbone x variant, each trial
running a Ray Train TorchTrainer. An interrupted sweep is restored with Tune's own restore."""
from __future__ import annotations

import dataclasses
from pathlib import Path


def _trial(params: dict) -> None:
    from ray import tune

    from drafters.trainer import TrainConfig
    from workers.train_worker import run_training

    cfg = TrainConfig(**params["configs"][params["cell"]])
    res = params["resources"]
    final, result = run_training(cfg, num_workers=res["num_workers"], use_gpu=res["use_gpu"],
                                 cpus_per_worker=res["cpus_per_worker"], name=f"train-{params['cell']}")
    tune.report({k: v for k, v in (result.metrics or {}).items() if isinstance(v, (int, float))} | {"final": 1})


def run_sweep(configs: dict, storage_path: str, resources: dict, max_concurrent: int = 1):
    """configs: {"<backbone>-<variant>": TrainConfig} for the cells still to train (the grid is
    backbone x variant minus finished cells). Returns Tune's ResultGrid."""
    from ray import tune

    path = Path(storage_path) / "train-sweep"
    trainable = tune.with_resources(_trial, {"cpu": 0.01})  # the Train workers hold the real resources
    param_space = {
        "cell": tune.grid_search(sorted(configs)),
        "configs": {k: dataclasses.asdict(v) for k, v in configs.items()}, "resources": resources,
    }
    if tune.Tuner.can_restore(str(path)) and _same_cells(path, configs):
        tuner = tune.Tuner.restore(str(path), trainable=trainable, resume_errored=True, param_space=param_space)
    else:
        tuner = tune.Tuner(trainable, param_space=param_space,
                           tune_config=tune.TuneConfig(max_concurrent_trials=max_concurrent),
                           run_config=tune.RunConfig(name="train-sweep", storage_path=str(Path(storage_path).resolve())))
    return tuner.fit()


def _same_cells(path: Path, configs: dict) -> bool:
    """Restore only the sweep that was interrupted (same pending cells), else start a new one."""
    import json

    marker = path.parent / "train-sweep.cells.json"
    return marker.is_file() and json.loads(marker.read_text()) == sorted(configs)


def mark_cells(storage_path: str, configs: dict) -> None:
    import json

    Path(storage_path).mkdir(parents=True, exist_ok=True)
    (Path(storage_path) / "train-sweep.cells.json").write_text(json.dumps(sorted(configs)))
