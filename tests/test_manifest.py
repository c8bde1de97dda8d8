"""The manifest's journal: a record is one fsync'd line, compaction folds the journal into
manifest.json, and a crash at any point (a torn line, between compaction's write and rename, after
the rename, a writer killed mid-run) loses no record that was acknowledged. Old single-file
manifests still read, and resume with every finished unit skipped."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from orchestrator import manifest as mf
from orchestrator.manifest import Manifest, journal_path, read_manifest
from orchestrator.report.run_records import recorded_traces

ROOT = Path(__file__).resolve().parents[1]


def _unit(m: Manifest, i: int, status: str = "done") -> None:
    files = [f"traces/x/{i}.txt"] if status == "done" else []
    m.record(f"eval-{i}", "eval", f"cell|gsm8k|{i}", status, files=files)


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in journal_path(path).read_text().splitlines()]


def test_a_record_is_one_journal_line_and_compaction_folds_it_into_manifest_json(tmp_path):
    path = tmp_path / "manifest.json"
    m = Manifest(path)
    for i in range(3):
        _unit(m, i)
    m.set_plan("eval", ["eval-2", "eval-0", "eval-1"])
    m.set_plan("eval", ["eval-0", "eval-1", "eval-2"])  # the same plan again: nothing written
    m.record_stage("eval", 12.5, 3, "cpu")
    assert not path.exists()  # nothing compacted yet: the journal alone holds the run
    assert [x.get("op") for x in _lines(path)] == [None, "record", "record", "record", "plan", "stage"]
    state = read_manifest(path)
    assert set(state["cells"]) == {"eval-0", "eval-1",
                                   "eval-2"} and state["stages"]["eval"]["seconds"] == 12.5
    assert Manifest(path).data == state == m.data
    m.close()
    assert json.loads(path.read_text()) == {**state, "generation": 1}  # what readers of manifest.json see
    assert _lines(path) == [{"base": 1}] and read_manifest(path) == state
    m.close()  # an empty journal: nothing rewritten
    assert json.loads(path.read_text())["generation"] == 1


def test_compaction_runs_once_the_journal_is_as_long_as_the_snapshot(tmp_path, monkeypatch):
    """Snapshots of 4, 8, 16 units: each compaction writes as many units as lines were appended
    since the last one, so a record costs O(1), amortized."""
    monkeypatch.setattr(mf, "COMPACT_MIN", 4)
    path = tmp_path / "manifest.json"
    m = Manifest(path)

    def snapshot():
        d = json.loads(path.read_text())
        return d["generation"], len(d["cells"]), len(_lines(path)) - 1

    for i in range(16):
        _unit(m, i)
        if i in (3, 6, 7, 14, 15):
            assert snapshot() == {3: (1, 4, 0), 6: (1, 4, 3), 7: (2, 8, 0), 14: (2, 8, 7), 15: (3, 16, 0)}[i]


def test_a_torn_last_line_is_ignored_with_a_warning_and_cut_off_before_the_next_append(tmp_path, capsys):
    path = tmp_path / "manifest.json"
    m = Manifest(path)
    for i in range(3):
        _unit(m, i)
    del m
    with open(journal_path(path), "ab") as f:  # a crash in the middle of an append
        f.write(b'{"cell": {"stage": "eval", "name": "torn", "sta')
    again = Manifest(path)
    assert set(again.cells()) == {"eval-0", "eval-1", "eval-2"}
    assert "its last line is incomplete (47 bytes" in capsys.readouterr().err
    _unit(again, 3)
    assert set(read_manifest(path)["cells"]) == {f"eval-{i}" for i in range(4)}
    assert capsys.readouterr().err == ""  # the torn bytes are gone
    assert all(line.endswith("}") for line in journal_path(path).read_text().splitlines())


def test_a_broken_line_before_the_last_is_an_error(tmp_path):
    path = tmp_path / "manifest.json"
    m = Manifest(path)
    _unit(m, 0)
    lines = journal_path(path).read_text().splitlines()
    journal_path(path).write_text("\n".join([lines[0], "{not json", lines[1]]) + "\n")
    with pytest.raises(ValueError, match="manifest.jsonl line 2 is not a journal line"):
        read_manifest(path)


def test_a_crash_between_compaction_write_and_rename_keeps_every_record(tmp_path, monkeypatch):
    path = tmp_path / "manifest.json"
    m = Manifest(path)
    for i in range(3):
        _unit(m, i)
    m.close()
    for i in range(3, 5):
        _unit(m, i)
    real = os.replace

    def crash(src, dst):
        if Path(dst) == path:
            raise OSError("killed before the rename")
        real(src, dst)

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="killed before the rename"):
        m.close()
    monkeypatch.setattr(os, "replace", real)
    assert list(tmp_path.glob(".manifest.json.*.tmp"))  # the new snapshot, never renamed
    assert json.loads(path.read_text())["generation"] == 1  # the old one
    again = Manifest(path)
    assert set(again.cells()) == {f"eval-{i}" for i in range(5)}
    _unit(again, 5)
    again.close()
    assert set(json.loads(path.read_text())["cells"]) == {f"eval-{i}" for i in range(6)}


def test_a_crash_after_compaction_renamed_the_snapshot_skips_the_folded_journal(tmp_path, monkeypatch,
        capsys):
    path = tmp_path / "manifest.json"
    m = Manifest(path)
    for i in range(3):
        _unit(m, i)
    m.forget_from("eval")  # a --force: replaying the folded journal twice would drop what follows it
    _unit(m, 7)
    real = mf._write_durable

    def crash(p, text):
        if Path(p) == journal_path(path):
            raise OSError("killed before the journal was reset")
        real(p, text)

    monkeypatch.setattr(mf, "_write_durable", crash)
    with pytest.raises(OSError):
        m.close()
    monkeypatch.setattr(mf, "_write_durable", real)
    assert _lines(path)[0] == {"base": 0} and json.loads(path.read_text())["generation"] == 1
    again = Manifest(path)
    assert set(again.cells()) == {"eval-7"} and capsys.readouterr().err == ""
    _unit(again, 8)  # a new journal, based on generation 1
    assert _lines(path)[0] == {"base": 1} and set(read_manifest(path)["cells"]) == {"eval-7", "eval-8"}


def test_a_journal_of_another_snapshot_is_ignored_with_a_warning(tmp_path, capsys):
    """E.g. a manifest.json fetched from the URI beside a journal a killed driver left locally."""
    path = tmp_path / "manifest.json"
    m = Manifest(path)
    _unit(m, 0)
    m.close()
    _unit(m, 1)
    path.write_text(json.dumps({"cells": {}, "generation": 5}))
    assert read_manifest(path)["cells"] == {}
    assert "extends generation 1, not manifest.json's 5: ignored" in capsys.readouterr().err
    Manifest.remove(path)
    assert not path.exists() and not journal_path(path).exists() and read_manifest(path) is None


@pytest.mark.parametrize("kill_after", [150, 400])
def test_a_killed_writer_loses_no_acknowledged_record(tmp_path, kill_after):
    """A process recording units and compacting every 5 records (as the driver does when it
    publishes) is SIGKILLed mid-run: every record it had acknowledged (printed after record()
    returned) is in the state read afterwards, whatever it was doing when it was killed."""
    path = tmp_path / "manifest.json"
    code = (f"from orchestrator import manifest as mf; m = mf.Manifest({str(path)!r}); i = 0\n"
            "while True:\n"
            "    m.record(f'eval-{i}', 'eval', 'cell', 'done', files=[], prompts=20, note='x' * (i % 300))\n"
            "    print(i, flush=True)\n"
            "    m.compact() if i % 5 == 4 else None\n"
            "    i += 1\n")
    p = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    acked, t = [], time.time()
    while len(acked) < kill_after and time.time() - t < 60:
        acked.append(int(p.stdout.readline()))
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    acked += [int(x) for x in p.stdout.read().split()]  # printed before the kill, still in the pipe
    cells = Manifest(path).cells()
    assert len(acked) >= kill_after and {f"eval-{i}" for i in acked} <= set(cells)
    assert json.loads(path.read_text())["generation"] >= kill_after // 5 - 1  # it was compacting all along


def _old_run(root: Path) -> dict:
    """A run as the manifest before the journal wrote it: one manifest.json rewritten whole."""
    cells = {}
    for i, status in enumerate(["done", "done", "failed", "done"]):
        rel = f"traces/prompts/backbone=hass/benchmark=gsm8k/temperature=0/eval-{i}.parquet"
        files = [rel] if status == "done" else []
        if files:
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(pa.table({"prompt_id": ["p0", "p1"]}), root / rel)
        cells[f"eval-{i}"] = {"stage": "eval", "name": f"hass:single:math|gsm8k|{i}", "status": status,
                              "attempts": 1, "error": None if files else "boom", "files": files,
                              **({"file_rows": {rel: 2}} if files else {})}
    cells["train-a"] = {"stage": "train", "name": "hass-math", "status": "done", "attempts": 1, "error": None,
                        "files": []}
    data = {"cells": cells, "plan": {"eval": sorted(k for k in cells if k.startswith("eval"))},
            "stages": {"eval": {"seconds": 3.0, "units_run": 4, "machine": "cpu"}}}
    (root / "manifest.json").write_text(json.dumps(data, indent=1, sort_keys=True))  # the old _flush
    return data


def test_an_old_single_file_manifest_resumes_with_every_finished_unit_skipped(tmp_path):
    data = _old_run(tmp_path)
    m = Manifest(tmp_path / "manifest.json")
    assert m.data == data and not journal_path(tmp_path / "manifest.json").exists()
    # what the driver asks of each unit before it runs it (stage_eval, stage_train: manifest.done)
    assert {k for k in data["cells"] if m.done(k)} == {"eval-0", "eval-1", "eval-3", "train-a"}
    assert recorded_traces(tmp_path) == {c["files"][0] for k, c in data["cells"].items()
                                         if k.startswith("eval") and c["files"]}
    _unit(m, 2)  # the failed unit redone: appended to a journal based on generation 0
    assert _lines(tmp_path / "manifest.json")[0] == {"base": 0}
    m.close()
    after = json.loads((tmp_path / "manifest.json").read_text())  # as any reader of the old file reads it
    assert after["cells"]["eval-2"]["status"] == "done"
    assert after["cells"]["eval-0"] == data["cells"]["eval-0"]
    assert after["plan"] == data["plan"] and after["stages"] == data["stages"] and after["generation"] == 1
