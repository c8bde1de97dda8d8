"""Decode many prompts in lock step: B prompts, one verifier pass a step and one drafter pass a draft
level for all of them.

An evaluation actor on a GPU is host-bound at batch 1: the verifier's forward spends most of its time
launching ~30 layers of small kernels, and reads the weights once per prompt. Here B prompts (B row
decoders sharing the verifier and the drafters' weights, each with its own drafter state, strategy
and seeded sampler) each draft their own tree, in lock step (each draft level's drafter pass and
head matmul once for every row: ``rounds.run_round``); ONE verifier pass (decoding/batch_pass.py)
verifies every tree, each against its own cache; each prompt accepts and commits on its own. A prompt that
finishes leaves its row to the next prompt in the queue (continuous batching), so rows never wait
for the slowest prompt of a batch. Each prompt decodes as it does alone: its drafts depend only on
its own state, its sampler is seeded by its own (prompt, turn) key, and the verifier's logits of its
rows are its own pass's up to the rounding of matmuls over more rows (~1e-4 on SmolLM2). So it is
lossless as a pass alone is: greedy tokens equal to ``generate``'s, and at T > 0 the verifier's
distribution (tests/test_batch_decoding.py); a T > 0 sample may still differ from the one the
prompt draws alone, where that rounding moves a draw across a boundary of the inverse CDF.

What changes is the timing: a step's ``t_verify_s`` is the batched pass, shared by its prompts, and a
turn's wall time spans the other rows' drafting (a request's latency under batching). The speed
baseline (transformers' generate) runs after the batch, so no prompt's wall time holds it.
"""
from __future__ import annotations

import copy
from collections import deque
from collections.abc import Callable

import torch

from decoding.batch_pass import forward_many
from decoding.engine import SpeculativeDecoder
from decoding.rounds import DraftRound, run_round
from decoding.runner import prompt_turns
from decoding.timing import Clock
from drafters.data.templating import benchmark_prompt_ids


def row_decoders(decoder: SpeculativeDecoder, rows: int) -> list[SpeculativeDecoder]:
    """``decoder`` and ``rows - 1`` more like it: the same verifier, config and drafter weights, each
    with its own proposers' state (a shallow copy, reset) and its own strategy."""
    if not isinstance(rows, int) or rows < 1:
        raise ValueError(f"rows must be a positive int, got {rows!r}")
    out = [decoder]
    for _ in range(rows - 1):
        props = [copy.copy(p) for p in decoder.proposers]
        for p in props:
            p.reset()
        row = SpeculativeDecoder(decoder.model, props, decoder.cfg, sorted(decoder.eos))
        row.observer = decoder.observer
        out.append(row)
    return out


def decode_prompts(decoders: list[SpeculativeDecoder], tokenizer, prompts: list, system: str | None = None,
                   on_done: Callable[[int, list], None] | None = None) -> list[list]:
    """``decode_prompt``'s results for every prompt, in order, decoding ``len(decoders)`` prompts at a
    time with one verifier pass per step for all of them. ``on_done(i, results)`` as prompt i ends."""
    jobs = [lambda d, p=p: prompt_turns(d, tokenizer, p, None, system) for p in prompts]
    return _drive(decoders, jobs, on_done)


def decode_turns(decoders: list[SpeculativeDecoder], inputs: list[tuple[list[int], str]],
                 draft_rows: bool = True) -> list:
    """``generate(ids, seed_key)``'s TurnResult for every (ids, seed_key), in order, ``len(decoders)``
    turns at a time with one verifier pass per step for all of them (``draft_rows``: and one drafter
    pass per draft level, else each row drafts by itself)."""
    return _drive(decoders, [lambda d, a=a: d.turn(*a) for a in inputs], draft_rows=draft_rows)


def _answer_drafts(live: dict, rows: list[int], together: bool) -> list:
    """The answers to the draft rounds ``live[r][2]`` of ``rows``, per row: one ``run_round`` for all
    of them (``together``: each drafter's pass and each head's matmul once for every row), or one each."""
    if not together:
        return [run_round(live[r][2].calls) for r in rows]
    sizes = [len(live[r][2].calls) for r in rows]
    answers = run_round([c for r in rows for c in live[r][2].calls])
    out, at = [], 0
    for n in sizes:
        out.append(answers[at : at + n])
        at += n
    return out


