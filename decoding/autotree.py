"""``tree: auto``: the tree shape that maximises expected tokens per second on this machine.

Three measurements, then a pure choice (as Sequoia and OPT-Tree fit trees to hardware):

1. ``measure_verify_costs``: ms per verifier pass against the number of tokens fed (a few timed
   passes after a real-length prefix, made non-decreasing, each capturing the features the
   drafters read (EAGLE-3's aux layers or the last hidden state); cached per verifier, dtype, device,
   threads, machine, matmul kernel, verifier pass and capture, when the timings repeat).
2. ``calibrate``: decode a few calibration prompts at T=0 with a large tree per candidate top_k
   (1, 2, 4) and record, per step, every node's drafter, depth, path score and whether its whole
   path matches the verifier's argmax chain, plus the draft time per level. Because greedy
   acceptance does not depend on the tree, the acceptance length of any smaller tree of the same
   top_k (depth <= D, the best M-1 nodes by score: exactly what EAGLE-2's rerank keeps) is read
   off these records without decoding again.
3. ``choose``: expected tokens/s = tau(shape) / (draft + verify(nodes + 1) + bookkeeping) for every
   shape; the best one, unless none beats autoregressive decoding (1 / verify(1)), in which case
   the smallest tree (one draft token) is used and the choice says so.

Calibration is per task: the grid calibrates each composition on held-out prompts of the cell's
own benchmark (a math drafter on GSM8K affords a deeper tree than on MT-Bench), and the bench on
the benchmarks it scores.

Limits: acceptance is calibrated at T=0 (at T>0 the sampled walk accepts differently); routing
keeps the drafter the large tree's rule chose; the calibration prompts are not the evaluated ones.
"""
from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass, field

import torch

from common.caches import add_to_json_cache, cache_dir, load_json_cache
from decoding import cpu, timing
from decoding.accept import greedy_match
from decoding.config import TreeConfig
from decoding.drafting import feature_layers
from decoding.timing import synced_now
from decoding.tree import chain_tree

CAL_TREES = {1: TreeConfig(1, 8, 9), 2: TreeConfig(2, 6, 24), 4: TreeConfig(4, 6, 32)}
TOTALS = (2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32)
VERIFY_SIZES = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 20, 24, 32, 48, 64)
CACHE = cache_dir() / "verify_cost.json"
_SESSION: dict[str, dict[int, float]] = {}  # costs from untrustworthy timings: this process only


@dataclass
class Calibration:
    """Per candidate top_k: a list of steps, each a list of (owner, depth, score, ok) nodes, the
    drafter the strategy chose (-1 = all) and draft ms per level per drafter."""

    steps: dict = field(default_factory=dict)  # k -> [[(owner, depth, score, ok), ...], ...]
    chosen: dict = field(default_factory=dict)  # k -> [owner or -1 per step]
    draft_ms_level: dict = field(default_factory=dict)  # k -> ms per level per drafter
    bookkeeping_ms: float = 0.0


@dataclass(frozen=True)
class Choice:
    tree: TreeConfig
    tokens_per_s: float
    ar_tokens_per_s: float
    tau: float
    pays: bool
    table: list  # [(top_k, depth, total, tau, expected tok/s)] best first

    def describe(self) -> str:
        t = self.tree
        head = f"tree auto: top_k={t.top_k} depth={t.depth} total_tokens={t.total_tokens}"
        if not self.pays:
            return (f"{head} (no tree is expected to pay on this machine: best expected "
                    f"{self.table[0][4]:.1f} tok/s vs autoregressive {self.ar_tokens_per_s:.1f}; using the "
                    "smallest tree)")
        return (f"{head}: expected tau {self.tau:.2f}, {self.tokens_per_s:.1f} tok/s vs autoregressive "
                f"{self.ar_tokens_per_s:.1f} ({self.tokens_per_s / self.ar_tokens_per_s:.2f}x)")


def monotone(costs: dict[int, float]) -> dict[int, float]:
    """Costs made non-decreasing in the token count: each point becomes the minimum over itself and
    every larger count. A pass over more tokens never costs less, so a point above a larger one is a
    timing spike (the VM's noise is one-sided), and the choice must not steer around it."""
    out, low = {}, float("inf")
    for n in sorted(costs, reverse=True):
        low = min(low, costs[n])
        out[n] = low
    return dict(sorted(out.items()))


def _interp(costs: dict[int, float], n: int) -> float:
    xs = sorted(costs)
    if n in costs:
        return costs[n]
    if n > xs[-1]:  # extrapolate from the last two points
        a, b = xs[-2], xs[-1]
        return costs[b] + (costs[b] - costs[a]) / (b - a) * (n - b)
    hi = next(x for x in xs if x > n)
    lo = max(x for x in xs if x < n)
    return costs[lo] + (costs[hi] - costs[lo]) * (n - lo) / (hi - lo)


