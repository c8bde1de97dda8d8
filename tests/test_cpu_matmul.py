"""The CPU matmul forms the verifier's linear layers choose from (decoding/cpu/matmul.py), and the
thin-GEMM kernel compiled on first use (decoding/cpu/kernel.py)."""
import os
import re
import shutil
import subprocess

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from decoding.cpu import kernel as cpu_kernel
from decoding.cpu import matmul as cpu_matmul
from decoding.cpu import onednn


@pytest.fixture(scope="module")
def built_kernel(tmp_path_factory):
    """The kernel compiled once for this module (None where it cannot build: each test then meets
    the build as before). Compiling it for every test cost 1.2 s each, 3-4x that in the parallel suite."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TASKSPEC_CACHE", str(tmp_path_factory.mktemp("kernel")))
        path = cpu_kernel.library_path()
        try:
            cpu_kernel.build(path)
        except (OSError, subprocess.SubprocessError):
            return None
    return path


@pytest.fixture
def fresh_kernel(tmp_path, monkeypatch, built_kernel):
    """A kernel state of its own, cached under tmp_path with a copy of the module's build (a test
    that breaks the build changes the compiler or its flags, so the copy's name no longer matches)."""
    monkeypatch.setenv("TASKSPEC_CACHE", str(tmp_path))
    if built_kernel is not None:
        (tmp_path / "kernels").mkdir()
        shutil.copy2(built_kernel, tmp_path / "kernels" / built_kernel.name)
    monkeypatch.setattr(cpu_matmul, "CACHE", tmp_path / "cpu_matmul.json")
    monkeypatch.setattr(cpu_matmul, "_SESSION", {})
    monkeypatch.setattr(cpu_kernel, "_STATE", {})
    monkeypatch.setattr(cpu_matmul, "COLD_BYTES", 2**20)  # tiny test weights: a few copies, not 16k
    return tmp_path


@pytest.mark.parametrize("N,K", [(1539, 576), (7, 37), (64, 16)])
def test_kernel_matches_float64_and_a_row_never_depends_on_its_batch(N, K):
    assert cpu_kernel.available(), cpu_kernel.status()
    g = torch.Generator().manual_seed(0)
    W = torch.randn(N, K, generator=g)
    x = torch.randn(cpu_kernel.MAX_ROWS, K, generator=g)
    alone = torch.cat([cpu_kernel.matmul(x[m : m + 1], W) for m in range(x.shape[0])])
    for M in (1, 2, 3, 5, 6, 7, 8, 9, 16, 17, 32, 95, 256):
        y = cpu_kernel.matmul(x[:M], W)
        ref = (x[:M].double() @ W.double().T).float()
        assert y.shape == (M, N)
        torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-4)
        # same dot product in the same order for any M: bit-identical to the row computed alone
        assert torch.equal(y, alone[:M]), M
        # the prefetch hint (the "kernel-l2" form) changes where the weights are cached, not a bit
        assert torch.equal(cpu_kernel.matmul(x[:M], W, l2=True), y), M


@pytest.mark.parametrize("N,K", [(1539, 576), (7, 37), (100, 1536)])
def test_the_bf16_kernel_rounds_a_float32_sum_once_and_a_row_never_depends_on_its_batch(N, K):
    """bf16 weights and activations, float32 multiply-adds, one rounding to bf16 per output: what
    torch's bf16 linear computes, up to summation order (which moves a result by at most one bf16
    step, and only where the float32 sum lies next to a rounding boundary)."""
    assert cpu_kernel.available(), cpu_kernel.status()
    g = torch.Generator().manual_seed(0)
    W = torch.randn(N, K, generator=g).bfloat16()
    x = torch.randn(cpu_kernel.MAX_ROWS, K, generator=g).bfloat16()
    alone = torch.cat([cpu_kernel.matmul(x[m : m + 1], W) for m in range(x.shape[0])])
    for M in (1, 2, 6, 12, 13, 32):
        y = cpu_kernel.matmul(x[:M], W)
        assert y.dtype == torch.bfloat16 and y.shape == (M, N)
        exact = x[:M].double() @ W.double().T  # bf16 inputs are exact in float64
        rounded = exact.float().bfloat16()
        off = y != rounded
        assert off.float().mean() < 2e-3, M  # a handful of boundary cases, not a systematic error
        step = (rounded.float().abs() * 2**-7).clamp_min(1e-30)  # one bf16 step (8-bit significand)
        assert ((y.float() - rounded.float()).abs() <= step * 1.01)[off].all(), M
        torch.testing.assert_close(y, F.linear(x[:M], W), rtol=1.6e-2, atol=1e-2)
        assert torch.equal(y, alone[:M]), M
        assert torch.equal(cpu_kernel.matmul(x[:M], W, l2=True), y), M


