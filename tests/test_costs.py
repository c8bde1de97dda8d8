"""The cost model against the modules it models: parameter counts (orchestrator/plan/costs.py) against
the drafters' own ``sum(p.numel())``, the activation bytes (orchestrator/plan/sizing.py) against what
autograd saves on the real losses, the memory refusal, the deploy files' node type, and the
features mode picked from the cache estimate. Fast: no verifier, no Ray."""
from __future__ import annotations

import pytest
import torch
import yaml
from torch import nn

from drafters.config import DrafterConfig
from drafters.eagle3 import Eagle3Config, Eagle3Drafter, init_eagle3
from drafters.model import FeatureDrafter
from drafters.train.eagle2 import aligned_passes, eagle_losses, step_mask
from drafters.train.eagle3 import ttt_loss_targets
from drafters.vocab import DraftHead
from orchestrator.plan.costs import GIB, VERIFIERS, checkpoint_bytes, drafter_params, feature_bytes_per_token
from orchestrator.plan.sizing import (
    feature_cache_bytes,
    feature_mode_reason,
    kept_bytes,
    load_profile,
    memory_problem,
    profile_memory,
)
from orchestrator.profile import ProfileError
from tests.test_deploy import LAUNCHER, load_rayjob

TINY = {"hidden": 64, "vocab": 512, "heads": 4, "kv_heads": 2, "intermediate": 160, "layers": 8}
# GPU memory of the AWS instance types the deploy files may name (GiB per GPU, as NVIDIA sizes them)
NODE_GPU_GIB = {"p4d.24xlarge": 40, "p4de.24xlarge": 80, "p5.48xlarge": 80, "p5e.48xlarge": 141}


