"""Benchmark: every speedup is a ratio to transformers' ``generate`` measured in this process, on
the same prompts, verifier, dtype and threads (greedy at T=0, sampling at the same T otherwise).

Prints, in one run: ``generate``; the project's autoregressive loop; every strategy with the fixed
tree and (``--tree auto``) the fitted one; the oracle ceiling (a chain of the verifier's own
continuation, depths ``--oracle-depths``); and (``--micro``) verify ms per pass against the number
of nodes and draft ms per level of each drafter. Where the verifier takes the lean pass
(``cpu/lean_pass.py``), the autoregressive loop is timed a second time through transformers' forward
("autoregressive, hf pass"), so what the pass itself buys is separate from what speculation buys.

Every row is timed *paired*: before each prompt of a row, ``generate`` runs on that prompt again,
and the row's ratio is its tokens/s over those paired ``generate`` runs. A machine whose speed
drifts between rows (a shared VM moves by ~10% within minutes) then moves both sides of a ratio
together. ``--repeats R`` measures every row R times and prints the median ratio with its range.
At T=0 the ``same`` column counts the prompts whose output equals ``generate``'s token for token;
an output that parts from it is a near-tie when ``generate``'s top-2 logit gap where they part is
within the dtype's rounding noise (``verifiers.TIE_GAP``: 0.01 in float32, 0.5 in bf16), and a
MISMATCH (a bug) otherwise (``verifiers.compare_greedy``).
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
import time
from typing import Any

import torch

from decoding import cpu
from decoding.args import add_decode_args, decode_config
from decoding.drafting import draft_together
from decoding.timing import synced_now


def add_bench_args(p: argparse.ArgumentParser) -> None:
    add_decode_args(p)
    p.add_argument("--benchmarks", default="gsm8k,mt_bench", help="comma list; first turn of each prompt")
    p.add_argument("--n-prompts", type=int, default=2, help="prompts per benchmark")
    p.add_argument("--strategies", default="autoregressive,single,confidence,entropy,merged,merged-dedup",
                   help="comma list of strategies; 'single' drafts with the first --drafter, 'single@I' "
                        "with the I-th (from 0); 'posthoc': the study's post hoc router over the first two "
                        "(both generate, the higher mean path score is kept, the row pays both); "
                        "'hindsight': "
                        "the same keeping the higher tau (the oracle ceiling; neither is lossless at T>0)")
    p.add_argument("--oracle-depths", default="3,5,8", help="oracle chain depths ('' = none)")
    p.add_argument("--micro", action="store_true",
                   help="also time verify passes by node count and draft levels")
    p.add_argument("--repeats", type=int, default=1,
                   help="time every row this many times (median ratio, range)")
    p.set_defaults(fn=cmd_bench, max_new_tokens=64)


def hf_generate(model, ids: list[int], max_new: int, eos: list[int], temperature: float,
                seed: int) -> list[int]:
    """transformers' generate: greedy at T=0, else ancestral sampling from the full distribution."""
    from decoding.runner import generate_baseline

    return generate_baseline(model, eos, max_new, temperature, seed)(ids)[0]


@dataclasses.dataclass
class Timing:
    """One timed row: the decoder's totals and the paired ``generate`` runs on the same prompts."""

    toks: int = 0
    wall: float = 0.0
    calls: int = 0
    new: int = 0
    tree: float = 0.0
    t_draft: float = 0.0
    gen_toks: int = 0
    gen_wall: float = 0.0
    same: int = 0
    ties: int = 0  # outputs that part from generate's at a near-tie
    mismatches: int = 0  # ... and anywhere else
    prompts: int = 0
    checked: bool = False  # T=0: outputs compared with generate's

    @property
    def ratio(self) -> float:
        """tokens/s of the row over tokens/s of its paired generate runs."""
        return (self.toks / self.wall) / (self.gen_toks / self.gen_wall)

    @property
    def tau(self) -> float:
        """Tokens per verifier call (the first token, from the prefill, not counted)."""
        return self.new / max(self.calls, 1)


