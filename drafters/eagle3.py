"""The EAGLE-3 drafter (arXiv 2503.01840): three verifier layers fused by one linear layer, one
decoder layer whose attention reads [token embedding ; hidden state], its own final norm and LM head
over the reduced draft vocabulary.

    h_0      = fc(cat(f_a, f_b, f_c))                    f_* the verifier's hidden states (aux layers)
    x        = cat(input_layernorm(embed(token)), hidden_norm(h))     (2H: what q/k/v project)
    h'       = h + o_proj(attn(x));  h'' = h' + mlp(post_attention_layernorm(h'))
    logits   = lm_head(norm(h''))                         over the draft vocabulary (d2t maps to verifier ids)

Drafting step k+1 takes h'' of step k as its hidden state (``draft_step``): the drafter conditions
on its own previous output, never on a verifier feature it does not have. Training unrolls these
steps (drafters/train/eagle3.py). The verifier's embedding is passed in at run time, never stored.

``aux_layers`` are indices into ``output_hidden_states`` (0 = the embeddings, i = the input of
decoder layer i): the reference's (2, L // 2, L - 3) are the inputs of those layers, as in
SafeAILab/EAGLE, speculators' ``eagle_aux_hidden_state_layer_ids`` and vLLM.
"""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch
from torch import nn

from drafters.checkpoint_dir import load_weights, read_config_dict, write_checkpoint_dir
from drafters.config import DrafterBase
from drafters.model import DecoderLayer, Drafter, KVCache, RMSNorm, seeded
from drafters.vocab import d2t_of

BACKBONE = "eagle3"
FORMAT = "taskspec-eagle3-v1"  # config.json "format" of an eagle3 checkpoint (eagle2/hass: checkpoint.FORMAT)


def default_aux_layers(num_layers: int) -> tuple[int, int, int]:
    """The reference's three feature layers for a verifier of ``num_layers`` decoder layers."""
    return (2, num_layers // 2, num_layers - 3)


@dataclass(frozen=True, kw_only=True)
class Eagle3Config(DrafterBase):
    num_verifier_layers: int  # the verifier's decoder layers (aux layer indices are checked against it)
    aux_layers: tuple[int, ...]  # output_hidden_states indices, fused in this order
    ttt_steps: int = 7  # training-time test: drafting steps unrolled per training position
    ttt_decay: float = 0.8  # step k's loss weight is ttt_decay ** k
    backbone: str = BACKBONE

    KIND: ClassVar[str] = "eagle3"
    COUNTS: ClassVar[tuple[str, ...]] = DrafterBase.COUNTS + ("num_verifier_layers", "ttt_steps")

    def __post_init__(self):
        object.__setattr__(self, "aux_layers", tuple(self.aux_layers))
        if self.backbone != BACKBONE:
            raise ValueError(f"Eagle3Config is for backbone {BACKBONE!r}, got {self.backbone!r}")
        super().__post_init__()
        a = self.aux_layers
        if (not a or len(set(a)) != len(a)
                or any(not isinstance(i, int) or not 0 <= i <= self.num_verifier_layers for i in a)):
            raise ValueError(f"aux_layers must be distinct ints in [0, {self.num_verifier_layers}] "
                             f"(output_hidden_states indices of a {self.num_verifier_layers}-layer "
                             f"verifier), got {list(a)}")
        if not 0.0 < float(self.ttt_decay) <= 1.0:
            raise ValueError(f"ttt_decay must be in (0, 1], got {self.ttt_decay!r}")

    @property
    def head_size(self) -> int:
        """Rows of the drafter's LM head: the draft vocabulary, or the whole one."""
        return self.draft_vocab_size or self.vocab_size

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["aux_layers"] = list(self.aux_layers)
        return d

    @classmethod
    def for_verifier(cls, model, verifier: str, seed: int = 0, draft_vocab_size: int | None = None,
                     aux_layers: tuple[int, ...] | None = None, **kw) -> Eagle3Config:
        n = model.config.num_hidden_layers
        return cls(num_verifier_layers=n, aux_layers=tuple(aux_layers) if aux_layers is not None
                   else default_aux_layers(n), seed=seed, draft_vocab_size=draft_vocab_size,
                   **cls.verifier_fields(model, verifier), **kw)


class Eagle3Layer(DecoderLayer):
    """drafters/model.py's decoder layer whose q/k/v read 2H: the normed embedding and the normed
    hidden state. The residual stream is the hidden state (un-normed), as in the reference."""

    def __init__(self, cfg: Eagle3Config):
        super().__init__(cfg, in_width=2 * cfg.hidden_size)

    def _input_norms(self, cfg) -> None:
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, embeds, hidden, positions, mask, cache: KVCache | None = None, extra_kv=None):
        """embeds, hidden (B, T, H); positions (T,); mask (T, S) bool, True = may attend.

        extra_kv: (k, v) of shape (B, n_kv, P, hd) prepended to this call's keys (training-time test)."""
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)  # (B, T, 2H)
        return self.attend(x, hidden, positions, mask, cache, extra_kv)