def test_the_bf16_kernel_keeps_nan_and_inf_and_rounds_to_nearest_even():
    W = torch.tensor([[1.0, 2.0], [float("nan"), 1.0], [float("inf"), 0.0], [1.0, 2**-8], [1.0, 3 * 2**-8]])
    y = cpu_kernel.matmul(torch.tensor([[1.0, 1.0]]).bfloat16(), W.bfloat16())[0].float()
    assert y[0] == 3 and y[1].isnan() and y[2] == float("inf")
    assert y[3] == 1.0 and y[4] == 1 + 2**-6  # ties to even: 1 + 2^-8 -> 1, 1 + 3 * 2^-8 -> 1 + 2^-6


def test_the_packed_copy_follows_the_weight():
    assert cpu_kernel.available(), cpu_kernel.status()
    W, x = torch.randn(40, 24), torch.randn(3, 24)
    torch.testing.assert_close(cpu_kernel.matmul(x, W), x @ W.T, rtol=1e-5, atol=1e-5)
    first = cpu_kernel.packed(W)
    assert cpu_kernel.packed(W) is first  # packed once, then reused
    W.mul_(-2)  # an in-place write (a training step, a merge) makes the copy stale
    torch.testing.assert_close(cpu_kernel.matmul(x, W), x @ W.T, rtol=1e-5, atol=1e-5)
    lin = nn.Linear(24, 40, bias=False)
    cpu_kernel.matmul(x, lin.weight)
    lin.weight.data = torch.randn(40, 24)  # new storage under the same parameter
    torch.testing.assert_close(cpu_kernel.matmul(x, lin.weight), x @ lin.weight.T, rtol=1e-5, atol=1e-5)


def test_kernel_refuses_what_it_does_not_compute():
    W = torch.randn(16, 32)
    with pytest.raises(ValueError, match="both float32 or both bfloat16"):
        cpu_kernel.matmul(torch.randn(2, 32, dtype=torch.bfloat16), W)
    with pytest.raises(ValueError, match="float16"):
        cpu_kernel.matmul(torch.randn(2, 32).half(), W.half())
    with pytest.raises(ValueError, match=f"M<= {cpu_kernel.MAX_ROWS}"):
        cpu_kernel.matmul(torch.randn(cpu_kernel.MAX_ROWS + 1, 32), W)
    with pytest.raises(ValueError, match=r"\(16, 32\)"):
        cpu_kernel.matmul(torch.randn(2, 31), W)


def test_install_gives_every_linear_a_timed_form_and_changes_no_result(fresh_kernel, capsys):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(96, 200), nn.Linear(200, 96, bias=False))
    tables = cpu_matmul.install(model)
    assert set(tables) == {"(200, 96)", "(96, 200)"}
    for table in tables.values():
        assert set(table) == set(cpu_matmul.BUCKETS) and set(table.values()) <= set(cpu_matmul.FORMS)
    for rows in (1, 2, 3, 6, 8, 13, 32, 40):
        x = torch.randn(1, rows, 96)
        ref = F.linear(F.linear(x, model[0].weight, model[0].bias), model[1].weight)
        torch.testing.assert_close(model(x), ref, rtol=1e-5, atol=1e-5)
        with cpu_matmul.disabled():
            assert torch.equal(model(x), ref)
    # every form the tables may pick computes the same product
    x = torch.randn(6, 96)
    for form in cpu_matmul.FORMS:
        torch.testing.assert_close(cpu_matmul.form_fn(form)(x, model[0].weight), x @ model[0].weight.T,
                                   rtol=1e-5, atol=1e-5)
    # tuned once per machine, then read back; unless the timings were not trustworthy (a loaded machine)
    assert cpu_matmul.CACHE.exists() or "not cached" in capsys.readouterr().err


