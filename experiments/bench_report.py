"""Benchmark: the whole report (experiments/report.py) on synthetic traces shaped like the paper's run,
in a child process: its wall time and peak memory (ru_maxrss), then a line fitted through the sizes
measured and extrapolated to the paper's step rows (an extrapolation, not a measurement).

python experiments/bench_report.py [--rows 1250000 2500000 5000000] [--pass-rows N] [--shard-size N]
                                   [--code DIR] [--compare-with DIR] [--keep DIR]

The synthetic run has the paper profile's 872 eval cells (experiments/profiles/paper.yaml), each
benchmark's prompts scaled by rows / 58 M (at least 2 a benchmark), 20 prompts a unit, MT-Bench's
two turns, the paper's step rows per turn (58 M over its turns, drawn 0.5x-1.5x) and every trace
column the eval workers write (decoding/engine.py, decoding/runner.py, workers/eval_worker.py), one
Parquet file per unit and kind under hive partitions, recorded in a manifest with the eval plan.
``--code DIR``: the report of another checkout (e.g. a ``git archive`` of the commit before the
report read steps in passes, docs/report.md). ``--compare-with DIR``: build the report with this
checkout and with DIR's and say whether every output file is byte-identical.
"""
from __future__ import annotations

import argparse
import filecmp
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PAPER_STEP_ROWS = 58_000_000  # issue #55's count of the paper grid's step rows
DEPTH = 6  # the paper's tree depth: accepted paths of 0..6 draft tokens
CHILD = ("import sys, time; sys.path.insert(0, sys.argv[1]); "
         "from orchestrator.report.build import build_report; "
         "t = time.time(); kw = {'pass_rows': int(sys.argv[3])} if sys.argv[3] != '-' else {}; "
         "build_report(sys.argv[2], **kw); print(f'{time.time() - t:.1f}')")


def _list(pa, np, lengths, values):
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))


def _steps(pa, np, rng, n_drafters: int, per_turn: list[int], total_tokens: int) -> dict:
    """Step columns for turns of ``per_turn`` steps each (one row per verifier call)."""
    n = sum(per_turn)
    L = rng.integers(0, DEPTH + 1, n)  # accepted draft tokens
    rej = (L < DEPTH) & (rng.random(n) < 0.9)  # a first rejected child
    m = int(L.sum())
    da = np.ones(m + int(rej.sum()), bool)
    da[(np.cumsum(L + rej) - 1)[rej]] = False  # [True] * L + [False] where rejected
    per_d = np.full(n, n_drafters)
    nan_rej = lambda x: np.where(rej, x, np.nan)  # noqa: E731 (a one-line column helper)
    return {
        "step": np.concatenate([np.arange(s) for s in per_turn]), "tree_size": np.full(n, total_tokens),
        "committed": L + 1, "accepted_depth": L, "chosen_drafter": rng.integers(0, n_drafters, n),
        "accepted_owner": rng.integers(0, n_drafters, n), "accepted_owner_mask": np.ones(n, np.int64),
        "drafter_mean_confidence": _list(pa, np, per_d, rng.random(n * n_drafters)),
        "drafter_mean_entropy": _list(pa, np, per_d, rng.random(n * n_drafters) * 3),
        "drafter_mean_node_confidence": _list(pa, np, per_d, rng.random(n * n_drafters)),
        "accepted_draft_entropy": _list(pa, np, L, rng.random(m) * 2),
        "accepted_draft_confidence": _list(pa, np, L, rng.random(m)),
        "accepted_verifier_entropy": _list(pa, np, L, rng.random(m) * 2),
        "accepted_path_confidence": _list(pa, np, L, rng.random(m)),
        "offpath_confidence_sum": rng.random(n) * 5, "offpath_nodes": total_tokens - L,
        "rejected_draft_entropy": nan_rej(rng.random(n) * 3),
        "rejected_draft_confidence": nan_rej(rng.random(n)),
        "rejected_verifier_entropy": nan_rej(rng.random(n) * 3),
        "depth_accept": _list(pa, np, L + rej, da),
        "drafter_agreement": _list(pa, np, np.zeros(n, int), np.zeros(0)),
        "t_draft_s": rng.random(n) * 0.01, "t_verify_s": rng.random(n) * 0.04, "t_feedback_s": np.zeros(n),
        "t_bookkeeping_s": rng.random(n) * 0.001}


