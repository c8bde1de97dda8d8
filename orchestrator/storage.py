"""Output locations: a local directory (default) or any URI pyarrow understands
(file://, s3://, gs://, hdfs://...). For a URI the driver works in a local staging directory and
copies every finished stage to the URI through pyarrow filesystems; a rerun first copies the
remote run back, so resume works the same way."""
from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path


def is_uri(output: str) -> bool:
    return "://" in output


def staging_dir(uri: str) -> Path:
    base = Path(os.environ.get("TASKSPEC_STAGING", Path(tempfile.gettempdir()) / "taskspec-staging"))
    return base / hashlib.sha256(uri.encode()).hexdigest()[:16]


def _fs(uri: str):
    from pyarrow import fs

    return fs.FileSystem.from_uri(uri)


def pull(uri: str, local: Path) -> bool:
    """Copy an existing remote run into the staging dir (for resume). Returns True if one existed."""
    from pyarrow import fs

    remote, path = _fs(uri)
    info = remote.get_file_info(path)
    if info.type == fs.FileType.NotFound:
        return False
    local.mkdir(parents=True, exist_ok=True)
    fs.copy_files(path, str(local), source_filesystem=remote, destination_filesystem=fs.LocalFileSystem())
    return True


def push(local: Path, uri: str) -> None:
    """Copy the staging dir to the URI (files are complete before they are copied)."""
    from pyarrow import fs

    remote, path = _fs(uri)
    remote.create_dir(path, recursive=True)
    fs.copy_files(str(local), path, source_filesystem=fs.LocalFileSystem(), destination_filesystem=remote)


def check_writable_uri(uri: str) -> None:
    from pyarrow import fs

    try:
        remote, path = _fs(uri)
        remote.create_dir(path, recursive=True)
        probe = f"{path.rstrip('/')}/.write-test-{os.getpid()}"
        with remote.open_output_stream(probe) as f:
            f.write(b"ok")
        remote.delete_file(probe)
    except (OSError, ValueError) as e:
        raise PermissionError(f"output URI {uri} is not writable: {e}") from e
    _ = fs