def test_without_a_compiler_the_kernel_says_why_and_install_keeps_the_blas_forms(fresh_kernel, monkeypatch):
    monkeypatch.setenv("CC", str(fresh_kernel / "no-such-cc"))
    assert not cpu_kernel.available()
    assert "unavailable: cannot build or load smallm.c" in cpu_kernel.status()
    tables = cpu_matmul.install(nn.Linear(64, 48))
    assert not set(cpu_matmul.KERNEL_FORMS) & set(tables["(48, 64)"].values())
    assert not set(cpu_matmul.KERNEL_FORMS) & set(cpu_matmul.forms_for(torch.zeros(48, 64)))


def test_a_kernel_that_does_not_compile_names_the_compiler_error(fresh_kernel, monkeypatch):
    bad = fresh_kernel / "smallm.c"
    bad.write_text("int smallm_f32( {\n")
    monkeypatch.setattr(cpu_kernel, "SOURCE", bad)
    before = set((fresh_kernel / "kernels").glob("*"))  # (the good build's copy)
    assert not cpu_kernel.available()
    assert "compiling smallm.c failed" in cpu_kernel.status() and "error" in cpu_kernel.status()
    assert set((fresh_kernel / "kernels").glob("*")) == before, "a failed build leaves nothing behind"


def test_kernel_off_switch(fresh_kernel, monkeypatch):
    monkeypatch.setenv("TASKSPEC_CPU_KERNEL", "0")
    assert not cpu_kernel.available() and "TASKSPEC_CPU_KERNEL=0" in cpu_kernel.status()


def test_a_reduced_vocabulary_draft_head_gets_the_tuned_matmul_and_the_same_logits(fresh_kernel):
    from decoding.drafting import shared_head

    torch.manual_seed(0)
    lm_head = nn.Linear(64, 500, bias=False)
    ids = torch.arange(0, 500, 3)
    head = shared_head(lm_head, ids)
    assert head.matmul is not None and shared_head(lm_head, ids) is head  # one per (LM head, vocabulary)
    for rows in (1, 2, 4, 6, 9, 40):
        h = torch.randn(rows, 64)
        torch.testing.assert_close(head(h), h @ lm_head.weight[ids].T, rtol=1e-5, atol=1e-5)
    h = torch.randn(3, 64, requires_grad=True)  # training keeps the plain, differentiable product
    assert head(h).requires_grad


def test_noisy_timings_are_used_but_not_cached(fresh_kernel, monkeypatch, capsys):
    """Injected timings whose repeats spread by 3x: the table serves this process, the cache stays empty."""
    noisy = iter([0.001, 0.003, 0.001] * 1000)
    monkeypatch.setattr(cpu_matmul, "_time", lambda fn, reps: [next(noisy) for _ in range(reps)])
    tables = cpu_matmul.install(nn.Linear(64, 48))
    assert set(tables["(48, 64)"]) == set(cpu_matmul.BUCKETS)
    assert not cpu_matmul.CACHE.exists() and "not cached, timings spread" in capsys.readouterr().err
    monkeypatch.setattr(cpu_matmul, "_time", lambda fn, reps: [0.001] * reps)  # quiet again: cached
    monkeypatch.setattr(cpu_matmul, "MIN_CPU_SHARE", 0.0)  # (whatever else this machine runs meanwhile)
    cpu_matmul.install(nn.Linear(80, 40))
    assert cpu_matmul.CACHE.exists()


def test_a_row_count_slower_than_the_call_limit_ends_the_timing(fresh_kernel, monkeypatch):
    """Once the fastest form at a row count takes longer than MAX_CALL_S a call, the larger row counts take
    its form untimed (every form is timed at every count while the calls stay short)."""
    W = torch.randn(48, 40)
    calls = []

    def timings(fn, reps, slow_from=None):
        calls.append(len(calls))
        return [0.001 * (len(calls) + 1)] * reps if slow_from is None or len(calls) <= slow_from \
            else [1.0] * reps

    monkeypatch.setattr(cpu_matmul, "_time", timings)
    monkeypatch.setattr(cpu_matmul, "MIN_CPU_SHARE", 0.0)  # (the timings are made up: the process idles)
    table, why = cpu_matmul.tune(W)
    forms = len(cpu_matmul.forms_for(W))
    assert why is None and len(calls) == forms * len(cpu_matmul.BUCKETS)
    assert set(table) == set(cpu_matmul.BUCKETS)
    calls.clear()
    # from the third row count on, every call takes a second: timed there, not beyond
    monkeypatch.setattr(cpu_matmul, "_time", lambda fn, reps: timings(fn, reps, slow_from=2 * forms))
    table, why = cpu_matmul.tune(W)
    assert len(calls) == 3 * forms and set(table) == set(cpu_matmul.BUCKETS)
    assert {table[m] for m in cpu_matmul.BUCKETS[2:]} == {table[cpu_matmul.BUCKETS[2]]}