def tau_of(steps: list, chosen: list, depth: int, total: int, merged: bool, n_drafters: int) -> float:
    """Mean committed tokens per step of the sub-tree (depth <= ``depth``, best ``total``-1 nodes
    by score per drafter tree) of every calibration step."""
    if not steps:
        return 1.0
    acc = []
    for nodes, ch in zip(steps, chosen):
        best = 0
        for owner in range(n_drafters):
            if not merged and ch >= 0 and owner != ch:
                continue
            mine = sorted((n for n in nodes if n[0] == owner and n[1] <= depth),
                          key=lambda n: -n[2])[: total - 1]
            best = max([best] + [n[1] for n in mine if n[3]])
        acc.append(1 + best)
    return statistics.mean(acc)


def choose(cal: Calibration, verify_ms: dict[int, float], merged: bool, n_drafters: int) -> Choice:
    """The shape with the highest expected tokens/s (pure: no model needed)."""
    ar = 1000.0 / verify_ms[1]
    table = []
    for k, cfg in CAL_TREES.items():
        if k not in cal.steps:
            continue
        for depth in range(1, cfg.depth + 1):
            totals = [depth + 1] if k == 1 else [m for m in TOTALS if m <= cfg.total_tokens]
            for total in totals:
                tau = tau_of(cal.steps[k], cal.chosen[k], depth, total, merged, n_drafters)
                nodes = (total - 1) * (n_drafters if merged else 1)
                ms = cal.draft_ms_level[k] * depth * n_drafters + _interp(verify_ms,
                        nodes + 1) + cal.bookkeeping_ms
                table.append((k, depth, total, tau, 1000.0 * tau / ms))
    if not table:
        raise ValueError("calibration recorded no steps")
    table.sort(key=lambda r: -r[4])
    best = table[0]
    pays = best[4] > ar
    if not pays:  # the cheapest speculation: one draft token
        best = min(table, key=lambda r: (r[1], r[2], r[0]))
    k, depth, total, tau, tps = best
    return Choice(TreeConfig(k, depth, total), tps, ar, tau, pays, table)


def _device_key(device: torch.device) -> str:
    """The machine part of the key: on a CPU the matmul machinery's (CPU model, threads, kernel build);
    elsewhere the accelerator's name and torch, so a GPU worker never builds the CPU kernel."""
    if device.type == "cpu":
        return cpu.machine_key()
    real = device.type == "cuda" and torch.cuda.is_initialized()  # (not the test suite's CPU stand-in)
    name = torch.cuda.get_device_name(device) if real else device.type
    return f"{name}|torch={torch.__version__}"


def _cache_key(model, layers: tuple[int, ...] | None = None) -> str:
    """Verifier, dtype, device, machine and matmul kernel, which pass runs (lean or transformers')
    and, for EAGLE-3 drafters, the aux layers the passes capture (the last hidden state: no suffix)."""
    lean = "lean" if cpu.use_lean(model) else "hf"
    name = getattr(model, "verifier_name", type(model).__name__)
    aux = "" if layers is None else "|aux=" + ",".join(map(str, layers))
    return f"{name}|{model.dtype}|{model.device}|{_device_key(model.device)}|{lean}{aux}"


@torch.no_grad()
def measure_verify_costs(model, prompt_ids: list[int], reps: int = 5, use_cache: bool = True,
                         layers: tuple[int, ...] | None = None) -> dict[int, float]:
    """ms per verifier pass feeding n tokens (a chain) after ``prompt_ids`` (median of ``reps``),
    each pass capturing the features the drafters read, as decoding does (``layers``: EAGLE-3's aux
    layers, concatenated; None: the last hidden state), and cached under that capture.

    Cached only when repeatable, as the CPU matmul tuner's tables are: a pass size whose timings
    spread by more than ``timing.MAX_SPREAD`` of their median is timed once more, and costs where
    that second timing still spreads as much, or timed while this process got under
    ``timing.MIN_CPU_SHARE`` of its threads' CPU (on the CPU), serve this process only."""
    from decoding.verifier_pass import commit_path, new_cache, prefill, tree_forward

    key = _cache_key(model, layers)
    disk = load_json_cache(CACHE) if use_cache else {}
    if key in disk:
        return monotone({int(n): v for n, v in disk[key].items()})
    if use_cache and key in _SESSION:
        return _SESSION[key]
    cache = new_cache()
    prefill(model, cache, prompt_ids, layers)
    dev = model.device
    n = len(prompt_ids) - 1
    commit_path(cache, n, [])

    def time_size(size: int) -> list[float]:
        t = chain_tree([list(range(100, 100 + size - 1))])
        ts = []
        for _ in range(reps + 1):
            t0 = synced_now(dev)  # a device clock: kernels queued before and inside the pass count
            tree_forward(model, cache, n, prompt_ids[-1], t.tokens, t.parents, t.depths, layers)
            ts.append(synced_now(dev) - t0)
            commit_path(cache, n, [])
        return ts[1:]

    def measure():
        out, worst = {}, 0.0
        for size in VERIFY_SIZES:
            ts = time_size(size)
            if timing.spread(ts) > timing.MAX_SPREAD:  # one spike (a VM's noise is one-sided): again
                ts = time_size(size)
            out[size], worst = 1000 * statistics.median(ts), max(worst, timing.spread(ts))
        return out, worst

    (out, worst), share = timing.cpu_share(measure)
    out = monotone(out)
    why = None
    if worst > timing.MAX_SPREAD:
        why = f"timings spread by {worst:.0%} of their median (limit {timing.MAX_SPREAD:.0%})"
    elif dev.type == "cpu" and share < timing.MIN_CPU_SHARE:
        why = f"this process got {share:.0%} of its threads' CPU time (other processes held the cores)"
    if use_cache and why is None:
        add_to_json_cache(CACHE, key, out)
    elif use_cache:
        print(f"[tree auto] verify costs not cached, {why}; measured again next run", file=sys.stderr)
        _SESSION[key] = out
    return out


