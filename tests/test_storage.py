"""Artifact storage through pyarrow filesystems, against a local file:// URI (the same code path
as s3:// or gs://): incremental copies, completion markers last, remote-is-truth fetches."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from common import storage


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("TASKSPEC_STAGING", str(tmp_path / "node"))
    local = tmp_path / "stage"
    (local / "traces/prompts/backbone=x").mkdir(parents=True)
    (local / "traces/prompts/backbone=x/a.parquet").write_bytes(b"PAR1")
    (local / "manifest.json").write_text("{}")
    return local, f"file://{tmp_path / 'remote' / 'run'}", tmp_path


def test_publish_then_fetch_round_trip(env):
    local, uri, tmp = env
    storage.check_writable_uri(uri)
    storage.publish(local, uri)
    assert (tmp / "remote/run/traces/prompts/backbone=x/a.parquet").read_bytes() == b"PAR1"
    got = storage.fetch(storage.join(uri, "traces"))
    assert got == storage.node_cache(uri) / "traces" and got.is_relative_to(tmp / "node" / "cache")
    assert (got / "prompts/backbone=x/a.parquet").read_bytes() == b"PAR1"
    assert storage.listdir(uri) == ["manifest.json", "traces"] and storage.listdir(storage.join(uri,
            "nothing")) == []
    with pytest.raises(FileNotFoundError, match="does not exist"):
        storage.fetch(storage.join(uri, "nothing"))


def test_sync_is_incremental_and_sees_rewrites(env):
    local, uri, tmp = env
    assert storage.sync(str(local), uri) == 2
    assert storage.sync(str(local), uri) == 0  # nothing changed, nothing copied
    time.sleep(0.02)
    (local / "manifest.json").write_text("{ }")  # same size would not do: also newer
    (local / "manifest.json").write_text("{}")
    os.utime(local / "manifest.json", None)
    assert storage.sync(str(local), uri) == 1
    (local / "traces/prompts/backbone=x/a.parquet").write_bytes(b"PAR1PAR1")
    assert storage.sync(str(local), uri) == 1
    assert (tmp / "remote/run/traces/prompts/backbone=x/a.parquet").read_bytes() == b"PAR1PAR1"
    assert storage.sync(str(local), uri, force=True) == 2


def test_prune_exclude_and_markers_last(env, monkeypatch):
    local, uri, tmp = env
    storage.sync(str(local), uri)
    down = tmp / "down"
    storage.sync(uri, str(down))
    (down / "stale.txt").write_text("from an older run")
    storage.sync(uri, str(down), prune=True)
    assert not (down / "stale.txt").exists() and (down / "manifest.json").is_file()
    (local / "state.json").write_text("{}")
    order = []
    real = storage._copy_one
    monkeypatch.setattr(storage, "_copy_one", lambda s, sp, d, dp: (order.append(dp.rsplit("/", 1)[1]),
                                                                    real(s, sp, d, dp)))
    (local / "z.bin").write_bytes(b"z")
    storage.sync(str(local), storage.join(uri, "copy2"), exclude=("a.parquet",))
    assert order[-2:] == ["manifest.json", "state.json"] or order[-2:] == ["state.json", "manifest.json"]
    assert "a.parquet" not in order and "z.bin" in order


def test_local_paths_pass_through(env):
    local, _, _ = env
    assert storage.fetch(str(local)) == local and storage.node_cache(str(local)) == local
    storage.publish(local, str(local))  # same place: nothing to do
    assert storage.join(str(local), "a", "b") == str(local / "a" / "b")
    assert storage.join("s3://bucket/run/", "a", "/b") == "s3://bucket/run/a/b"


def test_unwritable_uri_is_refused_with_its_name(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        if os.access(ro, os.W_OK):
            pytest.skip("running as root: permissions are not enforced")
        with pytest.raises(PermissionError, match="not writable"):
            storage.check_writable_uri(f"file://{ro}/run")
    finally:
        ro.chmod(0o700)


def test_object_store_transfer_path_round_trips(tmp_path):
    """The non-local branch (pyarrow's chunked copy, used for s3:// and gs://) against pyarrow's
    in-memory mock filesystem, in both directions; plus listing and staleness on that filesystem."""
    from pyarrow import fs

    mock, _ = fs.FileSystem.from_uri("mock:///")
    data = os.urandom(3 << 20)
    (tmp_path / "w.bin").write_bytes(data)
    storage._copy_one(fs.LocalFileSystem(), str(tmp_path / "w.bin"), mock, "bucket/run/w.bin")
    with mock.open_input_stream("bucket/run/w.bin") as f:
        assert f.read() == data
    storage._copy_one(mock, "bucket/run/w.bin", fs.LocalFileSystem(), str(tmp_path / "back" / "w.bin"))
    assert (tmp_path / "back/w.bin").read_bytes() == data and not list((tmp_path / "back").glob("*.tmp"))
    files = storage._files(mock, "bucket/run")
    assert set(files) == {"w.bin"} and files["w.bin"].size == len(data)
    assert not storage._stale(files["w.bin"], files["w.bin"])


def test_atomic_file_leaves_the_old_file_on_error_and_no_temp_behind(tmp_path):
    from common.atomic import atomic_file, write_text_atomic

    out = tmp_path / "sub" / "x.json"
    write_text_atomic(out, "old")
    with pytest.raises(RuntimeError):
        with atomic_file(out) as tmp:
            Path(tmp).write_text("half")
            raise RuntimeError("killed mid-write")
    assert out.read_text() == "old" and sorted(p.name for p in out.parent.iterdir()) == ["x.json"]
    write_text_atomic(out, "new")
    assert out.read_text() == "new"
