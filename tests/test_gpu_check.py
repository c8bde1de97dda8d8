"""The prepared GPU check (experiments/gpu_check.sh) runs as shipped, in its dry mode on the CPU: the
same script and code path as on a GPU (a Llama-3-layout verifier with a learnable next token and the
data built on the spot, a drafter trained on it, every strategy against ``generate``, packing), at a
small shape; by default with torch alone (Ray, DeepSpeed, polars and datasets blocked from import),
in make test-full through Ray Train + DeepSpeed. What it prints on a GPU: docs/gpu-check.md."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
STRATEGIES = ("single", "confidence", "entropy", "merged", "merged-dedup", "merged-budget")


BLOCKED = "ray,deepspeed,polars,datasets,pandas"
# the script's default on a trained drafter; make test-full's runs of the script pack them. The default
# suite's run packs none: its packing workers (experiments/gpu_check_packing.py run_packed, summarize) are
# the GPU rates script's eval part, which tests/test_gpu_rates.py runs at x1 and x2 by default
PACKING = (1, 2, 4)


def _run_dry(tmp_path, *extra, block: bool = False, timeout: int = 1800, env_extra: dict | None = None):
    env = {**os.environ, "PYTHON": sys.executable, "TASKSPEC_DATA_ROOT": str(tmp_path / "no-such-data"),
           # nothing from ../shared or earlier tests
           "TASKSPEC_CACHE": str(tmp_path / "cache"), **(env_extra or {})}
    if block:  # a machine with torch and transformers only: these fail to import, in every process
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "tests/import_block"),
                                                          env.get("PYTHONPATH")]))
        env["TASKSPEC_BLOCK_IMPORTS"] = BLOCKED
    cmd = ["bash", str(ROOT / "experiments/gpu_check.sh"), "--dry", "--workdir", str(tmp_path), *extra]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout)


def _check_dry_output(out, tmp_path, train_row: str, packing: tuple[int, ...] = PACKING) -> None:
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-4000:]
    assert "installing" not in log  # everything it needs is in this environment: nothing reinstalled
    rows = [line for line in out.stdout.splitlines() if line.startswith("row: ")]
    checks = [re.search(r"check=([\w() x-]+?) \|", r).group(1) for r in rows]
    # each printed as it completed
    assert checks == [train_row, "generate", *STRATEGIES, *(f"packing x{k}" for k in packing)], rows
    train = rows[0]
    assert "FAILED" not in train and re.search(r"\b32 steps of batch 2\b", train), train
    losses = [float(x) for x in re.search(r"by epoch ([\d. >]+)\)", train).group(1).split(" > ")]
    assert len(losses) == 2 and losses[1] < losses[0], train  # it learned: the loss fell
    top1 = [float(x) for x in re.search(r"held-out top-1 ([\d. >]+) \(", train).group(1).split(" > ")]
    assert top1[-1] >= 0.5 > top1[0], train  # ... from an untrained drafter to one that predicts the verifier
    for r in rows[2 : 2 + len(STRATEGIES)]:
        assert "equal=2" in r and "MISMATCH=0" in r and "peak mem=" in r, r
        assert float(re.search(r"tau=([\d.]+)", r).group(1)) >= 2.0, r  # drafts are accepted, every strategy
    table = [line for line in out.stdout.splitlines() if line.startswith("| ")]
    assert len(table) == 2 + len(rows)  # then all of them again as one table
    assert "small (2 layers, hidden 256)" in table[2]
    assert "OK: 0 mismatch(es)" in out.stdout
    assert any(p.name.startswith("small-2l") for p in tmp_path.iterdir())  # the verifier was built here
    if not packing:
        assert not (tmp_path / "gpu_rates.json").exists()
        return
    rates = json.loads((tmp_path / "gpu_rates.json").read_text())
    assert rates["kind"] == "gpu-check-packing"
    assert [r["processes"] for r in rates["packing"]] == list(packing)
    assert all(r["tokens_per_s"] > 0 and r["step_s"] > 0 and r["tau"] >= 2.0 for r in rates["packing"]), rates


def test_the_dry_check_learns_and_decodes_with_torch_alone(tmp_path):
    """The default suite's run of the script as shipped, on a machine with nothing but torch and
    transformers (Ray, DeepSpeed, polars, datasets and pandas fail to import in every process): the
    planted verifier is learned in process (loss falls, held-out top-1 >= 0.5), every strategy equals
    ``generate`` and accepts drafts (tau >= 2.0). No packing rows (``--packing none``): the same workers
    run in tests/test_gpu_rates.py, and make test-full's runs of this script pack 1, 2 and 4."""
    out = _run_dry(tmp_path, "--no-train", "--packing", "none", block=True)
    _check_dry_output(out, tmp_path, "train (torch)", packing=())


