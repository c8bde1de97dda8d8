"""The CPU matmul forms the verifier's linear layers choose from (decoding/cpu_matmul.py), and the
thin-GEMM kernel compiled on first use (decoding/cpu_kernel.py)."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from decoding import cpu_kernel, cpu_matmul


@pytest.fixture
def fresh_kernel(tmp_path, monkeypatch):
    """A kernel state of its own, cached under tmp_path (so a test can break the build)."""
    monkeypatch.setattr(cpu_matmul, "CACHE", tmp_path / "cpu_matmul.json")
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
    for M in (1, 2, 3, 5, 6, 7, 8, 9, 16, 17, 32):
        y = cpu_kernel.matmul(x[:M], W)
        ref = (x[:M].double() @ W.double().T).float()
        assert y.shape == (M, N)
        torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-4)
        # same dot product in the same order for any M: bit-identical to the row computed alone
        assert torch.equal(y, alone[:M]), M


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
    with pytest.raises(ValueError, match="float32"):
        cpu_kernel.matmul(torch.randn(2, 32, dtype=torch.bfloat16), W)
    with pytest.raises(ValueError, match="M<= 32"):
        cpu_kernel.matmul(torch.randn(33, 32), W)
    with pytest.raises(ValueError, match=r"\(16, 32\)"):
        cpu_kernel.matmul(torch.randn(2, 31), W)


def test_install_gives_every_linear_a_timed_form_and_changes_no_result(fresh_kernel):
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
        torch.testing.assert_close(cpu_matmul._form_fn(form)(x, model[0].weight), x @ model[0].weight.T,
                                   rtol=1e-5, atol=1e-5)
    assert cpu_matmul.CACHE.exists()  # tuned once per machine, then read back


def test_without_a_compiler_the_kernel_says_why_and_install_keeps_the_blas_forms(fresh_kernel, monkeypatch):
    monkeypatch.setenv("CC", str(fresh_kernel / "no-such-cc"))
    assert not cpu_kernel.available()
    assert "unavailable: cannot build or load smallm.c" in cpu_kernel.status()
    tables = cpu_matmul.install(nn.Linear(64, 48))
    assert "kernel" not in set(tables["(48, 64)"].values())


def test_a_kernel_that_does_not_compile_names_the_compiler_error(fresh_kernel, monkeypatch):
    bad = fresh_kernel / "smallm.c"
    bad.write_text("int smallm_f32( {\n")
    monkeypatch.setattr(cpu_kernel, "SOURCE", bad)
    assert not cpu_kernel.available()
    assert "compiling smallm.c failed" in cpu_kernel.status() and "error" in cpu_kernel.status()
    assert not list((fresh_kernel / "kernels").glob("*")), "a failed build leaves nothing behind"


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
