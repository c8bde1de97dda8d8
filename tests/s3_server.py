"""moto's S3 server on a free loopback port with one bucket, for the multi-node tests (test_multinode,
test_rehearsal) and the shard-read tests and benchmark: moto accepts any credentials; these are the
ones the tests hand their nodes. ``bandwidth`` (bytes/s) puts a throttle in front of it: every
byte the server sends, over all connections together, passes one token bucket, as a node's link to
an object store would (requests and uploads are not throttled)."""
from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager

CREDS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
CHUNK = 64 << 10  # bytes the throttle lets through at a time


class Throttle:
    """A TCP proxy on a free loopback port to ``target`` whose replies share ``bandwidth`` bytes/s
    (a virtual clock: each chunk is sent at the earliest time the bucket allows)."""

    def __init__(self, target: tuple[str, int], bandwidth: float):
        if not bandwidth > 0:
            raise ValueError(f"bandwidth must be > 0 bytes/s, got {bandwidth}")
        self.target, self.bandwidth = target, float(bandwidth)
        self.sent = 0  # bytes the server sent through it
        self._next, self._lock = 0.0, threading.Lock()
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True, name="s3-throttle").start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            for src, dst, slow in ((client, server, False), (server, client, True)):
                threading.Thread(target=self._pump, args=(src, dst, slow), daemon=True).start()

    def _wait(self, n: int) -> None:
        with self._lock:
            now = time.monotonic()
            until = self._next = max(now, self._next) + n / self.bandwidth
            self.sent += n
        time.sleep(until - now)

    def _pump(self, src: socket.socket, dst: socket.socket, slow: bool) -> None:
        try:
            while True:
                data = src.recv(CHUNK)
                if not data:
                    break
                if slow:
                    self._wait(len(data))
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

    def close(self) -> None:
        self._stop.set()
        self._sock.close()


@contextmanager
def moto_s3(bucket: str, region: str, bandwidth: float | None = None):
    """Yields (endpoint URL, pyarrow S3FileSystem on it) while the server runs; with ``bandwidth``
    the endpoint is a :class:`Throttle` in front of the server (``throttled_s3`` yields it too)."""
    with throttled_s3(bucket, region, bandwidth) as (endpoint, s3fs, _):
        yield endpoint, s3fs


@contextmanager
def throttled_s3(bucket: str, region: str, bandwidth: float | None = None):
    """As ``moto_s3``, yielding (endpoint URL, pyarrow S3FileSystem, the Throttle or None)."""
    import boto3
    from moto.server import ThreadedMotoServer
    from pyarrow import fs

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    throttle = None
    try:
        host, port = server.get_host_and_port()
        boto3.client("s3", endpoint_url=f"http://{host}:{port}", region_name=region,
                     **{k.lower(): v for k, v in CREDS.items()}).create_bucket(Bucket=bucket)
        if bandwidth is not None:
            throttle = Throttle((host, port), bandwidth)
            port = throttle.port
        yield f"http://{host}:{port}", fs.S3FileSystem(
            endpoint_override=f"{host}:{port}", scheme="http", access_key=CREDS["AWS_ACCESS_KEY_ID"],
            secret_key=CREDS["AWS_SECRET_ACCESS_KEY"], region=region), throttle
    finally:
        if throttle is not None:
            throttle.close()
        server.stop()