def time_row(make_decoder, inputs, baseline, refs=None, classify=None) -> Timing:
    """Per prompt: ``baseline(ids)`` (generate, timed), then ``make_decoder(pid, ids).generate``.
    ``refs`` (T=0): generate's outputs, for the ``same`` count; ``classify(ids, got, ref)`` names
    an output that differs ("near-tie" or "MISMATCH"), after the clock stops."""
    t = Timing()
    for pid, ids in inputs:
        ref, gen_s = baseline(ids)
        t.gen_toks, t.gen_wall = t.gen_toks + len(ref), t.gen_wall + gen_s
        dec = make_decoder(pid, ids)
        t0 = time.perf_counter()
        r = dec.generate(ids, seed_key=pid)  # its wall clock closes on a device sync
        t.wall += time.perf_counter() - t0
        t.toks += len(r.output_token_ids)
        t.calls += r.verifier_calls
        t.new += len(r.output_token_ids) - 1
        t.tree += sum(s["tree_size"] for s in r.steps)
        t.t_draft += sum(s["t_draft_s"] for s in r.steps)
        _tally(t, ids, r.output_token_ids, None if refs is None else refs[pid], classify)
        t.prompts += 1
    t.checked = refs is not None
    return t


def _tally(t: Timing, ids, out: list[int], ref: list[int] | None, classify) -> None:
    """Count one output against ``generate``'s: equal, or (with ``classify``) a near-tie or a mismatch."""
    if ref is not None and out == ref:
        t.same += 1
    elif ref is not None and classify is not None:
        kind = classify(ids, out, ref)
        t.ties += kind == "near-tie"
        t.mismatches += kind == "MISMATCH"


def posthoc_score(steps: list[dict]) -> float:
    """The study's code's post hoc router score of one generation (orchestrator/report/routers.py
    ``whole_confidence``, score "path"): the mean path score V over every drafted node of every step,
    accepted or not; 0 where nothing was drafted."""
    total = sum(sum(s["accepted_path_confidence"]) + s["offpath_confidence_sum"] for s in steps)
    nodes = sum(len(s["accepted_path_confidence"]) + s["offpath_nodes"] for s in steps)
    return total / nodes if nodes else 0.0


def time_posthoc(decoders, inputs, baseline, refs=None, classify=None, score=posthoc_score) -> Timing:
    """The post hoc router as the study's code ran it (not deployable: it sees finished generations):
    per prompt every ``single`` decoder generates, the one of the highest ``posthoc_score`` is kept
    (ties to the first), and the row pays the wall time of all of them. ``score=hindsight_score``:
    the hindsight oracle (the higher tau kept), a ceiling. At T>0 neither is lossless."""
    t = Timing()
    for pid, ids in inputs:
        ref, gen_s = baseline(ids)
        t.gen_toks, t.gen_wall = t.gen_toks + len(ref), t.gen_wall + gen_s
        runs = []
        for dec in decoders:
            t0 = time.perf_counter()
            runs.append(dec.generate(ids, seed_key=pid))
            t.wall += time.perf_counter() - t0
        r = max(runs, key=lambda x: score(x.steps))  # the first of equal scores
        t.toks += len(r.output_token_ids)
        t.calls += r.verifier_calls
        t.new += len(r.output_token_ids) - 1
        t.tree += sum(s["tree_size"] for s in r.steps)
        t.t_draft += sum(s["t_draft_s"] for x in runs for s in x.steps)
        _tally(t, ids, r.output_token_ids, None if refs is None else refs[pid], classify)
        t.prompts += 1
    t.checked = refs is not None
    return t


def hindsight_score(steps: list[dict]) -> float:
    """The hindsight oracle's score of one generation: its tau (tokens committed per verifier call)."""
    return sum(s["committed"] for s in steps) / len(steps) if steps else 0.0


# rows that choose between finished generations
AFTER = {"posthoc": posthoc_score, "hindsight": hindsight_score}


