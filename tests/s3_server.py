"""moto's S3 server on a free loopback port with one bucket, for the multi-node tests (test_multinode,
test_rehearsal): moto accepts any credentials; these are the ones the tests hand their nodes."""
from __future__ import annotations

from contextlib import contextmanager

CREDS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}


@contextmanager
def moto_s3(bucket: str, region: str):
    """Yields (endpoint URL, pyarrow S3FileSystem on it) while the server runs."""
    import boto3
    from moto.server import ThreadedMotoServer
    from pyarrow import fs

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        boto3.client("s3", endpoint_url=endpoint, region_name=region,
                     **{k.lower(): v for k, v in CREDS.items()}).create_bucket(Bucket=bucket)
        yield endpoint, fs.S3FileSystem(endpoint_override=f"{host}:{port}", scheme="http",
                                        access_key=CREDS["AWS_ACCESS_KEY_ID"],
                                        secret_key=CREDS["AWS_SECRET_ACCESS_KEY"], region=region)
    finally:
        server.stop()
