"""What one drafter training run is, in two frozen dataclasses validated once when built (the rules
in common/rules.py's words). Torch-free, so the profile and the driver build them without torch and
they cross Ray as themselves.

``TrainSettings`` holds the hyperparameters the profile's ``train`` section and the worker share,
each declared here alone; the profile's ``TrainCfg`` (orchestrator/profile/schema.py) adds which
cells train, and ``TrainConfig`` adds one run's drafter, data and destination. Both inherit the
fields, so a profile's ``train.lr`` and a config's ``lr`` are the one field (the DrafterBase pattern,
drafters/config.py).

A data entry (``train_data``, ``heldout_data``) is ``[store_root, cache_key, example ids or None]``,
optionally with a fourth item naming one shard of that cache (a rank's own, drafters/train/shards.py);
an entry whose root is in ``ONLINE_ROOTS`` is ``[root, corpus, ids]`` and its features are computed
by the verifier inside the training worker (``online_spec`` selects the examples).
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

from common.dtypes import PRECISIONS, nbytes
from common.rules import BOOL, Rule, check, integer, number, one_of, optional
from drafters.config import BACKBONES, FEATURE_BACKBONES

if TYPE_CHECKING:
    from drafters.variants import DataSpec

MASK_MODES = ("next", "reference")  # loss positions (drafters/train/eagle2.py ``align``)
ONLINE_ROOTS = ("online", "online-heldout")  # data entries whose features the verifier computes in the worker


@dataclass(frozen=True)
class TrainSettings:
    epochs: int = 1
    lr: float = 3e-5
    # per worker: examples per micro-batch (the profile: with train.global_batch set, the most one
    # worker holds)
    batch_size: int = 8
    grad_accum: int = 1  # the profile: with train.global_batch set, derived (leave at 1), see its batch_plan
    warmup_steps: int = 0
    deepspeed: bool = True
    # 0-2; ZeRO-3 is refused (held-out evaluation and saving run on rank 0, which would hold a shard)
    zero_stage: int = 1
    # fp32 | bf16 (common/dtypes.py PRECISIONS): what the drafter trains in (DeepSpeed's bf16 engine, or
    # autocast without DeepSpeed); its inputs follow it and the losses stay float32. GPU profiles: bf16;
    # the CPU profiles: fp32
    precision: str = "fp32"
    hass_steps: int = 3
    max_seconds: float | None = None  # stop each epoch early (smoke profiles); None = full epochs
    init_seed: int = 0  # the drafter's initialisation (shared by every variant) and the batch order
    lr_schedule: str = "linear"  # linear: warm up, then decay linearly to 0 (EAGLE/HASS); constant
    grad_clip_mode: str = "value"  # value: clamp each gradient entry (EAGLE/HASS); norm: global norm
    topk_from: float = 0.5  # HASS two-stage schedule: the top-K term joins after this fraction of the steps
    # next: token t+1 is the assistant's (decode-time); reference: EAGLE/HASS's loaders, one earlier
    loss_mask: str = "next"
    bucket: bool = True  # length-bucketed batches (little padding); False = batches in stream order
    # a resumable checkpoint every N optimizer steps (weights, optimizer, RNG, data position), so a
    # failure loses at most N steps; None = at epoch ends only. Neither key changes the result.
    checkpoint_every: int | None = None
    keep_checkpoints: int = 2  # epochs kept per drafter (locally, at the URI and in Ray Train's record)

    RULES = {"epochs": integer(1), "lr": number(0, lo_open=True), "batch_size": integer(1),
             "grad_accum": integer(1), "warmup_steps": integer(0), "deepspeed": BOOL,
             "zero_stage": integer(0, 2),
             "precision": one_of(*PRECISIONS), "hass_steps": integer(1),
             "max_seconds": optional(number(0, lo_open=True)), "init_seed": integer(0),
             "lr_schedule": one_of("linear", "constant"), "grad_clip_mode": one_of("value", "norm"),
             "topk_from": number(0, 1), "loss_mask": one_of(*MASK_MODES), "bucket": BOOL,
             "checkpoint_every": optional(integer(1)), "keep_checkpoints": integer(1)}
    PREFIX = ""  # before a field's name in a refusal (the profile's section: "train.")

    def __post_init__(self):
        check(self, self.PREFIX)

    @property
    def settings(self) -> TrainSettings:
        """The shared hyperparameters alone (of a profile's TrainCfg or a worker's TrainConfig)."""
        return TrainSettings(**{f.name: getattr(self, f.name) for f in fields(TrainSettings)})


def weight_bytes(precision: str, deepspeed: bool) -> int:
    """Bytes of one drafter weight as it trains and is saved: DeepSpeed's bf16 engine holds bf16
    weights (float32 master copies beside them); without DeepSpeed, bf16 is autocast over float32."""
    return nbytes(precision) if deepspeed else nbytes("fp32")


@dataclass(frozen=True, kw_only=True)
class TrainConfig(TrainSettings):
    """One training run: which drafter, which data, where to write, and the settings it trains with."""

    verifier: str
    backbone: str
    variant: str
    out_dir: str
    train_data: list  # [[store_root, key, [example ids] or None], ...]; root "online" = [online, corpus, ids]
    heldout_data: list = field(default_factory=list)
    grad_clip: float = 0.5
    vloss_weight: float = 1.0
    ploss_weight: float = 0.1
    topk_weight: float = 1.0
    feature_noise: bool = True
    draft_vocab: str | None = None  # vocabulary file (drafters.vocab.save_vocab); None = full vocabulary
    eval_depths: int = 3
    crash_after_epoch: int | None = None  # fault-injection for tests: raise after saving this epoch
    crash_at_step: int | None = None  # fault-injection for tests: raise after this optimizer step (fresh run)
    out_uri: str | None = None  # shared copy of out_dir (a URI); the Ray Train worker syncs epochs with it
    verifier_dtype: str | None = None  # the verifier's dtype in the worker (the profile's); None: its default
    # the DataSpec that selects the "online" entries' examples (features computed in the worker)
    online_spec: DataSpec | None = None
    aux_layers: tuple | None = None  # eagle3: the verifier layers it fuses (None: the reference's)

    RULES = {**TrainSettings.RULES, "backbone": one_of(*BACKBONES),
             "train_data": Rule("a non-empty list of data entries",
                                   lambda v: isinstance(v, (list, tuple)) and bool(v))}

    def __post_init__(self):
        super().__post_init__()
        self._check_backbone_options()

    def _check_backbone_options(self) -> None:
        """The feature backbones (EAGLE-2, HASS) choose their loss positions; EAGLE-3 trains on
        ``next`` ones and alone fuses aux layers."""
        if self.backbone not in FEATURE_BACKBONES and self.loss_mask != "next":
            raise ValueError(f"backbone {self.backbone} trains with loss_mask 'next' only, "
                             f"got {self.loss_mask!r}")
        if self.aux_layers is not None and self.backbone in FEATURE_BACKBONES:
            raise ValueError(f"aux_layers is for backbone eagle3, not {self.backbone!r}")
