"""Training objectives and merges on hand-made tensors (no verifier needed)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from drafters.checkpoint import init_drafter, load_checkpoint, save_checkpoint
from drafters.config import DrafterConfig
from drafters.merge import linear, merge_checkpoints, ties
from drafters.train.eagle2 import AlignedBatch, align, aligned_passes, hass_mask

CFG = DrafterConfig(backbone="hass", verifier="toy", hidden_size=16, vocab_size=50, num_attention_heads=4,
                    num_key_value_heads=2, intermediate_size=32, seed=0)


def test_alignment_position_t_predicts_feature_t_plus_1():
    ids = torch.tensor([10, 11, 12, 13, 14])
    feats = torch.arange(5).float()[:, None].expand(5, 3)  # f_t = t
    mask = torch.tensor([0, 0, 1, 1, 1])  # tokens 2..4 are assistant tokens
    a = align(ids, feats, mask)
    assert a["tokens"].tolist() == [11, 12, 13, 14]  # input token x_{t+1}
    assert a["features"][:, 0].tolist() == [0, 1, 2, 3]  # input feature f_t
    assert a["target"][:, 0].tolist() == [1, 2, 3, 4]  # target f_{t+1}
    assert a["mask"].tolist() == [False, True, True, True]  # loss iff token t+1 is assistant


def test_hass_mask_uses_own_predictions_for_the_last_steps():
    m = hass_mask(5, 3)  # keys: [K1 (5) | K2 (5) | K3 (5)]
    # query 4 at pass 3: target keys 0..2, pass-2 key at 3, pass-3 key at 4
    row = m[4].tolist()
    assert row[:5] == [True, True, True, False, False]
    assert row[5:10] == [False, False, False, True, False]
    assert row[10:] == [False, False, False, False, True]
    assert torch.equal(hass_mask(4, 1), torch.ones(4, 4, dtype=torch.bool).tril())


def test_hass_pass_j_does_not_see_the_verifier_features_it_replaces():
    """Pass 2's output at t ignores f_t (it uses its own estimate); pass 3's ignores f_t and f_{t-1}."""
    torch.manual_seed(0)
    model = init_drafter(CFG)
    embed = torch.nn.Embedding(50, 16)
    T = 6
    feats = torch.randn(1, T, 16)
    batch = AlignedBatch(torch.randint(0, 50, (1, T)), feats, feats, None, None, torch.ones(1, T,
            dtype=torch.bool),
                         torch.tensor([T + 1]))
    base = aligned_passes(model, embed, batch, 3)
    t = 4
    for changed in ([t], [t - 1, t]):
        f2 = feats.clone()
        f2[0, changed] += 5.0
        out = aligned_passes(model, embed, AlignedBatch(batch.tokens, f2, f2, None, None, batch.mask,
                                                        batch.lengths), 3)
        assert not torch.allclose(out[0][0, t], base[0][0, t])  # teacher-forced pass sees f_t
        if changed == [t - 1, t]:  # ...and pass 2 sees f_{t-1} (through its estimate of f_t)
            assert not torch.allclose(out[1][0, t], base[1][0, t])
        # pass 2 at t: independent of f_t only (f_{t-1} feeds its own estimate of f_t)
        if changed == [t]:
            torch.testing.assert_close(out[1][0, t], base[1][0, t])
        # pass 3 at t: independent of f_t and f_{t-1}
        torch.testing.assert_close(out[2][0, t], base[2][0, t])


def test_linear_merge_endpoints_bit_for_bit_and_refusals(tmp_path):
    a = init_drafter(CFG)
    b = init_drafter(DrafterConfig(**{**CFG.to_dict(), "seed": 1}))
    pa, pb = save_checkpoint(a, tmp_path / "a"), save_checkpoint(b, tmp_path / "b")
    for lam, ref in ((1.0, a), (0.0, b)):
        out = merge_checkpoints("linear", [str(pa), str(pb)], str(tmp_path / f"m{lam}"), lam=lam)
        got = load_checkpoint(out).state_dict()
        assert all(torch.equal(got[k], ref.state_dict()[k]) for k in got)
    half = linear(a.state_dict(), b.state_dict(), 0.5)
    torch.testing.assert_close(half["fc.weight"], 0.5 * (a.fc.weight + b.fc.weight))
    with pytest.raises(ValueError, match="lambda must be in"):
        linear(a.state_dict(), b.state_dict(), 1.5)
    other = init_drafter(DrafterConfig(**{**CFG.to_dict(), "backbone": "eagle2"}))
    po = save_checkpoint(other, tmp_path / "o")
    with pytest.raises(ValueError, match="different backbone"):
        merge_checkpoints("linear", [str(pa), str(po)], str(tmp_path / "bad"), lam=0.5)
    wide = init_drafter(DrafterConfig(**{**CFG.to_dict(), "intermediate_size": 64}))
    pw = save_checkpoint(wide, tmp_path / "w")
    with pytest.raises(ValueError, match="different intermediate_size"):
        merge_checkpoints("linear", [str(pa), str(pw)], str(tmp_path / "bad2"), lam=0.5)
    assert not (tmp_path / "bad").exists() and not (tmp_path / "bad2").exists()


def test_ties_elects_signs_and_trims():
    base = {"w": torch.zeros(4)}
    t1 = {"w": torch.tensor([1.0, -2.0, 0.1, 3.0])}
    t2 = {"w": torch.tensor([1.0, 1.0, 0.1, -1.0])}
    out = ties(base, [t1, t2], density=0.5)["w"]
    # t1 keeps [-2, 3], t2 keeps [1, 1] at positions 0,1 ( ties at 1.0 kept) -> signs: pos0 +, pos1 -, pos3 +
    assert out[0] == 1.0 and out[1] == -2.0 and out[2] == 0.0 and out[3] == 3.0


def test_each_variant_reads_its_corpora_and_the_mixed_ones_their_share():
    """math / chat read one corpus whole; mixed_half the first n/2 of each corpus's selection,
    mixed_full all n of each; online caches are named as such; the planner agrees."""
    from drafters.corpora import variant_corpora
    from drafters.variants import heldout_data, variant_data
    from orchestrator.grid import corpora
    from orchestrator.plan.sizing import load_profile

    caches = {"mathinstruct": {"train": "km", "heldout": "hm", "train_ids": ["m1", "m2", "m3", "m4"]},
              "sharegpt": {"train": "ks", "heldout": "hs", "train_ids": ["s1", "s2", "s3", "s4"]}}
    assert variant_data("math", "R", caches, 4) == [["R", "km", None]]
    assert variant_data("chat", "R", caches, 4) == [["R", "ks", None]]
    assert variant_data("mixed_half", "R", caches, 4) == [["R", "km", ["m1", "m2"]], ["R", "ks", ["s1",
            "s2"]]]
    assert variant_data("mixed_full", "R", caches, 4) == [["R", "km", ["m1", "m2", "m3", "m4"]],
                                                           ["R", "ks", ["s1", "s2", "s3", "s4"]]]
    assert heldout_data("R", caches) == [["R", "hm", None], ["R", "hs", None]]
    online = {c: {"online": True, "train_ids": v["train_ids"]} for c, v in caches.items()}
    assert variant_data("chat", "R", online, 4) == [["online", "sharegpt", None]]
    assert heldout_data("R", online) == [["online-heldout", "mathinstruct", None], ["online-heldout",
            "sharegpt", None]]
    with pytest.raises(ValueError, match="unknown data variant 'mixed'"):
        variant_data("mixed", "R", caches, 4)
    assert variant_corpora("mixed_half") == ("mathinstruct", "sharegpt")
    for variants, want in (("[math]", ["mathinstruct"]), ("[chat]", ["sharegpt"]),
                           ("[chat, mixed_half]", ["mathinstruct", "sharegpt"])):
        p = load_profile("smoke", [f"train.variants={variants}", "eval.strategies=[autoregressive,single]",
                                   "eval.routers=[]", "merge.kinds=[]"])
        assert corpora(p) == want, variants


def test_deepspeed_imports_without_mlflow_and_mlflow_still_imports_after():
    """DeepSpeed's autotuner tries `import mlflow` at import time; the trainer skips it (seconds
    of every training process) and leaves mlflow importable afterwards (the driver's tracking)."""
    code = ("import sys, importlib.util; from drafters.train.runners import import_deepspeed; "
            "ds = import_deepspeed(); from deepspeed.autotuning import autotuner; "
            "print('mlflow' in sys.modules, autotuner.has_mlflow, ds.__name__); "
            "has = importlib.util.find_spec('mlflow') is not None; "
            "print(not has or __import__('mlflow').__name__ == 'mlflow')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       cwd=Path(__file__).resolve().parents[1], env={**os.environ, "DS_ACCELERATOR": "cpu"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-2:] == ["False False deepspeed", "True"], r.stdout


def test_deepspeed_trains_without_jit_building_its_cpu_comm_op(tmp_path):
    """DeepSpeed's torch backend JIT-compiles its shm comm op at start-up on CPU (a minute of both
    cores in every new environment) for inference all-reduces only. The trainer's engine (bf16,
    ZeRO 1, a gloo process group) is built and steps with nothing compiled: the build dir stays empty."""
    code = ("import torch; from drafters.train.config import TrainConfig; from drafters.train.runners "
            "import _DeepSpeed; "
            "cfg = TrainConfig(backbone='eagle2', variant='math', verifier='toy', "
            "train_data=[['x', 'k', None]], out_dir='.', epochs=1, lr=1e-2, batch_size=2, deepspeed=True, "
            "zero_stage=1, precision='bf16'); "
            "torch.manual_seed(0); m = torch.nn.Linear(8, 8); before = m.weight.detach().clone(); "
            "r = _DeepSpeed(m, torch.optim.AdamW(m.parameters(), lr=1e-2), cfg, 1); "
            "loss = r.module(torch.randn(2, 8, dtype=torch.bfloat16)).float().square().mean(); "
            "r.backward(loss); r.step(); from deepspeed.comm import comm as dist; "
            "print(dist.cdb.shm_comm_op, r.module.weight.dtype, "
            "bool((r.engine.module.weight.float() != before).any()))")
    ext = tmp_path / "ext"
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(ext), "DS_ACCELERATOR": "cpu",
           "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(_free_port()), "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       cwd=Path(__file__).resolve().parents[1], env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "None torch.bfloat16 True", r.stdout
    assert "built successfully" not in r.stdout + r.stderr
    assert not ext.exists() or not any(ext.iterdir()), sorted(ext.rglob("*"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_deepspeeds_jit_ops_build_once_per_python_environment(tmp_path):
    """The JIT build directory follows sys.prefix as the process sees it (one venv reached through
    a worktree's symlink used to rebuild the other path's objects, a minute of both cores); a
    TORCH_EXTENSIONS_DIR the user set is kept."""
    code = ("import os, sys; from drafters.train.runners import _jit_build_setup, jit_build_dir; "
            "_jit_build_setup(); print(os.environ['TORCH_EXTENSIONS_DIR']); "
            "print(os.environ['PATH'].split(os.pathsep)[0]); sys.prefix = '/elsewhere/venv'; "
            "print(jit_build_dir())")
    env = {k: v for k, v in os.environ.items() if k != "TORCH_EXTENSIONS_DIR"}
    env["XDG_CACHE_HOME"] = str(tmp_path)
    root = Path(__file__).resolve().parents[1]

    def run():
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                              cwd=root, env=env)

    r = run()
    assert r.returncode == 0, r.stderr[-2000:]
    own, first_on_path, other = r.stdout.strip().splitlines()
    assert Path(own).parent == tmp_path / "torch_extensions" and Path(own).name.startswith("py3")
    assert other != own and Path(other).parent == Path(own).parent  # another prefix, another dir
    if (Path(sys.executable).parent / "ninja").is_file():
        assert first_on_path == str(Path(sys.executable).parent)
    env["TORCH_EXTENSIONS_DIR"] = str(tmp_path / "mine")
    r = run()
    assert r.stdout.splitlines()[0] == str(tmp_path / "mine"), r.stderr[-2000:]