def calibrate(model, proposers, strategy: str, eos: list[int], inputs: list[list[int]],
              max_new_tokens: int = 32,
              dedup: bool = False, granularity: str = "step") -> Calibration:
    """Decode ``inputs`` (templated prompts) at T=0 with each calibration tree; record every step."""
    from decoding.engine import DecodeConfig, SpeculativeDecoder

    cal = Calibration()
    book = []
    for k, tree in CAL_TREES.items():
        steps = []
        chosen = []
        draft_s = 0.0
        levels = 0
        cfg = DecodeConfig(strategy=strategy, temperature=0.0, max_new_tokens=max_new_tokens, tree=tree,
                           merge_dedup=dedup, routing_granularity=granularity)
        dec = SpeculativeDecoder(model, proposers, cfg, eos)

        def observe(tree_, target, prop, steps=steps, chosen=chosen):  # called in this iteration only
            ok = greedy_match(tree_.tokens, tree_.parents, target)
            steps.append([(int(o), int(d), float(s), bool(g)) for o, d, s, g in
                          zip(tree_.owner.tolist(), tree_.depths.tolist(), tree_.path_logp.tolist(),
                              ok.tolist())])
            chosen.append(int(prop.chosen))

        dec.observer = observe
        for i, ids in enumerate(inputs):
            r = dec.generate(ids, seed_key=f"calibration/{i}")
            n_drafting = 1 if strategy == "single" else len(proposers)
            draft_s += sum(s["t_draft_s"] for s in r.steps)
            levels += len(r.steps) * tree.depth * n_drafting
            book += [s["t_bookkeeping_s"] for s in r.steps]
        cal.steps[k], cal.chosen[k] = steps, chosen
        cal.draft_ms_level[k] = 1000 * draft_s / max(levels, 1)
    cal.bookkeeping_ms = 1000 * statistics.median(book) if book else 0.0
    return cal


def calibration_inputs(tokenizer, per_benchmark: int = 1, benchmarks=("gsm8k", "mt_bench"),
                       exclude=(), system: str | None = None) -> list[list[int]]:
    """First turns of the LAST ``per_benchmark`` prompts of each benchmark whose ids are not in
    ``exclude`` (the evaluated ones; evaluation subsamples are seeded draws, the bench takes the
    first prompts): real prompts of the evaluated domain, kept apart from what is scored. Only when
    a benchmark is evaluated in full are its last prompts used anyway (acceptance then comes from
    prompts that are also scored; the tree shape is all it decides)."""
    import warnings

    from drafters.data.sources import load_benchmark
    from drafters.data.templating import benchmark_prompt_ids

    out, exclude = [], set(exclude)
    for b in benchmarks:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            prompts = load_benchmark(b)[0]
        held_out = [p for p in prompts if p.id not in exclude] or prompts
        out += [benchmark_prompt_ids(tokenizer, p, 0, [], system) for p in held_out[-per_benchmark:]]
    return out


def auto_tree(model, proposers, strategy: str, eos: list[int], inputs: list[list[int]], dedup: bool = False,
              granularity: str = "step", max_new_tokens: int = 32, use_cache: bool = True) -> Choice:
    """Measure, calibrate and choose; ``inputs`` are calibration prompts (token ids)."""
    if strategy == "autoregressive" or not proposers:
        raise ValueError("tree auto needs a speculative strategy with drafters")
    costs = measure_verify_costs(model, inputs[0], use_cache=use_cache, layers=feature_layers(proposers))
    cal = calibrate(model, proposers, strategy, eos, inputs, max_new_tokens, dedup, granularity)
    n = 1 if strategy == "single" else len(proposers)
    return choose(cal, costs, strategy == "merged", n)