def _unit(pa, np, rng, cell, prompts: list[str], turns: int, mean_steps: float, tags: dict) -> tuple:
    """(prompt rows, step rows) of one unit as Arrow tables, as the driver writes them."""
    auto = cell.strategy == "autoregressive"
    nd = max(1, len(cell.drafters))
    pids = [p for p in prompts for _ in range(turns)]
    tn = [t for _ in prompts for t in range(turns)]
    per_turn = [int(x) for x in rng.integers(int(mean_steps * 0.5), int(mean_steps * 1.5) + 1, len(pids))]
    s = _steps(pa, np, rng, nd, per_turn, 1 if auto else cell.total_tokens)
    ends = np.cumsum(per_turn)
    new = np.add.reduceat(s["committed"], ends - np.array(per_turn))  # tokens per turn
    calls = np.array(per_turn)
    wall = np.add.reduceat(s["t_draft_s"] + s["t_verify_s"], ends - calls)
    gen = auto  # the autoregressive cell times transformers' generate
    prompt_cols = {
        "prompt_id": pids, "turn": tn,
        "output_token_ids": _list(pa, np, new, rng.integers(0, 128_000, int(new.sum()))),
        "output_text": ["synthetic"] * len(pids), "verifier_calls": calls, "new_tokens": new,
        "acceptance_length": new / calls, "wall_time_s": wall,
        "mean_tree_size": np.full(len(pids), 1.0 * s["tree_size"][0]),
        "routing_choice": (rng.integers(0, nd, len(pids)) if cell.strategy in ("confidence", "entropy")
                           else -np.ones(len(pids), int)),
        "t_draft_s": np.add.reduceat(s["t_draft_s"], ends - calls),
        "t_verify_s": np.add.reduceat(s["t_verify_s"], ends - calls),
        "generate_tokens": new if gen else [None] * len(pids),
        "generate_wall_time_s": wall * 1.5 if gen else [None] * len(pids),
        "generate_matches": [True] * len(pids) if gen else [None] * len(pids)}
    step_cols = {"prompt_id": [p for p, k in zip(pids, per_turn) for _ in range(k)],
                 "turn": [t for t, k in zip(tn, per_turn) for _ in range(k)], **s}
    return (_table(pa, prompt_cols, len(pids), tags), _table(pa, step_cols, len(step_cols["turn"]), tags))


def _table(pa, cols: dict, n: int, tags: dict):
    from decoding.schema import KNOWN

    cols = {**cols, **{k: [v] * n for k, v in tags.items()}}
    arrays = {k: v if isinstance(v, pa.Array) else pa.array(v, type=KNOWN.get(k)) for k, v in cols.items()}
    return pa.table(arrays)


def make_run(root: Path, rows: int, seed: int = 0, shard_size: int | None = None, select=None) -> dict:
    """A run directory of synthetic traces shaped like the paper's (module docstring); returns its
    shape. ``select``: keep only the eval cells it accepts (a smaller run with the same columns)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from orchestrator.grid import BENCHMARK_SIZES, cell_prompts, eval_cells
    from orchestrator.plan.sizing import load_profile
    from orchestrator.profile import profile_dict

    p = load_profile("paper")
    every = eval_cells(p)
    turns = {b: 2 if b == "mt_bench" else 1 for b in BENCHMARK_SIZES}
    size = {c: cell_prompts(p, c) or BENCHMARK_SIZES[c.benchmark] for c in every}
    mean_steps = PAPER_STEP_ROWS / sum(size[c] * turns[c.benchmark] for c in every)  # the paper's, per turn
    cells = [c for c in every if select is None or select(c)]
    scale, rng = rows / PAPER_STEP_ROWS, np.random.default_rng(seed)
    shard = shard_size or p.eval.shard_size
    plan = {}
    units = 0
    n_steps = 0
    for cell in cells:
        n = max(2, round(size[cell] * scale))
        prompts = [f"{cell.benchmark}/{i}" for i in range(n)]
        part = f"backbone={cell.backbone}/benchmark={cell.benchmark}/temperature={cell.temperature:g}"
        for s in range(0, n, shard):
            key = "eval-" + hashlib.sha256(f"{cell.key}/{s}".encode()).hexdigest()[:32]
            d = cell.record  # (its "tree": the tree mode, the trace column's name)
            tags = {k: d[k] for k in ("drafter", "strategy", "routing_granularity", "merge_dedup",
                                      "total_tokens", "budget_matched", "tree")} | cell.decode.columns()
            tags |= {"tree_shape": f"10/{DEPTH}/{cell.total_tokens}", "cell_key": cell.key, "unit_key": key,
                     "invocation": "bench"}
            pt, st = _unit(pa, np, rng, cell, prompts[s : s + shard], turns[cell.benchmark], mean_steps, tags)
            files = [f"traces/prompts/{part}/{key}.parquet", f"traces/steps/{part}/{key}.parquet"]
            for f, t in zip(files, (pt, st)):
                (root / f).parent.mkdir(parents=True, exist_ok=True)
                pq.write_table(t, root / f)
            plan[key] = {"stage": "eval", "name": cell.label, "status": "done", "attempts": 1, "error": None,
                         "files": files, "file_rows": {files[0]: pt.num_rows, files[1]: st.num_rows}}
            units, n_steps = units + 1, n_steps + st.num_rows
    (root / "manifest.json").write_text(json.dumps({"cells": plan, "plan": {"eval": sorted(plan)}}, indent=1))
    (root / "profile.json").write_text(json.dumps(profile_dict(p), indent=1, default=str))
    return {"cells": len(cells), "units": units, "step_rows": n_steps, "steps_per_turn": round(mean_steps, 1)}


def run_report(run: Path, code: Path, pass_rows: int | None) -> tuple[float, float]:
    """(wall seconds, peak RSS in GiB) of the report of ``run`` built by ``code``'s checkout in a child."""
    shutil.rmtree(run / "report", ignore_errors=True)
    t = time.time()
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(code), str(run), str(pass_rows or "-")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    err = proc.stderr.read()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"the report failed ({proc.returncode}): {err[-3000:]}")
    return time.time() - t, usage.ru_maxrss / 2**20  # ru_maxrss: KiB on Linux


