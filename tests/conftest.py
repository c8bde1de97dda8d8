from __future__ import annotations

import os
import warnings

import pytest
import torch

VERIFIER = "smollm2-135m-instruct"


@pytest.fixture(scope="session")
def verifier():
    from decoding.verifiers import load_verifier

    torch.set_num_threads(max(1, torch.get_num_threads()))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_verifier(VERIFIER)


@pytest.fixture(scope="session")
def eos(verifier):
    from common.verifiers import eos_token_ids

    return eos_token_ids(*verifier)


@pytest.fixture(scope="session")
def random_drafter_dirs(verifier, tmp_path_factory):
    """Two randomly initialised drafter checkpoints (seeds 0 and 1) for the embedded verifier."""
    from drafters.checkpoint import init_drafter, save_checkpoint
    from drafters.config import DrafterConfig

    root = tmp_path_factory.mktemp("drafters")
    out = []
    for seed, backbone in ((0, "eagle2"), (1, "hass")):
        cfg = DrafterConfig.for_verifier(verifier[0], VERIFIER, backbone, seed=seed)
        out.append(str(save_checkpoint(init_drafter(cfg), root / f"random-{seed}")))
    return out


@pytest.fixture(scope="session")
def random_eagle3_dirs(verifier, tmp_path_factory):
    """Two randomly initialised EAGLE-3 drafter checkpoints (seeds 0 and 1) for the embedded verifier,
    over the whole vocabulary as ``random_drafter_dirs``' (the trained one in tests/test_eagle3_decoding.py
    has a reduced draft vocabulary)."""
    from drafters.eagle3 import Eagle3Config, init_eagle3, save_eagle3

    root = tmp_path_factory.mktemp("eagle3-drafters")
    return [str(save_eagle3(init_eagle3(Eagle3Config.for_verifier(verifier[0], VERIFIER, seed=seed)),
                            root / f"random-e3-{seed}")) for seed in (0, 1)]


@pytest.fixture(scope="session")
def random_proposers(verifier, random_drafter_dirs):
    from decoding.runner import load_proposers

    return load_proposers(verifier[0], random_drafter_dirs, VERIFIER)


@pytest.fixture(scope="session")
def bench_prompts():
    """Two real prompts from each of the four benchmarks (MT-Bench ones have two turns)."""
    from drafters.data.sources import load_benchmark

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {b: load_benchmark(b)[0][:2] for b in ("gsm8k", "math500", "svamp", "mt_bench")}


# the feature caches every in-process training test shares (tests/test_training.py, test_faults.py):
# built once per run; DataSpec's fields
TRAIN_SPEC = {"n": 16, "heldout": 4, "max_length": 96, "seed": 42}


@pytest.fixture(scope="session")
def train_features(verifier, eos, tmp_path_factory):
    """(root, {corpus: cache}) for both training corpora at TRAIN_SPEC."""
    from drafters.variants import DataSpec, ensure_features

    model, tok = verifier
    root = str(tmp_path_factory.mktemp("features"))
    spec = DataSpec(**TRAIN_SPEC)
    return root, {c: ensure_features(model, tok, eos, VERIFIER, c, spec, root) for c in ("mathinstruct",
            "sharegpt")}


FULL_ENV = "TASKSPEC_FULL_TESTS"


# Modules that start Ray (a local instance, a head, a cluster or a grid driver): under pytest-xdist
# (`make test` runs `-n <workers>`) they share one worker, one after the other, so two Ray instances
# never meet (the README job's head must find 6379 and 8265 free) and their long waits overlap the
# in-process tests on the other workers. Every other module is a unit of its own (its module fixtures
# built once).
RAY_GROUP = ("test_grid.py", "test_multinode.py", "test_faults.py", "test_lost_work.py",
             "test_eagle3_training.py", "test_lease.py", "test_bad_input.py", "test_profiles.py",
             "test_grid_eagle3.py", "test_gpu_check.py", "test_rehearsal.py", "test_eval_packing.py",
             "test_resume_old_run.py", "test_graph_run.py")


