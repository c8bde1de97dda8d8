"""The lease (one driver per output): its staleness rule across hosts and PID namespaces, a
holder that stops writing once its lease could have lapsed, and the lease released on every way
out of the driver (Ctrl-C and SIGTERM included). Fast: no Ray, no model; docs/cluster.md "Leases"."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.manifest import Lease, LeaseHeld, pid_space
from orchestrator.run.driver import MANIFEST_SYNC_S

ROOT = Path(__file__).resolve().parents[1]


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _held(ref: str, **who) -> None:
    now = time.time()  # renewed just now unless ``who`` says otherwise
    Path(ref).write_text(json.dumps({"id": "elsewhere", "renewed": now, "expires": now + 60, **who}))


def test_pids_are_compared_only_within_one_pid_space(tmp_path):
    """Two drivers in different PID namespaces (containers; on the host network they share the
    hostname): the same PID, or a PID not running here, says nothing about the other's driver, so
    its live lease is refused until a full TTL without heartbeat; within this PID space a holder
    whose process has exited is taken at once (the same command resumes after a crash)."""
    ref, host, me, now = str(tmp_path / "lease.json"), socket.gethostname(), os.getpid(), time.time()
    other_space = "another-boot/pid:[1]"
    cases = {  # (holder, taken at once?)
        "same host name, same PID, another PID namespace":
            ({"host": host, "pid": me, "pid_space": other_space}, False),
        "same host name, PID not running here, another PID namespace":
            ({"host": host, "pid": _dead_pid(), "pid_space": other_space}, False),
        "same PID, another host": ({"host": "other-host", "pid": me, "pid_space": other_space}, False),
        "an older driver that did not record its PID space": ({"host": host, "pid": _dead_pid()}, False),
        "this PID space, process exited": ({"host": host, "pid": _dead_pid(), "pid_space": pid_space()},
                                           True),
        "another PID space, a full TTL without heartbeat":
            ({"host": host, "pid": me, "pid_space": other_space, "renewed": now - 61, "expires": now - 1},
             True),
        "another PID space, renewed within the TTL":
            ({"host": host, "pid": me, "pid_space": other_space, "renewed": now - 30, "expires": now + 30},
             False),
    }
    assert pid_space()  # Linux: the boot id and the PID namespace are known
    got = {}
    for case, (holder, _) in cases.items():
        _held(ref, **holder)
        lease = Lease(ref, settle=0)
        try:
            got[case] = lease.acquire()
            lease.release()
        except LeaseHeld as e:
            got[case] = None
            assert f"in use by driver pid {holder['pid']} on {holder['host']}" in str(e)
            assert "--take-over" in str(e)
    assert {c: v is not None for c, v in got.items()} == {c: taken for c, (_, taken) in cases.items()}, got
    assert "its process has exited" in got["this PID space, process exited"]
    assert "no heartbeat for the full TTL" in got["another PID space, a full TTL without heartbeat"]


def test_a_holder_without_heartbeat_stops_before_writing_once_its_lease_lapsed(tmp_path):
    """The holder's heartbeat stops landing (a paused process, an unreachable store): another
    driver may take the output after the TTL, and the first one's next check (before any write of
    shared state) refuses to go on instead of writing over the new driver's work."""
    ref = str(tmp_path / "lease.json")
    first = Lease(ref, ttl=1.0, settle=0)
    first.acquire()
    first._stop.set()  # its heartbeat thread stops: no renewal lands any more
    first._thread.join()
    second = Lease(ref, settle=0)
    second.me["pid_space"] = "another-container"  # a driver elsewhere
    with pytest.raises(LeaseHeld):  # within the TTL the lease still holds, in other drivers' eyes too
        second.acquire()
    time.sleep(1.2)
    assert "no heartbeat for the full TTL" in second.acquire()
    with pytest.raises(LeaseHeld, match="taken by driver pid"):
        first.check()
    second.release()
    assert not Path(ref).exists()


def test_a_holder_in_another_pid_namespace_is_never_judged_by_its_pid(tmp_path):
    """A real second PID namespace (unshare, as a container has): the holder there is PID 1 under
    this same hostname; killed, its lease still holds here until the TTL (PID 1 here is another process)."""
    unshare = shutil.which("unshare")
    if unshare is None or subprocess.run([unshare, "--pid", "--fork", "--mount-proc", "true"]).returncode:
        pytest.skip("no unshare --pid here (needs root or user namespaces)")
    ref = str(tmp_path / "lease.json")
    code = (f"import time; from orchestrator.manifest import Lease; Lease({ref!r}, ttl=60, "
            "settle=0).acquire(); "
            "print('held', flush=True); time.sleep(120)")
    holder = subprocess.Popen([unshare, "--pid", "--fork", "--mount-proc", sys.executable, "-c", code],
                              cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        held = json.loads(Path(ref).read_text())
        assert held["host"] == socket.gethostname() and held["pid"] == 1 and held["pid_space"] != pid_space()
        assert held["pid_space"].split("/")[0] == pid_space().split("/")[0]  # the same machine (boot id)
    finally:
        holder.kill()
        holder.wait()
    with pytest.raises(LeaseHeld, match=f"in use by driver pid 1 on {socket.gethostname()}"):
        Lease(ref, settle=0).acquire()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["Ctrl-C", "SIGTERM"])
def test_an_interrupted_driver_leaves_no_lease(tmp_path, sig):
    """The signal lands as soon as lease.json exists (while the driver waits to read it back):
    the grid command exits 130 with one line and the lease is gone (before, Ctrl-C there or
    `ray job stop`'s SIGTERM at any time left it for the next driver to wait out)."""
    out = tmp_path / "run"
    cmd = [sys.executable, str(ROOT / "experiments/full_grid.py"), "--profile", "smoke", "--output-dir",
           str(out)]
    p = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t0 = time.time()
    while not (out / "lease.json").exists() and p.poll() is None and time.time() - t0 < 120:
        time.sleep(0.005)
    assert (out / "lease.json").exists(), p.communicate()
    p.send_signal(sig)
    stdout, stderr = p.communicate(timeout=120)
    assert p.returncode == 130, stdout + stderr
    assert stderr.splitlines()[-1] == "interrupted: the lease is released; rerun the same command to resume"
    assert not (out / "lease.json").exists()


def test_the_manifest_sync_interval_is_one_constant_and_documented():
    text = " ".join((ROOT / "docs/cluster.md").read_text().split())
    assert "## Leases" in text
    assert f"more than {MANIFEST_SYNC_S} seconds old (`MANIFEST_SYNC_S`" in text
