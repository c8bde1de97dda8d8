"""Self-distilled training data (SpecForge's "regenerate" option): the assistant turns of the
training conversations are replaced by the verifier's own answers, so the drafter learns the
distribution it will be verified against instead of the dataset authors'.

- ``greedy`` decodes each assistant turn greedily; ``sample`` samples at T=1 (seeded per batch).
- Turns are regenerated in order: turn r sees the regenerated turns before it. A turn whose prompt
  already fills ``max_length`` keeps its original text (training truncates it away anyway); so does a
  turn the verifier answers with nothing but whitespace (counted in the stats).
- Batches are left-padded; a padded batch can part from an unpadded greedy decode at a near-tie.
- The result is cached by content key (verifier, corpus, example ids, max length, mode, seed) as one
  JSON file, written to a temp file and renamed: a second call runs no generation.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from common.atomic import write_text_atomic
from drafters.data.records import Conversation
from drafters.data.spec import DISTILL_MODES as MODES
from drafters.data.templating import prompt_ids
from drafters.features import content_key

# rows per generate call (measured against 8 and 64: docs/study.md "The demo's recipe"); part of the
# cache key, since padding can move a near-tie
BATCH = 32


@torch.no_grad()
def _generate(model, pad_id: int, prompts: list[list[int]], max_new: int, mode: str, seed: int,
              eos_ids) -> list[list[int]]:
    """New tokens of each prompt (left-padded batch), cut at the first end-of-turn id (kept)."""
    L = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), L), pad_id, dtype=torch.long)
    att = torch.zeros(len(prompts), L, dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, L - len(p):] = torch.tensor(p)
        att[b, L - len(p):] = 1
    if mode == "sample":
        torch.manual_seed(seed)
    out = model.generate(ids.to(model.device), attention_mask=att.to(model.device), max_new_tokens=max_new,
                         do_sample=mode == "sample", temperature=1.0 if mode == "sample" else None,
                         top_k=None,
                         top_p=None, pad_token_id=pad_id, eos_token_id=list(eos_ids))[:, L:].tolist()
    eos = set(eos_ids)
    cut = []
    for row in out:
        end = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
        cut.append(row[:end])
    return cut


def regenerate(model, tokenizer, eos_ids, convs: list[Conversation], max_length: int, mode: str,
               seed: int = 0,
               batch_size: int = BATCH, progress=None) -> tuple[list[Conversation], dict]:
    """The conversations with every assistant turn (within ``max_length``) answered by the verifier.
    Returns (conversations, stats)."""
    if mode not in MODES:
        raise ValueError(f"self_distill must be one of {list(MODES)} or null, got {mode!r}")
    turns = [list(c.turns) for c in convs]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else list(eos_ids)[0]
    eos = set(eos_ids)
    stats = {"mode": mode, "turns": 0, "regenerated": 0, "kept_past_max_length": 0, "kept_empty": 0,
             "new_tokens": 0}
    rounds = max(sum(r == "assistant" for r, _ in t) for t in turns) if turns else 0
    for r in range(rounds):
        todo = []  # (conversation, turn index, prompt ids)
        for ci, t in enumerate(turns):
            pos = [i for i, (role, _) in enumerate(t) if role == "assistant"]
            if r >= len(pos):
                continue
            stats["turns"] += 1
            ids = prompt_ids(tokenizer, [{"role": role, "content": c} for role, c in t[: pos[r]]])
            if len(ids) >= max_length:
                stats["kept_past_max_length"] += 1
                continue
            todo.append((ci, pos[r], ids))
        todo.sort(key=lambda x: len(x[2]))  # similar lengths together: less padding
        for j in range(0, len(todo), batch_size):
            batch = todo[j: j + batch_size]
            max_new = max_length - min(len(ids) for _, _, ids in batch)
            outs = _generate(model, pad, [ids for _, _, ids in batch], max_new, mode,
                             seed * 1_000_003 + r * 7919 + j,
                             eos_ids)
            for (ci, ti, ids), new in zip(batch, outs):
                text = tokenizer.decode([t for t in new[: max_length - len(ids)] if t not in eos],
                                        skip_special_tokens=True)
                if not text.strip():
                    stats["kept_empty"] += 1
                    continue
                turns[ci][ti] = ("assistant", text)
                stats["regenerated"] += 1
                stats["new_tokens"] += len(new)
            if progress:
                progress(f"self-distill turn {r + 1}/{rounds}", min(j + batch_size, len(todo)), len(todo))
    return [Conversation(c.id, f"{c.source}+distill-{mode}", tuple(t)) for c, t in zip(convs, turns)], stats


def distilled(model, tokenizer, eos_ids, verifier: str, corpus: str, convs: list[Conversation],
              max_length: int,
              mode: str, seed: int, root: str | os.PathLike, progress=None) -> list[Conversation]:
    """``regenerate`` through a cache file under ``root/distill/``; a hit needs no model."""
    key = content_key(verifier, f"{corpus}-distill-{mode}-{seed}-b{BATCH}", [c.id for c in convs], max_length)
    path = Path(root) / "distill" / f"{key}.json"
    if path.exists():
        rows = json.loads(path.read_text())["conversations"]
        return [Conversation(r["id"], r["source"], tuple((a, b) for a, b in r["turns"])) for r in rows]
    if model is None:
        raise FileNotFoundError(f"no self-distilled cache {path} and no verifier to build it")
    out, stats = regenerate(model, tokenizer, eos_ids, convs, max_length, mode, seed, progress=progress)
    write_text_atomic(path, json.dumps({"key": key, "stats": stats,
                 "conversations": [{"id": c.id, "source": c.source, "turns": c.turns} for c in out]}))
    return out