def _group(path: str) -> str:
    name = path.split("::", 1)[0].rsplit("/", 1)[-1]
    return "ray" if name in RAY_GROUP else name


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Units of work for pytest-xdist: ``RAY_GROUP`` as one, every other module as one. (Its own
    ``--dist loadgroup`` marks do not group anything under pytest 9, whose node ids it cannot suffix.)"""
    from xdist.scheduler import LoadScopeScheduling

    class ModulesAndRay(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _group(nodeid)

    return ModulesAndRay(config, log)


def pytest_collection_modifyitems(config, items):
    """``RAY_GROUP`` first, the longest unit, so a worker starts it at once (the order within a module
    is kept). Tests marked ``full`` are breadth beyond what `make test` needs (a second granularity, a
    second temperature for a strategy both temperatures already cover): `make test-full` (or
    TASKSPEC_FULL_TESTS=1) runs them; otherwise they are skipped, with the reason, so `-rs` shows them."""
    items.sort(key=lambda item: _group(item.nodeid) != "ray")  # stable: file order otherwise
    if os.environ.get(FULL_ENV) == "1":
        return
    skip = pytest.mark.skip(reason=f"breadth (make test-full or {FULL_ENV}=1 runs it)")
    for item in items:
        if "full" in item.keywords:
            item.add_marker(skip)


IN_PROCESS_NICENESS = 19  # the in-process tests under pytest-xdist: below everything Ray runs


def pytest_configure(config):
    """Under pytest-xdist each worker gets its share of the cores for torch's threads (two workers
    each running two threads on two cores lose more to contention than they gain); the CLIs the
    tests run get the same thread count."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        threads = max(1, len(os.sched_getaffinity(0)) // workers)
        torch.set_num_threads(threads)
        os.environ["TASKSPEC_THREADS"] = str(threads)  # for the CLIs the tests run (runner.default_threads)


def pytest_runtest_setup(item):
    """Under pytest-xdist, a worker about to run an in-process test drops to niceness 19 (for good:
    ``RAY_GROUP`` is scheduled first, so a worker runs it before any other unit). The worker that
    runs ``RAY_GROUP`` stays at its niceness, and the Ray it starts adds 15 for its workers (Ray's
    worker_niceness is an increment: a driver at 15 got workers at 19, measured). So Ray's work
    (niceness 15) takes the cores first. Every worker at 15 (before) put Ray's workers at 19 behind
    the in-process tests: the README job took 272 s in the suite and 145 s alone. The Ray group's
    tests went from 695 to 579 test-seconds; the wall did not change, the suite being CPU-bound
    (docs/testing.md, 2026-12-04, Zen 5). (The reverse, in-process tests at 0, starved Ray: one
    smoke grid's training took 818 s beside them, 133 s alone.)"""
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1 and _group(item.nodeid) != "ray":
        os.nice(max(0, IN_PROCESS_NICENESS - os.nice(0)))


_STARTED = {}


def pytest_sessionstart(session):
    import time

    _STARTED["t"] = time.time()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """The suite's budget, checked where it is spent: wall time and the machine class (docs/testing.md
    records the figure per class), printed at the end of every run."""
    import subprocess
    import time
    from pathlib import Path

    from decoding.cpu.machine import machine_class

    if "t" not in _STARTED:
        return
    wall = time.time() - _STARTED["t"]
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                timeout=10,
                                cwd=Path(__file__).resolve().parents[1]).stdout.strip() or "?"
    except (OSError, subprocess.SubprocessError):
        commit = "?"
    suite = "make test-full" if os.environ.get(FULL_ENV) == "1" else "make test"
    workers = getattr(config.option, "numprocesses", None) or 0
    how = f"{workers} pytest-xdist workers" if workers else "one process"
    terminalreporter.write_line(f"suite time: {wall:.0f} s ({wall / 60:.1f} min) wall, {suite} at {commit}, "
                                f"{how}, on {machine_class()}")