def test_the_packing_rows_are_written_as_the_file_the_dry_run_reads(tmp_path):
    """The packing rows summarized from the workers' results, written atomically, read back by the dry
    run's reader (orchestrator/plan/packing.py) and fitted."""
    from orchestrator.plan import packing

    pk = _experiment("gpu_check_packing")
    one = {"start": 0.0, "end": 2.0, "steps": 20, "tokens": 60, "new": 60, "peak_gib": None}
    rows = [pk.summarize(1, [one]), pk.summarize(2, [{**one, "end": 3.0}, {**one, "start": 0.5, "end": 3.0}])]
    assert rows[0] == {"processes": 1, "tokens_per_s": 30.0, "step_s": 0.1, "tau": 3.0,
                       "peak_gib_per_process": None}
    assert rows[1]["tokens_per_s"] == pytest.approx(40.0) and rows[1]["step_s"] == pytest.approx(0.1375)
    path = pk.write_rates(tmp_path / "out" / "gpu_rates.json", "cpu", "small-2l", "float32", rows)
    assert [p.name for p in path.parent.iterdir()] == ["gpu_rates.json"]  # no temp file left
    data = packing.read_packing(path)
    assert [r["processes"] for r in data["packing"]] == [1, 2] and data["tree"] == [4, 4, 16]
    assert packing.fit(data, str(path), None, 4)["t_dev_s"] > 0


@pytest.mark.full
def test_the_gpu_check_script_runs_as_shipped_in_its_dry_mode(tmp_path):
    """The script whole: Ray Train + DeepSpeed ZeRO-1 in bf16 trains the drafter."""
    out = _run_dry(tmp_path)
    _check_dry_output(out, tmp_path, "train (ZeRO-1)")
    assert "dtype=bfloat16" in [r for r in out.stdout.splitlines() if r.startswith("row: ")][0]


def test_without_ray_and_no_package_index_the_script_trains_with_torch(tmp_path):
    """Ray Train/DeepSpeed missing and pip unable to reach an index: the script says so in one line and
    goes on with the in-process trainer (here it stops at --help, once the choice is made)."""
    out = _run_dry(tmp_path, "--help", block=True, timeout=300,
                   env_extra={"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": "", "PIP_CONFIG_FILE": os.devnull})
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-3000:]
    assert "training in this process with torch alone (--trainer torch)" in out.stdout, log[-3000:]
    assert "--trainer {ray,torch}" in out.stdout  # the check's own usage: it ran, with the choice made


FLOOR_UNREACHABLE = ("No matching distribution", "Could not find a version", "NewConnectionError",
                     "ConnectionError", "Max retries exceeded", "Temporary failure in name resolution",
                     "Network is unreachable", "ProxyError", "timed out")


@pytest.mark.full
def test_the_decode_path_runs_on_the_lowest_supported_transformers(tmp_path):
    """decoding/compat.py's lower bound, in a scratch environment: transformers at TRANSFORMERS[0] (with
    the dependencies it asks for) ahead of the project's pin on PYTHONPATH, Ray and DeepSpeed absent;
    the dry check learns, decodes every strategy equal to ``generate`` and packs, as on the pin."""
    from common.atomic import atomic_dir
    from common.caches import cache_dir
    from decoding.compat import TRANSFORMERS

    site = cache_dir() / f"site-transformers-{TRANSFORMERS[0]}"
    if not (site / "transformers").is_dir():
        with atomic_dir(site) as tmp:
            r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-compile",
                                "--disable-pip-version-check", "--target", str(tmp),
                                f"transformers=={TRANSFORMERS[0]}"], capture_output=True, text=True,
                                timeout=900)
            if r.returncode != 0:
                err = (r.stderr or r.stdout).strip()
                if any(m in err for m in FLOOR_UNREACHABLE):
                    pytest.skip(f"the package index is unreachable: {err.splitlines()[-1]}")
                raise AssertionError(f"pip install --target failed (rc {r.returncode}):\n{err[-3000:]}")
    out = _run_dry(tmp_path, "--no-train", block=True, timeout=1800, env_extra={"PYTHONPATH": str(site)})
    assert f"transformers {TRANSFORMERS[0]}" in out.stdout, out.stdout[-2000:]
    _check_dry_output(out, tmp_path, "train (torch)")


def test_the_planted_verifier_has_a_learnable_next_token():
    """plant_bigram: about 90% of greedy next tokens follow the planted successor (context decides the
    rest), where the random model's never do."""
    from transformers import LlamaConfig, LlamaForCausalLM

    l3 = _experiment("llama3_shaped")
    cfg = LlamaConfig(vocab_size=2048, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False, pad_token_id=1)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 2048, (2, 64), generator=torch.Generator().manual_seed(3))
    sigma = torch.randperm(2048, generator=torch.Generator().manual_seed(0))  # plant_bigram's, seed 0
    assert l3.bigram_fraction(model, sigma, ids) < 0.05
    beta = l3.plant_bigram(model, seed=0, vocab=2048)
    assert 1e-3 < beta < 1e3 and torch.isfinite(model.lm_head.weight).all()  # the zero pad row stays finite
    assert 0.8 <= l3.bigram_fraction(model, sigma, ids) <= 0.97