def test_a_form_far_behind_and_losing_ground_is_not_timed_at_larger_row_counts(fresh_kernel, monkeypatch):
    """A form over DROP_RATIO times the fastest at two row counts in a row, further behind at the second,
    is not timed beyond it; one as far behind but catching up (a form that wins at many rows) stays, and
    so does F.linear however slow."""
    W = torch.randn(48, 40)
    forms = cpu_matmul.forms_for(W)
    assert {"kernel", "wxt"} <= set(forms)
    # x the fastest at the first row counts (then as at the last)
    slow = {"kernel": [3.0, 4.0, 5.0], "wxt": [3.0, 2.5, 2.2], "linear": [3.0, 4.0, 5.0]}
    timed = {f: 0 for f in forms}

    def timings(fn, reps):
        form = fn.__defaults__[0]  # the tuner's lambda f=f
        timed[form] += 1
        i = timed["linear"] - 1  # F.linear is timed first at every row count
        return [0.001 * slow.get(form, [1.0])[min(i, len(slow.get(form, [1.0])) - 1)]] * reps

    monkeypatch.setattr(cpu_matmul, "_time", timings)
    monkeypatch.setattr(cpu_matmul, "MIN_CPU_SHARE", 0.0)  # (the timings are made up: the process idles)
    table, why = cpu_matmul.tune(W)
    n = len(cpu_matmul.BUCKETS)
    assert why is None and set(table) == set(cpu_matmul.BUCKETS)
    assert timed["kernel"] == 2 and timed["wxt"] == n and timed["linear"] == n
    assert "kernel" not in table.values()


def test_a_single_spike_is_timed_again_and_the_table_cached(fresh_kernel, monkeypatch, capsys):
    """One row count's first timings spread by 3x (a spike), its second are quiet: that row count
    is timed once more and the table is cached; every other row count is timed once."""
    forms = len(cpu_matmul.forms_for(torch.zeros(48, 64)))  # F.linear, W @ x.T, the kernel's two
    calls = []

    def timings(fn, reps):
        calls.append(reps)
        return [0.001, 0.003, 0.001] if len(calls) <= forms else [0.001] * reps

    monkeypatch.setattr(cpu_matmul, "_time", timings)
    monkeypatch.setattr(cpu_matmul, "MIN_CPU_SHARE", 0.0)  # (whatever else this machine runs meanwhile)
    cpu_matmul.install(nn.Linear(64, 48))
    assert len(calls) == forms * (len(cpu_matmul.BUCKETS) + 1)
    assert cpu_matmul.CACHE.exists() and "not cached" not in capsys.readouterr().err


def test_timings_taken_while_other_processes_hold_the_cores_are_not_cached(fresh_kernel, capsys):
    """A real busy loop in another process on every core this process times on, spinning before
    the timings start (hogs still starting up once let a 56 ms measurement have a whole core)."""
    import multiprocessing as mp
    import time

    stop = mp.Event()
    busy = 2 * max(torch.get_num_threads(), len(os.sched_getaffinity(0)))  # every core, whatever our threads
    spinning = mp.Barrier(busy + 1)
    hogs = [mp.Process(target=_spin, args=(stop, spinning)) for _ in range(busy)]
    for h in hogs:
        h.start()
    try:
        spinning.wait(timeout=60)
        time.sleep(0.3)  # the scheduler shares the cores out evenly by now
        cpu_matmul.install(nn.Linear(256, 256))
    finally:
        stop.set()
        for h in hogs:
            h.join()
    err = capsys.readouterr().err
    assert not cpu_matmul.CACHE.exists(), f"timings taken on loaded cores were cached: {err}"
    assert "not cached" in err


def _spin(stop, spinning):
    """Pure computation between rare looks at ``stop`` (an Event takes a process-shared lock: hogs
    checking it in a tight loop sleep on that lock and left this process a whole core)."""
    spinning.wait(timeout=60)
    while not stop.is_set():
        for _ in range(200_000):
            pass


