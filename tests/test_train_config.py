"""The training settings' one home (drafters/train/config.py ``TrainSettings``): the profile's
train section and the worker's TrainConfig hold the same fields with the same rules, and the
precision names and byte sizes come from one table (common/dtypes.py). Torch-free, no Ray."""
from __future__ import annotations

import dataclasses

import pytest

from common.dtypes import BYTES, NAMES, PRECISIONS, nbytes
from drafters.corpora import CORPUS_OF
from drafters.train.config import TrainConfig, TrainSettings, weight_bytes
from orchestrator.plan.sizing import load_profile
from orchestrator.profile.schema import TrainCfg

RUN = dict(verifier="v", backbone="hass", variant="math", out_dir="x", train_data=[["r", "k", None]])


def test_the_profile_and_the_worker_inherit_every_setting_and_its_rule_and_declare_none_again():
    shared = [f.name for f in dataclasses.fields(TrainSettings)]
    for cls in (TrainCfg, TrainConfig):
        own = cls.__dataclass_fields__
        assert all(own[k].default == TrainSettings.__dataclass_fields__[k].default for k in shared), cls
        assert all(cls.RULES[k] is TrainSettings.RULES[k] for k in shared), cls
        assert not set(shared) & set(vars(cls).get("__annotations__", {})), cls  # not re-declared
    assert set(TrainSettings.RULES) == set(shared)  # every setting has its rule


@pytest.mark.parametrize("bad, msg", [
    ({"epochs": 0}, "epochs must be an integer >= 1, got 0"),
    ({"lr": 0.0}, "lr must be a number > 0, got 0.0"),
    ({"zero_stage": 3}, "zero_stage must be an integer in [0, 2], got 3"),
    ({"precision": "fp16"}, "precision must be fp32 or bf16, got 'fp16'"),
    ({"topk_from": 1.5}, "topk_from must be a number in [0, 1], got 1.5"),
    ({"keep_checkpoints": 0}, "keep_checkpoints must be an integer >= 1, got 0"),
    ({"backbone": "medusa"}, "backbone must be eagle2, hass or eagle3, got 'medusa'"),
    ({"train_data": []}, "train_data must be a non-empty list of data entries, got []"),
    ({"backbone": "eagle3", "loss_mask": "reference"}, "backbone eagle3 trains with loss_mask 'next' only"),
])
def test_a_worker_config_is_refused_with_its_settings_rule_in_one_line(bad, msg):
    with pytest.raises(ValueError) as e:
        TrainConfig(**{**RUN, **bad})
    assert str(e.value).startswith(msg) and "\n" not in str(e.value)


def test_the_profile_names_its_section_in_a_refusal_and_hands_its_settings_on_whole():
    p = load_profile("paper")
    with pytest.raises(ValueError, match=r"^train\.lr must be a number > 0, got -1$"):
        dataclasses.replace(p.train, lr=-1)
    t = p.train.for_backbone("hass")
    s = t.settings
    assert type(s) is TrainSettings and dataclasses.asdict(s) == {
        k: getattr(t, k) for k in TrainSettings.__dataclass_fields__}
    cfg = TrainConfig(**dataclasses.asdict(s), **RUN)
    assert cfg.settings == s and cfg.init_seed == t.init_seed and cfg.keep_checkpoints == t.keep_checkpoints


def test_precisions_and_their_bytes_come_from_one_table():
    assert set(PRECISIONS.values()) <= set(NAMES) == set(BYTES)
    assert (nbytes("bf16"), nbytes("bfloat16"), nbytes("fp32"), nbytes("float32")) == (2, 2, 4, 4)
    # a weight as trained: bf16 only in DeepSpeed's bf16 engine, autocast keeps float32 weights
    assert (weight_bytes("bf16", True), weight_bytes("bf16", False), weight_bytes("fp32", True)) == (2, 4, 4)
    assert TrainSettings.RULES["precision"].allowed == "fp32 or bf16"


def test_the_train_cli_offers_the_variants_and_precisions_of_their_homes():
    import argparse

    from workers.train_cli import add_train

    parser = argparse.ArgumentParser()
    add_train(parser.add_subparsers())
    train = parser._subparsers._group_actions[0].choices["train"]
    choices = {a.dest: a.choices for a in train._actions if a.choices}
    assert list(choices["variant"]) == list(CORPUS_OF) and list(choices["precision"]) == list(PRECISIONS)
