"""Drafter configuration: everything needed to rebuild a drafter, stored as config.json.

``DrafterBase`` holds what every backbone's drafter shares (the verifier's sizes it is built for,
its seed, its draft vocabulary) and validates it once; ``DrafterConfig`` (EAGLE-2 / HASS, below)
and ``drafters.eagle3.Eagle3Config`` add their own fields. Both are frozen and keyword-built.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar

FEATURE_BACKBONES = ("eagle2", "hass")  # DrafterConfig's (drafters/model.py's FeatureDrafter)
BACKBONES = FEATURE_BACKBONES + ("eagle3",)  # what trains (EAGLE-3: drafters/eagle3.py's own config)


@dataclass(frozen=True, kw_only=True)
class DrafterBase:
    """The fields and checks every drafter config shares. Embedding and LM head are the verifier's
    (EAGLE-3 stores its own head over the draft vocabulary); the sizes are the verifier's."""

    verifier: str
    hidden_size: int
    vocab_size: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    seed: int = 0
    draft_vocab_size: int | None = None  # reduced draft vocabulary (d2t stored with the weights); None = full
    training: dict = field(default_factory=dict)  # data variant, epochs, merge recipe, ...

    KIND: ClassVar[str] = "drafter"  # what from_dict's error calls this config
    COUNTS: ClassVar[tuple[str, ...]] = ("hidden_size", "vocab_size", "num_attention_heads",
                                         "num_key_value_heads", "intermediate_size")  # positive ints

    def __post_init__(self):
        for name in self.COUNTS:
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if self.draft_vocab_size is not None and not (
                isinstance(self.draft_vocab_size, int) and 1 <= self.draft_vocab_size <= self.vocab_size):
            raise ValueError(f"draft_vocab_size must be an int in [1, vocab_size={self.vocab_size}] or None, "
                             f"got {self.draft_vocab_size!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError("hidden_size must be divisible by num_attention_heads")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be divisible by num_key_value_heads")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict):
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known - {"format"}
        if unknown:
            raise ValueError(f"unknown {cls.KIND} config keys: {sorted(unknown)}")
        return cls(**{k: v for k, v in d.items() if k in known})

    @staticmethod
    def verifier_fields(model, verifier: str) -> dict:
        """The shared fields of a drafter for the Hugging Face verifier ``model`` named ``verifier``."""
        c = model.config
        rope = getattr(c, "rope_theta", None)
        if rope is None:
            rope = (getattr(c, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
        return {"verifier": verifier, "hidden_size": c.hidden_size, "vocab_size": c.vocab_size,
                "num_attention_heads": c.num_attention_heads,
                "num_key_value_heads": getattr(c, "num_key_value_heads", c.num_attention_heads),
                "intermediate_size": c.intermediate_size, "rms_norm_eps": getattr(c, "rms_norm_eps", 1e-5),
                "rope_theta": float(rope)}


@dataclass(frozen=True, kw_only=True)
class DrafterConfig(DrafterBase):
    """EAGLE-style one-layer feature drafter (identical architecture for EAGLE-2 and HASS).

    Embedding and LM head are the verifier's; only the fc and the decoder layer are stored.
    """

    backbone: str

    def __post_init__(self):
        if self.backbone not in FEATURE_BACKBONES:
            hint = " (eagle3 drafters are configured by drafters.eagle3.Eagle3Config)" \
                if self.backbone == "eagle3" else ""
            raise ValueError(f"backbone must be one of {list(FEATURE_BACKBONES)}, "
                             f"got {self.backbone!r}{hint}")
        super().__post_init__()

    @classmethod
    def for_verifier(cls, model, verifier: str, backbone: str, seed: int = 0,
                     draft_vocab_size: int | None = None) -> DrafterConfig:
        return cls(backbone=backbone, seed=seed, draft_vocab_size=draft_vocab_size,
                   **cls.verifier_fields(model, verifier))

    def check_compatible(self, model, verifier: str) -> None:
        """Refuse a drafter built for another verifier (hidden size, vocabulary, id)."""
        c = model.config
        problems = []
        if self.hidden_size != c.hidden_size:
            problems.append(f"hidden size {self.hidden_size} != verifier's {c.hidden_size}")
        if self.vocab_size != c.vocab_size:
            problems.append(f"vocabulary {self.vocab_size} != verifier's {c.vocab_size}")
        if self.verifier != verifier:
            problems.append(f"trained for verifier {self.verifier!r}, not {verifier!r}")
        if problems:
            raise ValueError("drafter does not match the verifier: " + "; ".join(problems))
