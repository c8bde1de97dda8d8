"""What one drafter training run is: ``TrainConfig``, a frozen dataclass validated once when it is
built. Torch-free, so the driver builds it without importing torch and it crosses Ray as itself.

A data entry (``train_data``, ``heldout_data``) is ``[store_root, cache_key, example ids or None]``,
optionally with a fourth item naming one shard of that cache (a rank's own, drafters/shards.py);
an entry whose root is in ``ONLINE_ROOTS`` is ``[root, corpus, ids]`` and its features are computed
by the verifier inside the training worker (``online_spec`` selects the examples).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .config import BACKBONES, FEATURE_BACKBONES

PRECISIONS = ("fp32", "bf16")  # train.precision: the drafter's weights (DeepSpeed) or compute (autocast)
MASK_MODES = ("next", "reference")  # loss positions (drafters/losses.py ``align``)
ONLINE_ROOTS = ("online", "online-heldout")  # data entries whose features the verifier computes in the worker


@dataclass(frozen=True)
class TrainConfig:
    verifier: str
    backbone: str
    variant: str
    out_dir: str
    train_data: list  # [[store_root, key, [example ids] or None], ...]; root "online" = [online, corpus, ids]
    heldout_data: list = field(default_factory=list)
    epochs: int = 1
    lr: float = 3e-5
    batch_size: int = 8
    grad_accum: int = 1
    warmup_steps: int = 0
    lr_schedule: str = "linear"  # linear: warm up, then decay linearly to 0 (EAGLE/HASS); constant
    grad_clip: float = 0.5
    grad_clip_mode: str = "value"  # value: clamp each gradient entry (EAGLE/HASS); norm: global norm
    seed: int = 0
    hass_steps: int = 3
    vloss_weight: float = 1.0
    ploss_weight: float = 0.1
    topk_weight: float = 1.0
    topk_from: float = 0.5  # HASS two-stage schedule: the top-K term joins after this fraction of the steps
    feature_noise: bool = True
    draft_vocab: str | None = None  # vocabulary file (drafters.vocab.save_vocab); None = full vocabulary
    bucket: bool = True  # length-bucketed batches (little padding); False = batches in stream order
    loss_mask: str = "next"  # next: token t+1 is the assistant's (decode-time); reference: EAGLE/HASS's
    deepspeed: bool = True
    zero_stage: int = 1
    precision: str = "fp32"  # one of PRECISIONS; the drafter's inputs are cast to it too
    eval_depths: int = 3
    crash_after_epoch: int | None = None  # fault-injection for tests: raise after saving this epoch
    crash_at_step: int | None = None  # fault-injection for tests: raise after this optimizer step (fresh run)
    checkpoint_every: int | None = None  # also checkpoint every N optimizer steps inside an epoch
    keep_checkpoints: int | None = None  # epoch checkpoints kept (None: all)
    max_seconds: float | None = None  # stop the epoch early (smoke profiles); None = full epochs
    out_uri: str | None = None  # shared copy of out_dir (a URI); the Ray Train worker syncs epochs with it
    verifier_dtype: str | None = None  # the verifier's dtype in the worker (the profile's); None: its default
    online_spec: dict | None = None  # DataSpec fields for "online" entries (features computed in the worker)
    aux_layers: tuple | None = None  # eagle3: the verifier layers it fuses (None: the reference's)

    def __post_init__(self):
        if self.backbone not in BACKBONES:
            raise ValueError(f"backbone must be one of {list(BACKBONES)}, got {self.backbone!r}")
        if self.epochs < 1 or self.batch_size < 1 or self.grad_accum < 1:
            raise ValueError("epochs, batch_size and grad_accum must be >= 1")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.zero_stage not in (0, 1, 2):
            raise ValueError(f"zero_stage must be 0, 1 or 2, got {self.zero_stage} (ZeRO-3 is refused: "
                             "held-out evaluation and saving run on rank 0, which under ZeRO-3 holds a shard "
                             "of each weight)")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {list(PRECISIONS)}, got {self.precision!r}")
        if not self.train_data:
            raise ValueError("train_data is empty")
        if self.lr_schedule not in ("linear", "constant"):
            raise ValueError(f"lr_schedule must be linear or constant, got {self.lr_schedule!r}")
        if self.grad_clip_mode not in ("value", "norm"):
            raise ValueError(f"grad_clip_mode must be value or norm, got {self.grad_clip_mode!r}")
        self._check_backbone_options()
        if not 0.0 <= self.topk_from <= 1.0:
            raise ValueError(f"topk_from must be in [0, 1], got {self.topk_from}")
        for k in ("checkpoint_every", "keep_checkpoints"):
            if getattr(self, k) is not None and getattr(self, k) < 1:
                raise ValueError(f"{k} must be None or >= 1, got {getattr(self, k)}")

    def _check_backbone_options(self) -> None:
        """The feature backbones (EAGLE-2, HASS) choose their loss positions; EAGLE-3 trains on
        ``next`` ones and alone fuses aux layers."""
        if self.loss_mask not in MASK_MODES:
            raise ValueError(f"loss_mask must be one of {list(MASK_MODES)}, got {self.loss_mask!r}")
        if self.backbone not in FEATURE_BACKBONES and self.loss_mask != "next":
            raise ValueError(f"backbone {self.backbone} trains with loss_mask 'next' only, "
                             f"got {self.loss_mask!r}")
        if self.aux_layers is not None and self.backbone in FEATURE_BACKBONES:
            raise ValueError(f"aux_layers is for backbone eagle3, not {self.backbone!r}")
