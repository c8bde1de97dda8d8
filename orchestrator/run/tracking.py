"""Experiment tracking: the run in MLflow (a local file store by default, offline) or W&B (offline).

- Training: Ray's own Tune callbacks (``ray.air.integrations.mlflow.MLflowLoggerCallback`` /
  ``ray.air.integrations.wandb.WandbLoggerCallback``): one tracker run per training cell, its
  hyperparameters as parameters and one step per epoch (loss, held-out agreement by depth).
- The whole run: one summary run with the profile (flattened) as parameters, one metric per eval
  cell (tau, and speedup against ``generate``), the stage wall times, and the report as artifacts.

With an output URI (``remote``) the default local store (``<staging>/mlruns`` or ``wandb``) is
fetched from ``<URI>/mlruns`` (``wandb``) at start and published there after training and after
the summary, so the records outlive the driver's machine.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from common import storage

BACKENDS = ("none", "mlflow", "wandb")


def flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def metric_name(*parts) -> str:
    """A metric name every tracker accepts: letters, digits, _ - . / only."""
    return re.sub(r"[^A-Za-z0-9_\-./]+", "_", ".".join(str(p) for p in parts)).strip("_")


class Tracker:
    def __init__(self, backend: str, out: Path, profile_name: str, uri: str | None = None,
                 experiment: str | None = None, remote: str | None = None):
        if backend not in BACKENDS:
            raise ValueError(f"tracking backend must be one of {list(BACKENDS)}, got {backend!r}")
        self.backend, self.out = backend, Path(out)
        self.experiment = experiment or f"taskspec-{profile_name}"
        self.profile_name = profile_name
        if backend == "mlflow":
            try:
                import mlflow  # noqa: F401
            except ImportError as e:
                raise ValueError("tracking: mlflow needs the mlflow client "
                                 "(pip install mlflow-skinny)") from e
            self.uri = uri or (self.out / "mlruns").resolve().as_uri()
            if self.uri.startswith("file:"):  # MLflow 3 keeps the file store behind an opt-in
                os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        elif backend == "wandb":
            try:
                import wandb  # noqa: F401
            except ImportError as e:
                raise ValueError("tracking: wandb needs the wandb package (pip install wandb)") from e
            self.uri = uri or str((self.out / "wandb").resolve())
            os.environ.setdefault("WANDB_MODE", "offline")
            Path(self.uri).mkdir(parents=True, exist_ok=True)
        else:
            self.uri = None
        # the default store is a local directory: with an output URI it is mirrored there
        self.local = self.out / backend if backend == "wandb" else self.out / "mlruns"
        default = backend != "none" and uri is None
        self.remote = storage.join(remote, self.local.name) if remote and default else None
        if self.remote and storage.exists(self.remote):  # records of earlier runs of this output
            storage.sync(self.remote, str(self.local))

    def publish(self) -> None:
        """Copy the local store to the output URI (incremental; no-op without one)."""
        if self.remote and self.local.is_dir():
            storage.sync(str(self.local), self.remote)

    def tune_callbacks(self) -> list:
        """Ray Tune logger callbacks for the training sweep."""
        if self.backend == "mlflow":
            from ray.air.integrations.mlflow import MLflowLoggerCallback

            return [MLflowLoggerCallback(tracking_uri=self.uri, experiment_name=self.experiment,
                                         tags={"taskspec.stage": "train"}, save_artifact=False)]
        if self.backend == "wandb":
            from ray.air.integrations.wandb import WandbLoggerCallback

            return [WandbLoggerCallback(project=self.experiment, group="train", mode="offline", dir=self.uri)]
        return []

    def log_run(self, profile: dict, cells: list[dict], stage_seconds: dict, report_dir: Path) -> None:
        """The summary run. ``cells``: {"name": ..., "tau": ..., "speedup": ...} per eval cell."""
        if self.backend == "none":
            return
        params = {k: str(v)[:500] for k, v in flatten(profile).items()}
        metrics = {metric_name("stage_seconds", k): float(v) for k, v in stage_seconds.items()}
        for c in cells:
            for m in ("tau", "speedup"):
                if c.get(m) is not None:
                    metrics[metric_name(m, c["name"])] = float(c[m])
        if self.backend == "mlflow":
            import mlflow

            mlflow.set_tracking_uri(self.uri)
            mlflow.set_experiment(self.experiment)
            with mlflow.start_run(run_name=f"{self.profile_name}-summary",
                                  tags={"taskspec.stage": "summary"}):
                mlflow.log_params(params)
                mlflow.log_metrics(metrics)
                if Path(report_dir).is_dir():
                    mlflow.log_artifacts(str(report_dir), artifact_path="report")
        else:
            import wandb

            run = wandb.init(project=self.experiment, name=f"{self.profile_name}-summary", dir=self.uri,
                             mode="offline", config=params, job_type="summary")
            run.log(metrics)
            if Path(report_dir).is_dir():
                art = wandb.Artifact(f"{self.profile_name}-report", type="report")
                art.add_dir(str(report_dir))
                run.log_artifact(art)
            run.finish()
