"""Benchmark: what hedge's feedback costs on this machine (issue 64): tokens/s and feedback ms per step of
``single`` and ``hedge`` with each feedback (agreement, acceptance) and the bandit, then the rollout of
two drafters (acceptance) against the teacher-forced pass (agreement) per scored position.

    python experiments/bench_hedge_feedback.py [--temperatures 0,1] [--drafters DIR,DIR]

Without ``--drafters`` the two drafters are random (EAGLE-2 and HASS, seeds 0 and 1): they accept
almost nothing, so one position is scored a step (the cheapest case); the per-position rows say what
each further position adds. Timings share the machine with whatever else runs on it.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings

import torch

from decoding.config import DecodeConfig, TreeConfig
from decoding.drafting import agreement_together, rollout_together
from decoding.engine import SpeculativeDecoder
from decoding.runner import load_proposers
from decoding.verifier_pass import new_cache, prefill
from decoding.verifiers import load_verifier
from drafters.checkpoint import init_drafter, save_checkpoint
from drafters.config import DrafterConfig
from drafters.data.sources import load_benchmark
from drafters.data.templating import benchmark_prompt_ids

VERIFIER = "smollm2-135m-instruct"
TREE = TreeConfig(4, 4, 16)
ROWS = {"single": dict(strategy="single"), "hedge(step)": dict(strategy="hedge"),
        "hedge(normalhedge, acceptance)": dict(strategy="hedge", hedge_learner="normalhedge",
                                               hedge_feedback="acceptance", hedge_ties="stay"),
        "hedge(ucb)": dict(strategy="hedge", hedge_learner="ucb", hedge_ties="stay")}


def _setup(drafters: str | None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, tok = load_verifier(VERIFIER)
        prompts = load_benchmark("gsm8k")[0][:2] + load_benchmark("mt_bench")[0][:2]
    if drafters:
        dirs = drafters.split(",")
    else:
        root = tempfile.mkdtemp()
        dirs = [str(save_checkpoint(init_drafter(DrafterConfig.for_verifier(model, VERIFIER, b, seed=s)),
                                    f"{root}/{b}{s}")) for s, b in ((0, "eagle2"), (1, "hass"))]
    inputs = [benchmark_prompt_ids(tok, p, 0, []) for p in prompts]
    return model, tok, load_proposers(model, dirs, VERIFIER), inputs


def end_to_end(model, tok, props, inputs, temp: float) -> None:
    """Each row over the prompts twice (after one warm-up turn): tokens/s, tau, feedback per step."""
    for name, kw in ROWS.items():
        n = 1 if kw["strategy"] == "single" else 2
        cfg = DecodeConfig(max_new_tokens=32, tree=TREE, temperature=temp, **kw)
        dec = SpeculativeDecoder(model, props[:n], cfg, [tok.eos_token_id])
        dec.generate(inputs[0], seed_key="warm")
        toks = wall = fb = steps = 0
        for _ in range(2):
            for i, ids in enumerate(inputs):
                dec.start_prompt()
                r = dec.generate(ids, seed_key=f"p{i}")
                toks, wall = toks + len(r.output_token_ids), wall + r.wall_time_s
                fb += sum(s["t_feedback_s"] for s in r.steps)
                steps += len(r.steps)
        print(f"T={temp:g} {name}: {toks / wall:.2f} tokens/s, tau {toks / steps:.2f}, feedback "
              f"{1e3 * fb / steps:.2f} ms/step ({100 * fb / wall:.1f}% of wall)", flush=True)


def _median_ms(props, ids, feats, n, run) -> float:
    times = []
    for _ in range(15):
        for p in props:  # the state a draft leaves (its cache at the committed context)
            p.reset()
            p.draft(torch.tensor(ids[: n + 1]), feats[:n], TREE, 0.0)
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def per_position(model, props, inputs, temp: float) -> None:
    """Both drafters' rollout over d positions (lock step) against the teacher-forced pass over d tokens."""
    n = len(inputs[0])
    ids = inputs[0] + list(range(300, 306))
    feats, _ = prefill(model, new_cache(), ids)
    tokens = torch.tensor(ids)
    for d in (1, 2, 3, 4):
        roll = _median_ms(props, ids, feats, n,
                          lambda d=d: rollout_together(props, tokens, feats[: n + 5], n + 1, d, temp))
        agree = _median_ms(props, ids, feats, n,
                           lambda d=d: agreement_together(props, tokens[: n + 1 + d], feats[: n + d], n + 1))
        print(f"T={temp:g} d={d}: rollout of 2 drafters {roll:.2f} ms, agreement over {d} tokens "
              f"{agree:.2f} ms",
              flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--temperatures", default="0,1")
    ap.add_argument("--drafters", default=None,
                    help="two drafter checkpoint dirs, comma-separated (default: random)")
    args = ap.parse_args()
    model, tok, props, inputs = _setup(args.drafters)
    for temp in (float(t) for t in args.temperatures.split(",")):
        end_to_end(model, tok, props, inputs, temp)
        per_position(model, props, inputs, temp)


if __name__ == "__main__":
    main()
