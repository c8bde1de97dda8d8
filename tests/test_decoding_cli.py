"""`python -m decoding generate` end to end, and its bad-input errors (raised before any work)."""
from __future__ import annotations

import json
import subprocess
import sys

import polars as pl
import pytest

from decoding.cli import main as cli_main
from decoding.runner import PromptFileError, read_prompts


def _run(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "decoding", *args], capture_output=True, text=True,
                          timeout=timeout)


def _no_model(*a, **kw):
    raise AssertionError("a model was loaded before the input was checked")


def _prompts(tmp_path, rows):
    p = tmp_path / "prompts.jsonl"
    p.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return str(p)


@pytest.mark.slow
def test_generate_cli_writes_rows_and_trace(tmp_path, random_drafter_dirs, verifier):
    import torch

    model, tok = verifier
    prompts = _prompts(tmp_path, [{"id": "q1", "turns": ["What is 3 + 4?"]},
                                  {"id": "q2", "turns": ["Name a fruit.", "Name another one."]}])
    out, trace = tmp_path / "out.parquet", tmp_path / "trace.parquet"
    r = _run("generate", "--drafter", random_drafter_dirs[0], "--drafter", random_drafter_dirs[1],
             "--strategy", "merged", "--temperature", "0", "--max-new-tokens", "12", "--seed", "1",
             "--prompts", prompts, "--out", str(out), "--trace-out", str(trace))
    assert r.returncode == 0, r.stderr[-2000:]
    df = pl.read_parquet(out)
    assert df.height == 3 and set(df["prompt_id"]) == {"q1", "q2"}
    for col in ("prompt_id", "turn", "output_token_ids", "output_text", "verifier_calls", "new_tokens",
                "acceptance_length", "wall_time_s"):
        assert col in df.columns
    row = df.filter(pl.col("prompt_id") == "q1").row(0, named=True)
    ids = tok.apply_chat_template([{"role": "user", "content": "What is 3 + 4?"}], tokenize=False,
                                  add_generation_prompt=True)
    x = torch.tensor([tok(ids, add_special_tokens=False)["input_ids"]])
    ref = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=12)[0,
            x.shape[1]:].tolist()
    assert row["output_token_ids"] == ref
    assert row["acceptance_length"] == pytest.approx(row["new_tokens"] / row["verifier_calls"])
    steps = pl.read_parquet(trace)
    assert steps.height == int(df["verifier_calls"].sum())
    assert {"tree_size", "accepted_depth", "depth_accept", "t_draft_s", "t_verify_s"} <= set(steps.columns)


@pytest.mark.parametrize("rows,match", [
    (['{"id": "a", "turns": ["ok"]}', "{broken"], r":2: not valid JSON"),
    ([{"id": "a", "turns": []}], "non-empty list"),
    ([{"id": "a", "turns": ["  "]}], "turn 0 is empty"),
    ([{"turns": ["x"]}], "'id' and 'turns'"),
])
def test_bad_prompt_files_name_the_line(tmp_path, rows, match):
    with pytest.raises(PromptFileError, match=match):
        read_prompts(_prompts(tmp_path, rows))


@pytest.mark.parametrize("args,match", [
    (["--strategy", "bogus"], "unknown strategy 'bogus'; choose one of"),
    (["--strategy", "merged"], "needs at least 2 drafter"),
    (["--strategy", "autoregressive", "--temperature", "-1"], "temperature must be >= 0"),
    (["--strategy", "confidence", "--drafter", "/nonexistent", "--drafter", "/nonexistent2"],
     "not a drafter checkpoint"),
])
def test_cli_refuses_bad_input_before_work(tmp_path, args, match, capsys, monkeypatch):
    """In this process (the entry point's own process is test_generate_cli_writes_rows_and_trace's):
    exit code 2, the reason on stderr, and no model loaded."""
    prompts = _prompts(tmp_path, [{"id": "a", "turns": ["hi"]}])
    out = tmp_path / "o.parquet"
    monkeypatch.setattr("decoding.verifiers.load_verifier", _no_model)
    assert cli_main(["generate", "--prompts", prompts, "--out", str(out), *args]) == 2
    err = capsys.readouterr().err
    assert match in err, err
    assert not out.exists()


def test_drafter_for_another_verifier_is_refused(tmp_path, random_drafter_dirs, capsys, monkeypatch):
    import shutil

    d = tmp_path / "other"
    shutil.copytree(random_drafter_dirs[0], d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["verifier"] = "llama3-8b-instruct"
    (d / "config.json").write_text(json.dumps(cfg))
    prompts = _prompts(tmp_path, [{"id": "a", "turns": ["hi"]}])
    monkeypatch.setattr("decoding.verifiers.load_verifier", _no_model)
    assert cli_main(["generate", "--prompts", prompts, "--out", str(tmp_path / "o.parquet"), "--drafter",
                     str(d)]) == 2
    assert "trained for verifier 'llama3-8b-instruct'" in capsys.readouterr().err


@pytest.mark.slow
def test_hidden_size_mismatch_is_refused(verifier, random_drafter_dirs, tmp_path):
    import shutil

    from decoding.runner import load_proposers

    d = tmp_path / "wide"
    shutil.copytree(random_drafter_dirs[0], d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["hidden_size"] = 1152
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="hidden size 1152 != verifier's 576"):
        load_proposers(verifier[0], [str(d)], "smollm2-135m-instruct")


def test_bench_summary_takes_the_median_run_and_the_range():
    from decoding.bench import Timing, summarise

    # ratios 1, 2, .5, 4
    runs = [Timing(toks=10, wall=1.0, gen_toks=10, gen_wall=w) for w in (1.0, 2.0, 0.5, 4.0)]
    mid, lo, hi = summarise(runs)
    assert (mid.ratio, lo, hi) == (1.0, 0.5, 4.0)  # the lower median of an even count


@pytest.mark.slow
def test_bench_pairs_every_row_with_generate_and_compares_outputs(random_drafter_dirs):
    r = _run("bench", "--drafter", random_drafter_dirs[0], "--drafter", random_drafter_dirs[1],
             "--benchmarks", "gsm8k",
             "--n-prompts", "1", "--max-new-tokens", "8", "--strategies", "autoregressive,single",
             "--oracle-depths", "3", "--repeats", "2")
    assert r.returncode == 0, r.stderr[-2000:]
    table = r.stdout.split("draft%  same\n", 1)[1].strip().splitlines()
    rows = {line[:26].strip(): line[26:].split() for line in table}
    # the lean pass's attribution row: the same loop through transformers' forward
    assert list(rows) == ["autoregressive", "autoregressive, hf pass", "single 4/4/16",
                          "oracle chain depth 3"], r.stdout
    for label, (_tps, ratio, spread, gen_tps, _tau, _tree, _draft, same) in rows.items():
        lo, hi = map(float, spread.split("-"))
        assert lo <= float(ratio[:-1]) <= hi and float(gen_tps) > 0, label
        assert same == "1/1", f"{label}: output differs from generate's at T=0"
    assert float(rows["oracle chain depth 3"][4]) > 2  # the verifier's own continuation is accepted
    with pytest.raises(SystemExit, match="--repeats must be >= 1"):
        cli_main(["bench", "--repeats", "0"])
