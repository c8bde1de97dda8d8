"""Run prompts (multi-turn) through the speculative decoder and write Parquet atomically."""
from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import torch

from common.atomic import atomic_file
from decoding.cpu import install
from decoding.drafting import Eagle3Proposer, FeatureDrafterProposer, composition_features
from decoding.engine import DecodeConfig, SpeculativeDecoder, run_alone
from decoding.timing import synced_now
from drafters.checkpoint import load_any, load_any_config
from drafters.checkpoint_dir import check_weights
from drafters.data.records import BenchmarkPrompt
from drafters.data.templating import benchmark_prompt_ids
from drafters.eagle3 import Eagle3Config


class PromptFileError(ValueError):
    pass


def read_prompts(path: str | os.PathLike) -> list[BenchmarkPrompt]:
    """Read {"id": ..., "turns": [...]} JSON lines; any bad line is an error naming its number."""
    p = Path(path)
    if not p.is_file():
        raise PromptFileError(f"prompts file {p} does not exist or is not a file")
    out, seen = [], set()
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise PromptFileError(f"cannot read prompts file {p}: {e}") from e
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise PromptFileError(f"{p}:{no}: not valid JSON ({e.msg})") from e
        if not isinstance(row, dict) or "id" not in row or "turns" not in row:
            raise PromptFileError(f"{p}:{no}: expected an object with 'id' and 'turns'")
        turns = row["turns"]
        if not isinstance(turns, list) or not turns:
            raise PromptFileError(f"{p}:{no}: 'turns' must be a non-empty list of strings")
        for k, t in enumerate(turns):
            if not isinstance(t, str) or not t.strip():
                raise PromptFileError(f"{p}:{no}: turn {k} is empty or not a string")
        pid = str(row["id"])
        if pid in seen:
            raise PromptFileError(f"{p}:{no}: duplicate id {pid!r}")
        seen.add(pid)
        out.append(BenchmarkPrompt(pid, str(row.get("benchmark", "custom")), tuple(turns),
                                   row.get("reference")))
    if not out:
        raise PromptFileError(f"prompts file {p} holds no prompts")
    return out


def _aux_layers(cfg) -> tuple[int, ...] | None:
    return tuple(cfg.aux_layers) if isinstance(cfg, Eagle3Config) else None


def check_drafter_files(paths: list[str], verifier_name: str) -> None:
    """Cheap checks before any model loads: checkpoint exists, config parses, verifier id matches, the
    weights file reads (its header and size), and the drafters read one kind of verifier features (no
    EAGLE-3 drafter beside EAGLE-2/HASS ones)."""
    cfgs = [load_any_config(path) for path in paths]
    for path, cfg in zip(paths, cfgs):
        if cfg.verifier != verifier_name:
            raise ValueError(f"drafter {path} was trained for verifier {cfg.verifier!r}, not "
                             f"{verifier_name!r}")
        check_weights(path)
    composition_features([(path, _aux_layers(cfg)) for path, cfg in zip(paths, cfgs)])


def _check_eagle3(cfg: Eagle3Config, model, verifier: str, path: str) -> None:
    """Refuse an eagle3 drafter built for another verifier (id, hidden size, vocabulary, layers)."""
    c, problems = model.config, []
    if cfg.verifier != verifier:
        problems.append(f"trained for verifier {cfg.verifier!r}, not {verifier!r}")
    if cfg.hidden_size != c.hidden_size:
        problems.append(f"hidden size {cfg.hidden_size} != verifier's {c.hidden_size}")
    if cfg.vocab_size != c.vocab_size:
        problems.append(f"vocabulary {cfg.vocab_size} != verifier's {c.vocab_size}")
    if cfg.num_verifier_layers != c.num_hidden_layers:
        problems.append(f"{cfg.num_verifier_layers} verifier layers != verifier's {c.num_hidden_layers}")
    if problems:
        raise ValueError(f"eagle3 drafter {path} does not match the verifier: " + "; ".join(problems))


def load_proposers(model, paths: list[str], verifier_name: str) -> list[FeatureDrafterProposer]:
    """One proposer per checkpoint, of its backbone: an EAGLE-3 checkpoint (``drafters.eagle3``'s
    format) gives an ``Eagle3Proposer``, an EAGLE-2/HASS one a ``FeatureDrafterProposer``."""
    out = []
    for i, path in enumerate(paths):
        cfg = load_any_config(path)
        e3 = isinstance(cfg, Eagle3Config)
        if e3:
            _check_eagle3(cfg, model, verifier_name, path)
        else:
            cfg.check_compatible(model, verifier_name)
        drafter = load_any(path, device=str(model.device), dtype=model.dtype)
        if model.device.type == "cpu":
            install(drafter)  # a draft level feeds top_k rows: the small-row matmul path (decoding/cpu/)
        # run/<drafter>/final
        name = Path(path).parent.name if Path(path).name == "final" else Path(path).name
        embed = model.get_input_embeddings()
        out.append(Eagle3Proposer(drafter, embed, name, i) if e3 else
                   FeatureDrafterProposer(drafter, embed, model.lm_head, name, i))
    return out