def test_gradients_never_take_the_inference_forms(fresh_kernel):
    """A drafter trained through a frozen verifier LM head (full draft vocabulary): the loss gradient
    is identical with and without the row-aware layers installed, for every row bucket."""
    torch.manual_seed(0)
    head = nn.Linear(64, 300, bias=False).requires_grad_(False)
    proj = nn.Linear(64, 64)
    grads = {}
    for installed in (False, True):
        if installed:
            cpu_matmul.install(head)
        for rows in (1, 3, 8, 32):
            proj.zero_grad()
            x = torch.randn(rows, 64, generator=torch.Generator().manual_seed(rows))
            head(proj(x)).log_softmax(-1)[:, 7].sum().backward()
            grads[installed, rows] = proj.weight.grad.clone()
    for rows in (1, 3, 8, 32):
        assert torch.equal(grads[False, rows], grads[True, rows]), rows


def test_the_caches_can_be_shown_and_cleared(fresh_kernel, monkeypatch):
    from common import caches
    from decoding.cli import main

    monkeypatch.setattr(cpu_matmul, "MIN_CPU_SHARE", 0.0)
    monkeypatch.setattr(cpu_matmul, "MAX_SPREAD", 1e9)
    cpu_matmul.install(nn.Linear(64, 48))
    text = caches.show()
    assert "cpu_matmul.json: 1 entry" in text and "|cpu|(48, 64)|torch.float32" in text
    assert main(["cache", "show"]) == 0
    assert main(["cache", "clear"]) == 0
    assert not cpu_matmul.CACHE.exists() and "cpu_matmul.json: 0 entries" in caches.show()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_onednns_prepacked_linear_computes_the_product_and_packs_once(dtype):
    """The "onednn" form: oneDNN's linear on a copy packed once per weight, the product up to
    summation order (a bf16 F.linear runs the same oneDNN primitive; a float32 one runs BLAS)."""
    if not onednn.available(dtype):
        pytest.skip(f"this torch build runs no oneDNN {dtype} linear here")
    assert "onednn" in cpu_matmul.forms_for(torch.zeros(8, 8, dtype=dtype))
    g = torch.Generator().manual_seed(0)
    W = torch.randn(1539, 576, generator=g).to(dtype)
    tol = {"rtol": 1e-5, "atol": 1e-4} if dtype == torch.float32 else {"rtol": 1.6e-2, "atol": 1e-2}
    for M in (1, 2, 6, 16, 96):
        x = torch.randn(M, 576, generator=g).to(dtype)
        y = onednn.matmul(x, W)
        assert y.dtype == dtype and y.shape == (M, 1539)
        torch.testing.assert_close(y.double(), x.double() @ W.double().T, **tol)
    first = onednn.packed(W)
    assert onednn.packed(W) is first
    with torch.no_grad():
        W.mul_(2)  # written to: packed again, and the product follows
    assert onednn.packed(W) is not first
    x = torch.randn(3, 576, generator=g).to(dtype)
    torch.testing.assert_close(onednn.matmul(x, W).double(), x.double() @ W.double().T, **tol)


def test_a_torch_without_onednn_is_not_offered_the_form(monkeypatch):
    monkeypatch.setitem(onednn._OK, torch.float32, False)
    assert "onednn" not in cpu_matmul.forms_for(torch.zeros(8, 8))