def compare(run: Path, a: Path, b: Path, pass_rows: int | None) -> list[str]:
    """Output files that differ between the reports of checkouts ``a`` and ``b`` (none: byte-identical)."""
    outs = []
    for code, kw in ((a, pass_rows), (b, None)):
        run_report(run, code, kw)
        dest = run.parent / f"report-{len(outs)}"
        shutil.rmtree(dest, ignore_errors=True)
        shutil.move(run / "report", dest)
        outs.append(dest)
    names = sorted({p.relative_to(d) for d in outs for p in d.rglob("*") if p.is_file()})
    return [str(n) for n in names if not (outs[0] / n).is_file() or not (outs[1] / n).is_file()
            or not filecmp.cmp(outs[0] / n, outs[1] / n, shallow=False)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[5_000_000],
                    help="step rows of each synthetic run")
    ap.add_argument("--pass-rows", type=int, default=None, help="the report's pass size (default: its own)")
    ap.add_argument("--code", type=Path, default=ROOT, help="the checkout whose report is measured")
    ap.add_argument("--compare-with", type=Path, default=None,
                    help="a checkout whose report must be identical")
    ap.add_argument("--shard-size", type=int, default=None,
                    help="prompts a unit (default the paper's 20; smaller: more files, as many as the "
                         "paper's)")
    ap.add_argument("--keep", type=Path, default=None, help="keep the synthetic runs under this directory")
    args = ap.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="bench-report-")) if args.keep is None else args.keep
    points = []
    try:
        for rows in args.rows:
            run = base / (f"run-{rows}" + (f"-shard{args.shard_size}" if args.shard_size else ""))
            t = time.time()
            done = (run / "manifest.json").is_file()
            shape = {"step_rows": rows} if done else make_run(run, rows, shard_size=args.shard_size)
            print(f"synthetic run: {shape} in {time.time() - t:.0f}s", flush=True)
            if args.compare_with:
                diff = compare(run, args.code, args.compare_with, args.pass_rows)
                same = "byte-identical" if not diff else f"{len(diff)} file(s) differ: {diff[:10]}"
                print(f"outputs of {args.code} and {args.compare_with}: {same}", flush=True)
                continue
            wall, rss = run_report(run, args.code, args.pass_rows)
            points.append((shape["step_rows"], rss))
            print(f"report of {shape['step_rows']:,} step rows: {wall:.1f} s wall, peak RSS {rss:.2f} GiB",
                  flush=True)
        if len(points) >= 2:
            import numpy as np

            slope, icpt = np.polyfit([r for r, _ in points], [m for _, m in points], 1)
            print(f"fit: peak RSS = {icpt:.2f} GiB + {slope * 1e6:.3f} GiB per million step rows; "
                  f"extrapolated to {PAPER_STEP_ROWS / 1e6:.0f} M step rows: "
                  f"{icpt + slope * PAPER_STEP_ROWS:.1f} GiB (an extrapolation)")
    finally:
        if args.keep is None:
            shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