def check_prompt_lengths(tokenizer, model, prompts: list[BenchmarkPrompt], cfg: DecodeConfig,
                         system: str | None = None) -> None:
    limit = getattr(model.config, "max_position_embeddings", None)
    if not limit:
        return
    for p in prompts:
        n = len(benchmark_prompt_ids(tokenizer, p, 0, [], system))
        need = n + cfg.max_new_tokens * len(p.turns) + sum(len(tokenizer(t)["input_ids"])
                                                           for t in p.turns[1:]) + 64
        if need > limit:
            raise ValueError(f"prompt {p.id!r}: {n} tokens + {cfg.max_new_tokens} new per turn may exceed "
                             "the "
                             f"verifier's context of {limit} positions (no truncation policy: shorten it)")


def decode_prompt(decoder: SpeculativeDecoder, tokenizer, prompt: BenchmarkPrompt, baseline=None,
                  system: str | None = None):
    """All turns of one prompt: answer turn 1, append it as the assistant message, then turn 2
    (``system``: the evaluation's system turn before the first user turn, ``eval.system_prompt``).

    ``baseline(ids) -> (token ids, seconds)``, if given, also runs on every turn's input (the
    report's speed baseline, transformers' generate, timed on the same inputs in the same process).
    """
    turns = prompt_turns(decoder, tokenizer, prompt, baseline, system)
    return run_alone(turns, decoder.model, decoder.layers)


def prompt_turns(decoder: SpeculativeDecoder, tokenizer, prompt: BenchmarkPrompt, baseline=None,
                 system: str | None = None):
    """``decode_prompt`` as a coroutine of its turns' verify requests (``SpeculativeDecoder.turn``),
    so decoding/batch.py can verify several prompts' trees in one pass; returns the same results."""
    answers, results = [], []
    decoder.start_prompt()
    for turn in range(len(prompt.turns)):
        ids = benchmark_prompt_ids(tokenizer, prompt, turn, answers, system)
        res = yield from decoder.turn(ids, seed_key=f"{prompt.id}/{turn}")
        if baseline is not None:
            res.baseline = baseline(ids)
        text = tokenizer.decode(res.output_token_ids, skip_special_tokens=True)
        answers.append(text)
        results.append((turn, res, text))
    return results


def generate_baseline(model, eos: list[int], max_new_tokens: int, temperature: float, seed: int):
    """transformers' generate, timed: greedy at T=0, full-distribution sampling at T>0."""
    def run(ids: list[int]):
        kw = {"do_sample": False} if temperature == 0 else {"do_sample": True, "temperature": temperature,
                                                            "top_k": 0, "top_p": 1.0}
        torch.manual_seed(seed)
        t0 = synced_now(model.device)
        out = model.generate(torch.tensor([ids], device=model.device), max_new_tokens=max_new_tokens,
                             eos_token_id=eos,
                             pad_token_id=eos[0], attention_mask=torch.ones(1, len(ids), dtype=torch.long,
                                     device=model.device), **kw)
        seconds = synced_now(model.device) - t0
        return out[0, len(ids):].tolist(), seconds

    return run


def prompt_rows(prompt: BenchmarkPrompt, results, extra: dict | None = None) -> tuple[list[dict], list[dict]]:
    """One row per (prompt, turn), and one per verifier call."""
    rows, steps = [], []
    for turn, res, text in results:
        chosen = Counter(s["chosen_drafter"] for s in res.steps if s["chosen_drafter"] >= 0)
        row = {
            "prompt_id": prompt.id, "turn": turn, "output_token_ids": res.output_token_ids,
            "output_text": text,
            "verifier_calls": res.verifier_calls, "new_tokens": res.new_tokens,
            "acceptance_length": res.acceptance_length, "wall_time_s": res.wall_time_s,
            "mean_tree_size": (sum(s["tree_size"] for s in res.steps) / len(res.steps)) if res.steps else 0.0,
            "routing_choice": chosen.most_common(1)[0][0] if chosen else -1,
            "t_draft_s": sum(s["t_draft_s"] for s in res.steps),
            "t_verify_s": sum(s["t_verify_s"] for s in res.steps),
            "generate_tokens": len(res.baseline[0]) if res.baseline else None,
            "generate_wall_time_s": res.baseline[1] if res.baseline else None,
            "generate_matches": (res.baseline[0] == res.output_token_ids) if res.baseline else None,
        }
        rows.append({**(extra or {}), **row})
        steps += [{**(extra or {}), "prompt_id": prompt.id, "turn": turn, **s} for s in res.steps]
    return rows, steps


def write_parquet_atomic(rows: list[dict], path: str | os.PathLike, schema=None) -> Path:
    """Write rows to Parquet through a temp file in the same folder, then rename into place."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    from decoding.schema import to_table

    table = pa.Table.from_pylist(rows, schema=schema) if schema is not None else to_table(rows)
    with atomic_file(out) as tmp:
        pq.write_table(table, tmp)
    return out


def default_threads() -> None:
    """Use every core this process may run on for the verifier's matmuls (torch defaults may be
    lower inside Ray workers); ``TASKSPEC_THREADS=N`` sets N instead (e.g. a test worker's share)."""
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    text = os.environ.get("TASKSPEC_THREADS")
    if text is not None:
        if not text.isdigit() or int(text) < 1:
            raise ValueError(f"TASKSPEC_THREADS must be a positive integer, got {text!r}")
        torch.set_num_threads(int(text))
    elif torch.get_num_threads() < n:
        torch.set_num_threads(n)