def parse_spec(spec: str) -> tuple[str, bool, int]:
    """A --strategies entry -> (strategy, merge dedup, first drafter index); refused with one clear line."""
    from decoding.strategies import STRATEGIES

    strat, dedup = (spec[:-6], True) if spec.endswith("-dedup") else (spec, False)
    first = 0
    if strat.startswith("single@"):
        if not strat[7:].isdigit():
            raise ValueError(f"--strategies entry {spec!r}: single@I takes a drafter index I >= 0")
        strat, first = "single", int(strat[7:])
    if strat not in STRATEGIES and strat not in AFTER:
        raise ValueError(f"--strategies entry {spec!r}: choose from {sorted(STRATEGIES) + list(AFTER)} "
                         "(merged-dedup, single@I)")
    return strat, dedup, first


def _tps(runs) -> float:
    """tokens/s over (token ids, seconds) runs of generate."""
    runs = list(runs)
    return sum(len(r) for r, _ in runs) / sum(s for _, s in runs)


def summarise(runs: list[Timing]) -> tuple[Timing, float, float]:
    """The run with the median ratio (lower median for an even count) and the ratios' min, max."""
    ranked = sorted(runs, key=lambda t: t.ratio)
    return ranked[(len(ranked) - 1) // 2], ranked[0].ratio, ranked[-1].ratio


HEADER = (f"{'':<26}{'tok/s':>8}{'vs gen':>9}{'range':>13}{'gen tok/s':>11}"
          f"{'tau':>7}{'tree':>7}{'draft%':>8}  same")


def same_text(t: Timing) -> str:
    """'6/6', or '4/6 +2 near-tie' and ', 1 MISMATCH' where outputs part from generate's."""
    if not t.checked:
        return "-"
    out = f"{t.same}/{t.prompts}"
    if t.ties:
        out += f" +{t.ties} near-tie"
    if t.mismatches:
        out += f", {t.mismatches} MISMATCH"
    return out


def _row(label: str, runs: list[Timing]) -> Timing:
    t, lo, hi = summarise(runs)
    spread = f"{lo:.2f}-{hi:.2f}" if len(runs) > 1 else "-"
    c = max(t.calls, 1)
    print(f"{label:<26}{t.toks / t.wall:8.1f}{t.ratio:8.2f}x{spread:>13}{t.gen_toks / t.gen_wall:11.1f}"
          f"{t.tau:7.2f}{t.tree / c:7.1f}{100 * t.t_draft / t.wall:8.1f}  {same_text(t)}", flush=True)
    return t


def micro(model, proposers, prompt_ids: list[int], cfg, reps: int = 7) -> None:
    """Verify ms per pass against nodes (a chain after a real prompt) and draft ms per level."""
    from decoding.tree import chain_tree
    from decoding.verifier_pass import keep_positions, new_cache, prefill, tree_forward

    cache = new_cache()
    feats, _ = prefill(model, cache, prompt_ids)
    n = len(prompt_ids) - 1
    keep_positions(cache, torch.arange(n))
    base, bound = None, None
    if model.device.type == "cpu":  # the machine, and the bound a one-token pass is held against
        rec = cpu.machine.record([m.weight.detach() for m in model.modules() if isinstance(m,
                torch.nn.Linear)])
        print(cpu.machine.describe(rec))
        bound = rec["sum_ms"]
        for rows in (1, 6, 16):
            print(f"  tuned forms at {rows:2d} rows: {cpu.machine.forms_summary(cpu.installed(model), rows)}")
    print(f"verify pass after a {n}-token prefix (median of {reps}):")
    for nodes in (0, 1, 2, 3, 5, 7, 9, 15, 23, 31):
        ts = []
        for _ in range(reps):
            t = chain_tree([list(range(100, 100 + nodes))]) if nodes else chain_tree([])
            t0 = synced_now(model.device)
            tree_forward(model, cache, n, prompt_ids[-1], t.tokens, t.parents, t.depths)
            ts.append(synced_now(model.device) - t0)
            keep_positions(cache, torch.arange(n))
        ms = 1000 * statistics.median(ts)
        base = base or ms
        vs_bound = f", {ms / bound:.2f}x the weights' plain sum" if bound else ""
        print(f"  {nodes + 1:3d} tokens: {ms:7.1f} ms  ({ms / base:.2f}x a one-token step{vs_bound})")
    toks = torch.tensor(prompt_ids)
    for p in proposers:
        for k, depth in ((cfg.top_k, cfg.depth), (1, 1)):
            ts = []
            for _ in range(reps):
                p.reset()
                catch_up = dataclasses.replace(cfg, top_k=k, depth=1, total_tokens=2)
                p.draft(toks, feats[:-1], catch_up, 0.0)
                t0 = synced_now(feats.device)
                shape = dataclasses.replace(cfg, top_k=k, depth=depth, total_tokens=max(cfg.total_tokens, 2))
                p.draft(toks, feats[:-1], shape, 0.0)
                ts.append(synced_now(feats.device) - t0)
            ms = 1000 * statistics.median(ts)
            vocab = p.head.size if hasattr(p, "head") else "full"
            print(f"  draft {p.name} (vocab {vocab}) top_k={k} depth={depth}: {ms:6.1f} ms per tree, "
                  f"{ms / depth:5.1f} ms per level")
    if len(proposers) > 1:  # routing and merged trees: every drafter in lock step, one head matmul per level
        ts = []
        for _ in range(reps):
            for p in proposers:
                p.reset()
            draft_together(proposers, toks, feats[:-1], dataclasses.replace(cfg, depth=1, total_tokens=2),
                           0.0)
            t0 = synced_now(feats.device)
            draft_together(proposers, toks, feats[:-1], cfg, 0.0)
            ts.append(synced_now(feats.device) - t0)
        ms = 1000 * statistics.median(ts)
        print(f"  draft all {len(proposers)} drafters in lock step top_k={cfg.top_k} depth={cfg.depth}: "
              f"{ms:6.1f} ms per step, {ms / cfg.depth:5.1f} ms per level")


@dataclasses.dataclass
class BenchRun:
    """What every row of one ``bench`` run shares: the flags, the verifier and its drafters, the
    prompts, the base decoding config, and (``reference_runs``) ``generate`` and its outputs."""

    args: argparse.Namespace
    model: Any
    tok: Any
    eos: list[int]
    proposers: list
    prompts: list
    inputs: list  # (prompt id, first-turn token ids)
    base: Any  # DecodeConfig
    lean: bool  # the verifier takes the lean pass (cpu/lean_pass.py)
    run_gen: Any = None  # ids -> (generate's tokens, seconds)
    refs: dict | None = None  # prompt id -> generate's tokens
    gap: float = 0.0  # the dtype's near-tie logit gap (verifiers.TIE_GAP)
    cal_inputs: list | None = None  # held-out prompts for --tree auto, drawn once

    def classify(self, ids, got, ref):
        from common.verifiers import compare_greedy

        return compare_greedy(self.model, ids, got, ref, self.gap)[0]

    def timed(self, make_decoder, label: str) -> None:
        """Time one row ``--repeats`` times (``time_row``) and print it."""
        refs = self.refs if self.base.temperature == 0 else None
        runs = [time_row(make_decoder, self.inputs, self.run_gen, refs, self.classify)
                for _ in range(self.args.repeats)]
        _row(label, runs)


def _drafter_dirs(args, model, name: str) -> list[str]:
    """``--drafter`` dirs, topped up to two with randomly initialised drafters (noted on stdout)."""
    drafters = list(args.drafter)
    if len(drafters) < 2:
        from drafters.checkpoint import init_drafter, save_checkpoint
        from drafters.config import DrafterConfig

        tmp = tempfile.mkdtemp(prefix="bench-drafters-")
        for s in range(len(drafters), 2):
            cfg = DrafterConfig.for_verifier(model, name, "eagle2", seed=s)
            drafters.append(str(save_checkpoint(init_drafter(cfg), f"{tmp}/random-seed{s}")))
        print(f"note: {2 - len(args.drafter)} randomly initialised drafter(s) used "
              "(acceptance ~1: measures overhead)")
    return drafters


def open_bench(args) -> BenchRun:
    """Load the verifier, the drafters and the prompts; print the run's settings."""
    import warnings

    from common.verifiers import eos_token_ids, resolve
    from decoding.runner import default_threads, load_proposers
    from decoding.verifiers import load_verifier
    from drafters.data.records import BenchmarkPrompt
    from drafters.data.sources import load_benchmark
    from drafters.data.templating import benchmark_prompt_ids

    default_threads()
    name = resolve(args.verifier).name
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, tok = load_verifier(args.verifier, dtype=args.dtype)
    eos = eos_token_ids(model, tok)
    proposers = load_proposers(model, _drafter_dirs(args, model, name), name)
    prompts: list[BenchmarkPrompt] = []
    for b in args.benchmarks.split(","):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            prompts += load_benchmark(b)[0][: args.n_prompts]
    inputs = [(p.id, benchmark_prompt_ids(tok, p, 0, [])) for p in prompts]
    run = BenchRun(args, model, tok, eos, proposers, prompts, inputs, decode_config(args),
                   cpu.use_lean(model))
    base = run.base
    print(f"verifier {name} ({model.dtype}, {torch.get_num_threads()} threads; "
          f"{'lean pass' if run.lean else 'transformers forward'}); {len(inputs)} prompts "
          f"({args.benchmarks}); "
          f"max_new_tokens {base.max_new_tokens}; T={base.temperature}; tree top_k={base.tree.top_k} "
          f"depth={base.tree.depth} total_tokens={base.tree.total_tokens}; drafters "
          f"{[p.name for p in proposers]}")
    return run


def reference_runs(run: BenchRun) -> None:
    """Warm up, then ``generate``'s reference outputs (the ``same`` column compares with them);
    print its speed, what the columns mean, and the table's header."""
    from common.verifiers import TIE_GAP
    from decoding.runner import generate_baseline

    model = run.model
    inputs = run.inputs
    args = run.args
    run.run_gen = generate_baseline(model, run.eos, run.base.max_new_tokens, run.base.temperature, args.seed)
    run.run_gen(inputs[0][1][:8])  # warm-up (first calls allocate)
    if cpu.installed(model):  # stock kernels, for reference; ratios are kernel-neutral
        with cpu.matmul_disabled():
            stock = [run.run_gen(ids) for _, ids in inputs]
    ref_runs = {pid: run.run_gen(ids) for pid, ids in inputs}
    run.refs = {pid: r for pid, (r, _) in ref_runs.items()}
    print(f"generate (transformers): {_tps(ref_runs.values()):.1f} tok/s", end="")
    if cpu.installed(model):
        print(f"; with stock F.linear {_tps(stock):.1f} tok/s. Both share "
              f"the verifier's row-aware matmuls (decoding/cpu/, {cpu.status()}), so every ratio "
              f"below is kernel-neutral", end="")
    run.gap = gap = TIE_GAP[str(model.dtype).removeprefix("torch.")]
    repeats = f"; median of {args.repeats} repeats, 'range' their min-max" if args.repeats > 1 else ""
    print(".\nEvery row is paired: generate runs again before each of its prompts ('gen tok/s'), and 'vs "
          "gen' "
          "is the row over those runs" + repeats + (
              ". 'same': outputs equal to generate's; 'near-tie': parts from it where generate's top-2 "
              "logit "
              f"gap is <= {gap} ({model.dtype} noise); a MISMATCH is a bug" if run.base.temperature == 0
              else "."))
    print(HEADER)


def bench_posthoc(run: BenchRun, spec: str = "posthoc") -> None:
    """The ``posthoc`` (``hindsight``) row: the first two drafters' ``single`` decoders, ``time_posthoc``."""
    from decoding.engine import SpeculativeDecoder

    cfg = dataclasses.replace(run.base, strategy="single")
    decs = [SpeculativeDecoder(run.model, [p], cfg, run.eos) for p in run.proposers[:2]]
    refs = run.refs if run.base.temperature == 0 else None
    runs = [time_posthoc(decs, run.inputs, run.run_gen, refs, run.classify, AFTER[spec])
            for _ in range(run.args.repeats)]
    _row(f"{spec} {cfg.tree.top_k}/{cfg.tree.depth}/{cfg.tree.total_tokens}", runs)


def _auto_shape(run: BenchRun, spec: str, props: list, cfg):
    """``--tree auto``: the tree fitted for this entry on held-out prompts of the scored tasks."""
    from decoding.autotree import auto_tree, calibration_inputs

    benches = run.args.benchmarks.split(",")  # held-out prompts of the scored tasks
    run.cal_inputs = run.cal_inputs or calibration_inputs(run.tok, max(1, 2 // len(benches)), benches,
                                                          exclude={p.id for p in run.prompts})
    choice = auto_tree(run.model, props, cfg.strategy, run.eos, run.cal_inputs, cfg.merge_dedup,
                       cfg.routing_granularity)
    print(f"  {spec}: {choice.describe()}")
    return choice.tree


def bench_spec(run: BenchRun, spec: str) -> None:
    """The rows of one ``--strategies`` entry: its fixed tree, the fitted one (``--tree auto``), and
    for ``autoregressive`` on the lean pass the same loop through transformers' forward."""
    from decoding.engine import SpeculativeDecoder

    if spec in AFTER:
        bench_posthoc(run, spec)
        return
    strat, dedup, first = parse_spec(spec)
    n = {"autoregressive": 0, "single": 1, "depth_adaptive": 3, "hedge": len(run.proposers)}.get(strat, 2)
    props = run.proposers[first : first + n]
    cfg = dataclasses.replace(run.base, strategy=strat, merge_dedup=dedup)
    shapes = [("", cfg.tree)]
    if run.args.tree_mode == "auto" and strat != "autoregressive":
        shapes.append((" auto", _auto_shape(run, spec, props, cfg)))
    for suffix, shape in shapes:
        dec = SpeculativeDecoder(run.model, props, dataclasses.replace(cfg, tree=shape), run.eos)
        label = (spec if strat == "autoregressive"
                 else f"{spec}{suffix} {shape.top_k}/{shape.depth}/{shape.total_tokens}")
        run.timed(lambda pid, ids, dec=dec: dec, label)
    if strat == "autoregressive" and run.lean:  # attribution: the same loop through transformers' forward
        with cpu.lean_disabled(run.model):
            run.timed(lambda pid, ids, dec=dec: dec, "autoregressive, hf pass")


def bench_oracle(run: BenchRun) -> None:
    """The oracle ceiling: a chain of the loop's own greedy continuation, at each ``--oracle-depths``."""
    from decoding.config import TreeConfig
    from decoding.engine import SpeculativeDecoder
    from decoding.oracle import OracleChainProposer

    # the oracle proposes the loop's own greedy continuation (untimed here): in float32 that is
    # generate's (the `same` column), in bf16 it may part from it at a near-tie, after which
    # generate's continuation would be a wrong guess at every step
    model, eos = run.model, run.eos
    own = SpeculativeDecoder(model, [], dataclasses.replace(run.base, strategy="autoregressive"), eos)
    truth = {pid: own.generate(ids, seed_key=pid).output_token_ids for pid, ids in run.inputs}
    for depth in [int(d) for d in run.args.oracle_depths.split(",")]:
        cfg = dataclasses.replace(run.base, strategy="single", tree=TreeConfig(1, depth, depth + 1))
        run.timed(lambda pid, ids, cfg=cfg: SpeculativeDecoder(
            model, [OracleChainProposer(len(ids), truth[pid])], cfg, eos), f"oracle chain depth {depth}")


def cmd_bench(args) -> int:
    """python -m decoding bench: the setup, ``generate``'s references, a row per strategy, the
    oracle rows (T=0) and ``--micro``'s timings."""
    if args.repeats < 1:
        raise SystemExit(f"--repeats must be >= 1, got {args.repeats}")
    for spec in args.strategies.split(","):
        parse_spec(spec)  # before any model loads
    run = open_bench(args)
    reference_runs(run)
    for spec in args.strategies.split(","):
        bench_spec(run, spec)
    if args.oracle_depths and run.base.temperature == 0:
        bench_oracle(run)
    if args.micro:
        micro(run.model, run.proposers, run.inputs[0][1], run.base.tree)
    return 0
