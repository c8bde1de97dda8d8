"""The grid's new cells through the evaluation actor's own code path (EvalWorker.run, no Ray): the
study's routers and the two new strategies decode losslessly at T=0 with their cell's options, and
their trace rows carry those options, so the report names each by the label the grid gives it."""
from __future__ import annotations

import dataclasses
import warnings

import polars as pl
import pytest

from orchestrator.grid import eval_cells
from orchestrator.plan.sizing import load_profile
from orchestrator.report.routers import HEADS, PROMPT_NODE
from orchestrator.report.tables import CELL_DEFAULTS, method_expr
from tests.conftest import VERIFIER

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def heads(verifier, tmp_path_factory):
    """Four random drafters standing in for math, chat, mixed_full and avg0.5 of one backbone."""
    from drafters.checkpoint import init_drafter, save_checkpoint
    from drafters.config import DrafterConfig

    root = tmp_path_factory.mktemp("heads")
    names = ("math", "chat", "mixed_full", "avg0.5")
    cfg = lambda i: DrafterConfig.for_verifier(verifier[0], VERIFIER, "eagle2", seed=i)  # noqa: E731
    return {f"eagle2-{n}": str(save_checkpoint(init_drafter(cfg(i)), root / n)) for i, n in enumerate(names)}


def test_new_cells_decode_losslessly_and_carry_their_options(heads):
    from drafters.data.sources import load_benchmark
    from orchestrator.grid import eval_job
    from workers.eval_worker import EvalWorker

    p = load_profile("demo", ["train.backbones=[eagle2]", "eval.temperatures=[0.0]",
                              "eval.benchmarks={gsm8k: 1}",
                              "eval.switch_to=[specialist, merged]", "eval.switch_after=[1]",
                              "train.variants=[math, chat, mixed_half, mixed_full]",
                              "eval.strategies=[autoregressive, single, confidence, merged, switching, "
                              "depth_adaptive]",
                              "eval.heads=[math, chat, mixed_full, avg0.5]", "eval.mixed_variant=mixed_full"])
    cells = [c for c in eval_cells(p) if c.strategy in ("autoregressive", "switching", "depth_adaptive")
             or c.decode.route_score == "node" or len(c.drafters) == 4]
    assert len(cells) == 6
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prompts = load_benchmark("gsm8k")[0][:1]
    w = EvalWorker(VERIFIER)
    rows = []
    for c in cells:
        job = eval_job(p, c)  # what the driver sends, with a smaller tree and budget
        tree = dataclasses.replace(job.decode.tree, top_k=3, depth=4)
        job = dataclasses.replace(job, decode=dataclasses.replace(job.decode, tree=tree, max_new_tokens=6,
                                                                  seed=42))
        got, _ = w.run(job, [heads[d] for d in c.drafters], prompts)
        rows += [r | {"label": c.label} for r in got]
    df = pl.DataFrame(rows, infer_schema_length=None)
    assert set(CELL_DEFAULTS) <= set(df.columns)
    ref = df.filter(pl.col("strategy") == "autoregressive")["output_token_ids"][0].to_list()
    assert all(o.to_list() == ref for o in df["output_token_ids"])  # lossless at T=0
    methods = df.select("label", method_expr(df.columns).alias("m"))
    got = dict(zip(methods["label"], methods["m"]))
    assert sorted(set(got.values())) == sorted({"autoregressive", PROMPT_NODE, HEADS, "switching(k=1)",
                                                "switching(k=1, to merged)", "depth_adaptive(d=2)"})


def test_an_actor_decoding_prompts_in_a_batch_gives_the_rows_of_one_at_a_time(heads):
    """resources.eval.verify_batch: the actor decodes 2 prompts at once (3 prompts, one of two turns, so
    a row is refilled) and writes the rows it writes one prompt at a time: the same tokens, each input's
    paired `generate` timed after the batch and equal to the decoded tokens at T=0."""
    from drafters.data.sources import load_benchmark
    from orchestrator.grid import eval_job
    from workers.eval_worker import EvalWorker

    p = load_profile("demo", ["train.backbones=[eagle2]", "eval.temperatures=[0.0]",
                              "eval.benchmarks={gsm8k: 4}",
                              "eval.strategies=[single, merged]", "eval.paired_baseline=true",
                              "resources.eval.verify_batch=2"])
    assert p.resources.eval.verify_batch == 2
    cell = next(c for c in eval_cells(p) if c.strategy == "merged")
    job = eval_job(p, cell)
    job = dataclasses.replace(job, decode=dataclasses.replace(job.decode, max_new_tokens=6))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prompts = load_benchmark("mt_bench")[0][:1] + load_benchmark("gsm8k")[0][:2]
    paths = [heads[d] for d in cell.drafters]
    w = EvalWorker(VERIFIER, verify_batch=1)
    one = w.run(dataclasses.replace(job, paired_baseline=False), paths, prompts)[0]
    w.verify_batch = p.resources.eval.verify_batch
    batched, steps = w.run(job, paths, prompts)
    assert len(batched) == len(one) == 4 and steps
    cols = ("prompt_id", "turn", "output_token_ids", "new_tokens", "verifier_calls")
    assert [{k: r[k] for k in cols} for r in batched] == [{k: r[k] for k in cols} for r in one]
    assert all(r["generate_matches"] and r["generate_wall_time_s"] > 0 for r in batched)