@torch.no_grad()
def _drive(decoders: list[SpeculativeDecoder], jobs: list[Callable], on_done=None,
           draft_rows: bool = True) -> list:
    """Run ``job(row decoder)`` coroutines (``SpeculativeDecoder.turn``'s requests) on the rows, one
    verifier pass per step for every live row, and (``draft_rows``) one answer per draft round for
    every row drafting (rows draft in lock step: every row's step starts after the same verifier
    pass, and rows of one tree shape have as many rounds); a row whose job ends takes the next job."""
    model, layers = decoders[0].model, decoders[0].layers
    if any(d.model is not model or d.layers != layers for d in decoders):
        raise ValueError("batched decoders must share one verifier and read the same verifier features")
    queue, results = deque(enumerate(jobs)), [None] * len(jobs)
    live: dict[int, list] = {}  # row -> [job index, its coroutine, its pending VerifyRequest]

    def advance(row: int, sent=None) -> None:
        """Send the row's job its last pass (``sent``); a job that ends leaves the row to the next."""
        while True:
            if row not in live:
                if not queue:
                    return
                i, job = queue.popleft()
                live[row] = [i, job(decoders[row]), None]
            i, coro, _ = live[row]
            try:
                live[row][2] = coro.send(sent)
                return
            except StopIteration as done:
                results[i], sent = done.value, None
                del live[row]
                if on_done is not None:
                    on_done(i, done.value)

    for row in range(len(decoders)):
        advance(row)
    clock = Clock(model.device)
    while live:
        drafting = [r for r in sorted(live) if isinstance(live[r][2], DraftRound)]
        if drafting:  # rows waiting for their verifier pass wait for the others' drafts
            for r, answers in zip(drafting, _answer_drafts(live, drafting, draft_rows)):
                advance(r, answers)
            continue
        rows = sorted(live)
        v0 = clock.mark()
        outs = forward_many(model, [live[r][2] for r in rows], layers)
        v1 = clock.mark()
        for r, (f, logits) in zip(rows, outs):
            advance(r, (f, logits, v0, v1))
    return results


def add_baselines(results: list, tokenizer, prompt, baseline, system: str | None = None) -> None:
    """Time ``baseline`` (transformers' generate) on each turn's input of a decoded prompt, after the
    batch: the inputs are rebuilt from the decoded answers, as ``decode_prompt`` built them."""
    answers = []
    for turn, res, text in results:
        res.baseline = baseline(benchmark_prompt_ids(tokenizer, prompt, turn, answers, system))
        answers.append(text)


def time_batches(decoder: SpeculativeDecoder, inputs: list[tuple[list[int], str]], batches: list[int],
                 now: Callable[[], float], rows_draft_alone: bool = False) -> list[dict]:
    """Decode ``inputs`` (ids, seed_key) one at a time and then ``B`` at a time for each B in
    ``batches``: per B the seconds, new tokens, tokens/s in all, and how many outputs equal the
    one-at-a-time ones (``now``: a clock that waits for the device, timing.synced_now).
    ``rows_draft_alone``: each B also with the rows drafting one by one (``drafts: "alone"``), so what
    drafting the rows together buys is read in the same run."""
    rows, alone = [], None
    modes = [(1, True)] + [(b, t) for b in batches if b != 1 for t in ((False, True) if rows_draft_alone
                                                                       else (True,))]
    for b, together in modes:
        t0 = now()
        got = (decode_turns(row_decoders(decoder, b), inputs, draft_rows=together) if b > 1
               else [decoder.generate(ids, seed_key=key) for ids, key in inputs])
        s = now() - t0
        alone = alone or [r.output_token_ids for r in got]
        new = sum(r.new_tokens for r in got)
        rows.append({"batch": b, "drafts": "together" if together else "alone", "runs": len(got), "s": s,
                     "new_tokens": new, "tokens_per_s": new / s, "steps": sum(r.verifier_calls for r in got),
                     "same_as_alone": sum(r.output_token_ids == a for r, a in zip(got, alone))})
    return rows