class Eagle3Drafter(Drafter):
    def __init__(self, cfg: Eagle3Config):
        super().__init__()
        self.config = cfg
        self.fc = nn.Linear(len(cfg.aux_layers) * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.layer = Eagle3Layer(cfg)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.head_size, bias=False)
        self._register_draft_vocab(cfg.draft_vocab_size)

    def fuse(self, aux: torch.Tensor) -> torch.Tensor:
        """(B, T, A*H) verifier features of the aux layers, concatenated in order -> (B, T, H)."""
        return self.fc(aux.to(self.fc.weight.dtype))

    def forward(self, token_embeds, hidden, positions, mask, cache: KVCache | None = None, extra_kv=None):
        """-> the next hidden state (B, T, H) and this call's (k, v)."""
        return self.layer(token_embeds.to(hidden.dtype), hidden, positions, mask, cache=cache,
                          extra_kv=extra_kv)

    def forward_packed(self, token_embeds, hidden, positions, sizes: list[int], masks: list,
                       caches: list[KVCache]) -> torch.Tensor:
        """Several independent passes packed into one (token_embeds, hidden (T, H), positions (T,), each
        pass's rows in turn): pass b attends over its own ``caches[b]`` under ``masks[b]``
        (``FeatureDrafter.forward_packed``'s contract). Returns (T, H)."""
        lay = self.layer
        x = torch.cat([lay.input_layernorm(token_embeds.to(hidden.dtype)), lay.hidden_norm(hidden)], dim=-1)
        return lay.attend_packed(x[None], hidden[None], positions, sizes, masks, caches)[0]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(B, T, H) -> (B, T, N) over the draft vocabulary."""
        return self.lm_head(self.norm(hidden))

    def draft_step(self, token_embeds, hidden, positions, mask, cache: KVCache | None = None):
        """One drafting step: ``hidden`` is fc of the verifier's features (the first step after a
        verified token) or this drafter's own previous output. Returns (logits, next hidden)."""
        out, _ = self(token_embeds, hidden, positions, mask, cache=cache)
        return self.logits(out), out


def init_eagle3(cfg: Eagle3Config, draft_ids: torch.Tensor | None = None,
                lm_head_weight: torch.Tensor | None = None) -> Eagle3Drafter:
    """A seeded random drafter (same seed, same weights). ``draft_ids`` is required exactly when the
    config has a draft vocabulary; ``lm_head_weight`` (V, H), the verifier's head, initialises the
    drafter's own head with its rows of the draft vocabulary."""
    if (cfg.draft_vocab_size is None) != (draft_ids is None):
        raise ValueError("draft_ids must be given exactly when the config sets draft_vocab_size")
    if draft_ids is not None:
        ids = draft_ids.long()
        if ids.shape != (cfg.draft_vocab_size,) or not bool((ids[1:] > ids[:-1]).all()) \
                or int(ids[0]) < 0 or int(ids[-1]) >= cfg.vocab_size:
            raise ValueError(f"draft_ids must be {cfg.draft_vocab_size} sorted ids inside the vocabulary "
                             f"of {cfg.vocab_size}")
    if lm_head_weight is not None and tuple(lm_head_weight.shape) != (cfg.vocab_size, cfg.hidden_size):
        raise ValueError(f"lm_head_weight has shape {tuple(lm_head_weight.shape)}, "
                         f"expected {(cfg.vocab_size, cfg.hidden_size)}")
    model = seeded(cfg.seed, lambda: Eagle3Drafter(cfg))
    with torch.no_grad():
        if draft_ids is not None:
            model.d2t.copy_(d2t_of(draft_ids))
        if lm_head_weight is not None:
            w = lm_head_weight.detach().float()
            model.lm_head.weight.copy_(w if draft_ids is None else w[draft_ids.long()])
    return model


def is_eagle3_checkpoint(path: str | os.PathLike) -> bool:
    p = Path(path) / "config.json"
    return p.is_file() and json.loads(p.read_text()).get("format") == FORMAT


def save_eagle3(model: Eagle3Drafter, out_dir: str | os.PathLike, config: Eagle3Config | None = None) -> Path:
    """DIR/config.json + DIR/model.safetensors, written to a temp dir renamed into place. ``config``:
    the one to record (e.g. with the training history); default the model's own."""
    return write_checkpoint_dir(model, out_dir, FORMAT, config or model.config)


def load_eagle3(path: str | os.PathLike, device: str = "cpu", dtype=torch.float32) -> Eagle3Drafter:
    """An eagle3 checkpoint; refuses another format and a missing or unexpected weight."""
    model = Eagle3Drafter(Eagle3Config.from_dict(read_config_dict(path, FORMAT)))
    return load_weights(model, path).to(device=device, dtype=dtype).eval()