def test_the_planted_successor_map_can_be_a_corpus_bigram_table():
    """corpus_successors: each id's most frequent next id (ties: the smaller); plant_bigram with that map:
    the head's rows outside its image are zero, so every greedy token is a planted successor, and
    ~90% of greedy next tokens follow the map (two tokens may share a successor)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    l3 = _experiment("llama3_shaped")
    assert l3.corpus_successors([[5, 6, 5, 7, 5, 6], [6, 5, 9000]], vocab=100) == {5: 6, 6: 5, 7: 5}
    cfg = LlamaConfig(vocab_size=2048, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False, pad_token_id=1)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    g = torch.Generator().manual_seed(1)
    domain = list(range(100, 1900, 31))  # 59 ids, each mapped to one of 40 successors (some shared)
    image = list(range(200, 240))
    successor = {a: image[int(torch.randint(0, 40, (1,), generator=g))] for a in domain}
    l3.plant_bigram(model, seed=0, vocab=2048, successor=successor)
    rows = set(model.lm_head.weight.abs().sum(-1).nonzero().flatten().tolist())
    assert rows == set(successor.values())
    sigma = torch.arange(2048)
    sigma[torch.tensor(domain)] = torch.tensor([successor[a] for a in domain])
    ids = torch.tensor(domain)[torch.randint(0, len(domain), (2, 64),
                                             generator=torch.Generator().manual_seed(3))]
    with torch.no_grad():
        top = model(ids).logits.argmax(-1)
    assert set(top.flatten().tolist()) <= rows
    assert 0.8 <= l3.bigram_fraction(model, sigma, ids) <= 0.97
    with pytest.raises(ValueError, match=r"successor: a map of at least 2 ids in \[0, 2048\)"):
        l3.plant_bigram(model, vocab=2048, successor={5: 5000, 6: 7})


def test_transformers_outside_the_supported_range_is_refused_in_one_line():
    from decoding.compat import TRANSFORMERS, check_transformers, transformers_problem

    check_transformers()  # the installed (pinned) release is inside the range
    assert transformers_problem(TRANSFORMERS[0]) == "" and transformers_problem("5.24.0") == ""
    for old in ("4.57.6", "6.0.0", "6.1.0.dev0"):
        msg = transformers_problem(old)
        assert msg.startswith(f"transformers {old} is not supported") and "\n" not in msg, msg
        assert f">={TRANSFORMERS[0]},<{TRANSFORMERS[1]}" in msg


def _experiment(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / f"experiments/{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _gpu_check_module():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "experiments/gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_sync_counting_names_the_lines_that_synchronize(monkeypatch):
    """On a GPU the check lists, per step, the source lines behind each count: its own (SyncCounter)
    and CUDA's (the warnings of set_sync_debug_mode, attributed where they are raised). Here CUDA's
    warning is raised by hand at a known line; the counting and attribution are the check's own."""
    gc = _gpu_check_module()
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", lambda mode: None)

    def run():
        for _ in range(2):
            torch.ones(2).tolist()  # a host tensor: not a device read
            warnings.warn("called a synchronizing CUDA operation",  # what CUDA's debug mode raises
                          stacklevel=1)  # the check attributes it to the line above
        return 2

    counter, per_step, sites, steps = gc._count_syncs("cuda", run)
    lines = Path(__file__).read_text().splitlines()
    line = next(i for i, s in enumerate(lines, 1) if "what CUDA's debug" in s)
    assert steps == 2 and per_step == 1.0 and sites == {f"tests/test_gpu_check.py:{line}": 2}, sites
    assert counter.counts["sync"] == 0
    assert gc._sites(sites, steps) == f"tests/test_gpu_check.py:{line} 1.00"
    assert gc.training_failure([5.0, 4.0]) == "" and "did not fall" in gc.training_failure([4.8, 4.9])
    assert "not finite" in gc.training_failure([float("nan"), 4.0])
    assert "one epoch only" in gc.training_failure([5.0])  # nothing to compare: not a pass
    assert "did not learn" in gc.training_failure([5.0, 4.0], top1=0.2, min_top1=0.5)
    assert gc.training_failure([5.0, 4.0], top1=0.6, min_top1=0.5) == ""


def test_a_wheels_folder_without_ray_is_refused_before_anything_runs(tmp_path):
    """GPU_CHECK_WHEELS (a machine without a package index) must hold what experiments/gpu_wheels.sh
    makes; a folder without it is named in one error, before anything is installed or built."""
    env = {**os.environ, "PYTHON": sys.executable, "GPU_CHECK_WHEELS": str(tmp_path)}
    cmd = ["bash", str(ROOT / "experiments/gpu_check.sh"), "--dry"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"GPU_CHECK_WHEELS={tmp_path} has no ray.tar.xz" in out.stderr and "gpu_wheels.sh" in out.stderr
    assert "row:" not in out.stdout and not any(tmp_path.iterdir())