def _configs(v: dict, draft_vocab: int | None):
    kw = dict(verifier="x", hidden_size=v["hidden"], vocab_size=v["vocab"], num_attention_heads=v["heads"],
              num_key_value_heads=v["kv_heads"], intermediate_size=v["intermediate"],
              draft_vocab_size=draft_vocab)
    e3 = Eagle3Config(num_verifier_layers=v["layers"], aux_layers=(2, v["layers"] // 2, v["layers"] - 3),
                      **kw)
    return DrafterConfig(backbone="eagle2", **kw), e3


@pytest.mark.parametrize("name", ["tiny", *VERIFIERS])
@pytest.mark.parametrize("draft_vocab", [None, 100])
def test_parameter_counts_are_the_modules_own(name, draft_vocab):
    """Built on the meta device at the verifier's real shape (Llama-3-8B's too): no memory, the same
    modules the trainer builds."""
    v = TINY if name == "tiny" else VERIFIERS[name]
    e2, e3 = _configs(v, draft_vocab)
    with torch.device("meta"):
        counts = {"eagle2": sum(p.numel() for p in FeatureDrafter(e2).parameters()),
                  "eagle3": sum(p.numel() for p in Eagle3Drafter(e3).parameters())}
    assert {b: drafter_params(v, b, draft_vocab) for b in counts} == counts
    assert drafter_params(v, "hass", draft_vocab) == counts["eagle2"]  # one architecture


def test_eagle3_at_llama3_8b_is_its_own_full_vocabulary_head_and_a_13_gb_checkpoint():
    v = VERIFIERS["llama3-8b-instruct"]
    head = 128_256 * 4_096
    assert drafter_params(v, "eagle3") - drafter_params(v, "eagle3", draft_vocab=1) == head - 4_096
    assert drafter_params(v, "eagle3") > 3 * drafter_params(v, "eagle2")  # the undercount this replaces
    assert 13.0e9 < checkpoint_bytes(v, "eagle3", "bf16", deepspeed=True) < 13.2e9


def _saved_bytes(fn, skip) -> int:
    """Bytes of the distinct storages autograd saves for the backward while ``fn`` runs (weights not
    counted: they are the states' part). Every saved tensor is held until the end, so a pass whose
    graph is freed cannot hand its address to the next pass's tensors (the allocator reuses
    addresses differently by machine, and a reused address would count two storages once)."""
    skip = {p.untyped_storage().data_ptr() for p in skip}
    seen, held = {}, []

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in skip:
            seen[ptr] = max(seen.get(ptr, 0), t.untyped_storage().nbytes())
            held.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


@pytest.mark.parametrize("backbone", ["eagle2", "hass", "eagle3"])
@pytest.mark.parametrize("shape", [{"hidden": 256, "intermediate": 1024, "vocab": 64},  # the layer's part
                                   {"hidden": 128, "intermediate": 512, "vocab": 8192}])  # the head's part
def test_activation_bytes_are_what_autograd_saves(backbone, shape):
    """sizing.kept_bytes against the tensors the real losses save in bf16 (the trainer's
    compute_loss: aligned_passes + eagle_losses per pass; EAGLE-3: ttt_loss_targets), every row
    counted. Attention saves its inputs and output here; a score matrix (CPU's math kernel at long
    sequences) is outside the model, which assumes CUDA's memory-efficient kernel."""
    v = {**shape, "heads": 4, "kv_heads": 2, "layers": 8}
    b, L, steps, dt = 2, 64, 3, torch.bfloat16
    torch.manual_seed(0)
    emb = nn.Embedding(v["vocab"], v["hidden"]).to(dt).requires_grad_(False)
    ids = torch.randint(0, v["vocab"], (b, L))
    e2cfg, e3cfg = _configs(v, None)
    if backbone == "eagle3":
        model = init_eagle3(e3cfg).to(dt)
        aux = torch.randn(b, L, 3 * v["hidden"], dtype=dt)
        probs = torch.softmax(torch.randn(b, L, v["vocab"]), -1)

        def run():
            ttt_loss_targets(model, emb, aux, ids, probs, torch.ones(b, L, dtype=torch.bool), steps=steps)
        frozen = list(emb.parameters())
    else:
        model = FeatureDrafter(e2cfg).to(dt)
        lm = nn.Linear(v["hidden"], v["vocab"], bias=False).to(dt).requires_grad_(False)
        head, t = DraftHead(lm), L - 1

        class Batch:  # what aligned_passes and eagle_losses read of an AlignedBatch
            features, target = torch.randn(b, t, v["hidden"], dtype=dt), torch.randn(b, t, v["hidden"],
                    dtype=dt)
            tokens, mask = ids[:, 1:], torch.ones(b, t, dtype=torch.bool)
            top_ids, top_probs = torch.randint(0, v["vocab"], (b, t, 10)), torch.rand(b, t, 10)

        def run():
            for j, pred in enumerate(aligned_passes(model, emb, Batch, steps if backbone == "hass" else 1),
                                     1):
                eagle_losses(pred, Batch.target, head, step_mask(Batch.mask, j), Batch.top_ids,
                             Batch.top_probs)
        frozen = list(emb.parameters()) + list(lm.parameters())
        steps = steps if backbone == "hass" else 1
    measured = _saved_bytes(run, list(model.parameters()) + frozen)
    model_bytes = kept_bytes(v, backbone, rows=b * (L - 1), passes=steps)
    assert model_bytes == pytest.approx(measured, rel=0.08), (model_bytes, measured)


def test_a_profile_whose_gpus_cannot_hold_training_is_refused_with_the_numbers():
    """The paper grid on 4 workers (micro-batch 2) and A100 40GB: EAGLE-3 does not fit; one line with
    its figures, the micro-batch that fits and the GPUs that would hold it as configured."""
    p = load_profile("paper", ["resources.train.num_workers=4", "resources.gpu_memory_gib=40"])
    mem = profile_memory(p)
    assert mem["eagle3"].micro_batch == 2 and mem["eagle3"].total > 40 * GIB > mem["hass"].total
    line = memory_problem(p)
    assert line is not None and "\n" not in line
    assert line.startswith("resources.gpu_memory_gib 40: training needs more per GPU (estimate): eagle3 ")
    assert f"{mem['eagle3'].total / GIB:.1f} GiB" in line and "819 M params" in line and "hass" not in line
    assert "train.per_backbone.eagle3.batch_size=1" in line and "p4de.24xlarge" in line
    fixed = load_profile("paper", ["resources.train.num_workers=4", "resources.gpu_memory_gib=40",
                                   "train.per_backbone.eagle3.batch_size=1"])
    assert memory_problem(fixed) is None  # the fix the line names is accepted
    assert memory_problem(load_profile("paper")) is None  # as shipped, on its 80 GB GPUs
    assert profile_memory(load_profile("demo")) == {}  # CPU training: nothing to check


def test_the_deploy_files_name_a_node_type_that_holds_the_paper_grid():
    p = load_profile("paper")
    launcher = yaml.safe_load(LAUNCHER.read_text())["available_node_types"]["gpu_worker"]["node_config"]
    [group] = load_rayjob()[0]["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    selected = group["template"]["spec"]["nodeSelector"]["node.kubernetes.io/instance-type"]
    assert launcher["InstanceType"] == selected
    assert NODE_GPU_GIB[selected] == p.resources.gpu_memory_gib
    assert all(m.total <= p.resources.gpu_memory_gib * GIB for m in profile_memory(p).values())


def test_feature_mode_auto_picks_cached_when_the_cache_with_eagle3s_aux_layers_fits():
    v = VERIFIERS["llama3-8b-instruct"]
    p = load_profile("paper", ["data.feature_mode=auto"])
    c = feature_cache_bytes(p)
    tokens = 70_512 * (900 + 350)
    assert c["tokens"] == tokens and c["total"] == tokens * (4096 * 2 + 60 + 3 * 4096 * 2)
    assert c["total"] == tokens * feature_bytes_per_token(v, True) and c["aux"] == tokens * 3 * 4096 * 2
    assert p.data.feature_mode == "cached" and c["total"] <= p.data.feature_storage_gib * GIB
    assert feature_mode_reason(p).startswith("cached: a cache would take 2.63 TiB (hidden states and top-10 "
                                             "0.66 TiB + EAGLE-3's three aux layers 1.97 TiB), within")
    assert load_profile("paper") == p  # the shipped profile is auto: cached
    online = load_profile("paper", ["data.feature_mode=online"])  # says that auto would pick cached
    assert online.data.feature_mode == "online" and feature_mode_reason(online).endswith(
            "auto would pick cached")
    small = load_profile("paper", ["data.feature_mode=auto", "data.feature_storage_gib=1000"])
    assert small.data.feature_mode == "online"
    assert "over data.feature_storage_gib 1,000 GiB" in feature_mode_reason(small)
    no_eagle3 = load_profile("paper", ["data.feature_mode=auto", "train.backbones=[eagle2, hass]",
                                       "data.feature_storage_gib=1000", "merge.sweep_backbones=[eagle2]"])
    assert no_eagle3.data.feature_mode == "cached"  # 0.66 TiB without the aux layers
    with pytest.raises(ProfileError, match=r"data.feature_mode cached: a cache would take 2.63 TiB .* over "
                                           r"data.feature_storage_gib 1,000 GiB"):
        load_profile("paper", ["data.feature_mode=cached", "data.feature_storage_gib=1000"])
    with pytest.raises(ProfileError, match="data.feature_mode auto needs data.feature_storage_gib"):
        load_profile("paper", ["data.feature_mode=auto", "data.feature_storage_gib=null"])


def test_the_features_mode_follows_its_cost_and_flips_with_the_nodes_io():
    """auto takes the cheaper runnable mode by the cost model (orchestrator/plan/feature_modes.py): cached at
    the deploy node's defaults; online when the object store is very slow and no share stays on node
    disk (every epoch from the store); cached again when the store is fast. The dry run's reason and the
    preflight's name the costs."""
    from orchestrator.plan import feature_modes

    p = load_profile("paper")
    t = feature_modes.totals(p)
    assert p.data.feature_mode == "cached" and t["cached"] < t["online"]
    assert "by cost" in feature_mode_reason(p) and f"online {t['online']:,.1f}" in feature_mode_reason(p)
    slow = ["resources.node.object_store_gb_s=0.01", "resources.node.disk_gb=0"]
    starved = load_profile("paper", slow)
    assert starved.data.feature_mode == "online"
    assert feature_modes.totals(starved)["cached"] > feature_modes.totals(starved)["online"]
    fast = load_profile("paper", ["resources.node.object_store_gb_s=50", "resources.node.disk_gb=0"])
    assert fast.data.feature_mode == "cached"
    # an explicit mode is kept whatever the cost says, and the reason says what auto would do
    forced = load_profile("paper", ["data.feature_mode=cached", *slow])
    assert forced.data.feature_mode == "cached"
    assert feature_mode_reason(load_profile("paper",
                                            ["data.feature_mode=online"])).endswith("auto would pick cached")
    # the options, per backbone: each costed; a share that does not fit node disk makes the hybrid online
    o = feature_modes.options(starved, "eagle2")
    assert set(o) == {"online", "cached", "hybrid"} and o["hybrid"].gpu_h == pytest.approx(o["online"].gpu_h)
    lines = feature_modes.lines(p)
    assert any(x.strip().startswith("run: cached")
               for x in lines) and len(lines) == 3 + len(p.train.backbones)


def test_eagle2_and_hass_read_no_aux_layers():
    """EAGLE-3 reads the three aux layers; EAGLE-2 and HASS only the LM head's input and its top-10, so
    their shard reads (and the bytes/s a trial needs) are about a quarter of EAGLE-3's per token."""
    from drafters.train.config import TrainConfig
    from orchestrator.plan.costs import HELDOUT_DEPTHS, read_bytes_per_token
    from orchestrator.plan.io_cost import trial_io

    v = VERIFIERS["llama3-8b-instruct"]
    assert read_bytes_per_token(v, "eagle2") == read_bytes_per_token(v, "hass") == 4096 * 2 + 60
    assert read_bytes_per_token(v, "eagle3") == feature_bytes_per_token(v, True)
    node = load_profile("paper").resources.node
    e2, e3 = (trial_io(100.0, 2, 1e8, 8, node, 4096, 3, b == "eagle3") for b in ("eagle2", "eagle3"))
    assert 0.2 < e2.share_bytes / e3.share_bytes < 0.3
    assert HELDOUT_DEPTHS == TrainConfig.__dataclass_fields__["eval_depths"].default


def test_the_io_term_waits_only_where_the_bandwidth_is_short():
    """orchestrator/plan/io_cost.py over feature_io.py: a trial whose share fits node disk waits for the store
    in its first epoch only; one that does not, every epoch; a store slower than the compute's need
    stretches the epoch by what it cannot carry."""
    from dataclasses import replace

    from orchestrator.plan.io_cost import trial_io

    node = load_profile("paper").resources.node
    args = (1000.0, 10, 2e7, 8)  # 1,000 s an epoch over 20 M tokens of a cache with EAGLE-3's layers
    fits = trial_io(*args, node, 4096, 3, True)
    assert fits.fits and fits.stall_s < 0.01 * 10 * 1000  # the first shards only: 0.66 GB/s, it keeps up
    slow = replace(node, object_store_gb_s=0.25)
    assert fits.need_bytes_per_s > 0.25e9  # more than the slow store gives
    once = trial_io(*args, slow, 4096, 3, True)
    assert once.stall_s == pytest.approx(fits.share_bytes / 0.25e9 - 1000.0, rel=0.05)
    every = trial_io(*args, replace(slow, disk_gb=0.0), 4096, 3, True)
    assert not every.fits and every.stall_s == pytest.approx(10 * once.stall_s, rel=0.01)