def test_cache_warm_times_the_verifiers_tables_once_per_thread_count(tmp_path, monkeypatch, capsys):
    """`python -m decoding cache warm`: every weight shape of the verifier per thread count and dtype,
    cached, and in float32 tree auto's verify costs per feature capture; a second warm times nothing;
    bad counts are one clear error (timings injected: quiet)."""
    from decoding import autotree
    from decoding.cli import main

    monkeypatch.setattr(cpu_matmul, "CACHE", tmp_path / "cpu_matmul.json")
    monkeypatch.setattr(autotree, "CACHE", tmp_path / "verify_cost.json")
    monkeypatch.setattr(autotree, "_SESSION", {})
    monkeypatch.setattr(autotree, "VERIFY_SIZES", (1,))  # real passes, one size
    monkeypatch.setattr(autotree.timing, "MIN_CPU_SHARE", 0.0)  # (the suite's other worker shares the cores)
    monkeypatch.setattr(autotree.timing, "MAX_SPREAD", float("inf"))
    monkeypatch.setattr(cpu_matmul, "_SESSION", {})
    monkeypatch.setattr(cpu_matmul, "_time", lambda fn, reps: [0.001] * reps)
    monkeypatch.setattr(cpu_matmul, "MIN_CPU_SHARE", 0.0)
    threads = torch.get_num_threads()
    try:
        assert main(["cache", "warm", "--threads", "1,2"]) == 0
        first = capsys.readouterr().out
        assert main(["cache", "warm", "--threads", "2"]) == 0
        again = capsys.readouterr().out
        # the drafters' own shapes (fc of 2 and 3 hidden states, EAGLE-3's, a 1024-token draft head)
        assert main(["cache", "warm", "--threads", "2", "--drafters", "eagle2,eagle3",
                     "--draft-vocabs", "1024"]) == 0
        drafters = capsys.readouterr().out
        # decoding's own load finds them (an eval actor's tree auto, on another calibration prompt): no timing
        from decoding.verifiers import load_verifier

        model, tok = load_verifier("smollm2-135m-instruct", dtype="float32")
        monkeypatch.setattr(autotree.timing, "cpu_share", lambda fn: pytest.fail("verify costs timed again"))
        assert list(autotree.measure_verify_costs(model, autotree.calibration_inputs(tok)[1])) == [1]
    finally:
        torch.set_num_threads(threads)
    keys = cpu_matmul.load_json_cache(cpu_matmul.CACHE)
    assert {k.split("|")[2] for k in keys} == {"threads=1", "threads=2"}
    assert len(keys) == 14  # the verifier's 5 shapes per thread count, the drafters' 4 at 2 threads
    assert first.count("5 weight shape(s), 5 newly timed and cached") == 2
    assert "5 weight shape(s), 0 newly timed and cached" in again
    assert "9 weight shape(s), 4 newly timed and cached" in drafters
    costs = autotree.load_json_cache(autotree.CACHE)  # the last hidden state per thread count; EAGLE-3's
    threads_aux = sorted((re.search(r"\|threads=(\d+)\|", k).group(1), "|aux=" in k) for k in costs)
    assert threads_aux == [("1", False), ("2", False), ("2", True)], list(costs)
    assert first.count("tree auto's verify costs for 1 feature capture(s)") == 2
    assert "tree auto's verify costs for 2 feature capture(s)" in drafters
    assert {k.split("|")[-2] for k in keys} >= {
        "(576, 1152)", "(576, 1728)", "(192, 1152)", "(1024, 576)"}
    assert cpu_matmul.installed(load_verifier("smollm2-135m-instruct", matmul_forms=False)[0]) == {}  # plain
    assert main(["cache", "warm", "--threads", "0"]) == 2
    assert main(["cache", "warm", "--dtypes", "float64"]) == 2
    assert main(["cache", "warm", "--drafters", "eagle4"]) == 2
    err = capsys.readouterr().err
    assert "--threads takes positive integers" in err and "unknown dtype(s) ['float64']" in err
    assert "--drafters: unknown backbone(s) ['eagle4']; use eagle2, hass, eagle3" in err


def test_taskspec_threads_sets_the_clis_thread_count(monkeypatch):
    from decoding.runner import default_threads

    threads = torch.get_num_threads()
    try:
        monkeypatch.setenv("TASKSPEC_THREADS", "1")
        default_threads()
        assert torch.get_num_threads() == 1
        monkeypatch.delenv("TASKSPEC_THREADS")
        default_threads()  # every core this process may run on
        assert torch.get_num_threads() == max(threads, len(os.sched_getaffinity(0)))
        monkeypatch.setenv("TASKSPEC_THREADS", "two")
        with pytest.raises(ValueError, match="TASKSPEC_THREADS must be a positive integer, got 'two'"):
            default_threads()
    finally:
        torch.set_num_threads(threads)


def _add_keys(path, tag, n):
    from common.caches import add_to_json_cache

    for i in range(n):
        add_to_json_cache(path, f"{tag}{i}", i)


def test_processes_adding_to_one_cache_lose_no_entry(tmp_path):
    """Two processes add 40 entries each to one cache file at once (as a grid's workers time their
    tables): every entry is there afterwards."""
    import multiprocessing as mp

    from common.caches import load_json_cache

    path = tmp_path / "cpu_matmul.json"
    procs = [mp.Process(target=_add_keys, args=(path, tag, 40)) for tag in "ab"]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    assert all(p.exitcode == 0 for p in procs)
    assert load_json_cache(path) == {f"{t}{i}": i for t in "ab" for i in range(40)}
