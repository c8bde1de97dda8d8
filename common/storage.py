"""Artifact locations: a local directory (default) or any URI pyarrow understands (file://, s3://,
gs://, hdfs://...).

With a URI, the URI is the only place processes share. Each process works in a node-local
mirror of the URI namespace (``node_cache``) and moves files through pyarrow filesystems:
``fetch`` copies a remote file or tree down before it is read, ``publish`` copies a local one up
once it is complete. The driver keeps its own files (manifest, merges, traces, report) in a
separate ``staging_dir``, so even on one machine it never reads a worker's local file: what a
worker did not publish does not exist for the driver. Copies are incremental (a file is copied
when missing, of another size, or newer at the source) and each local file is written to a
temp name and renamed.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
import uuid
from pathlib import Path
from urllib.parse import urlsplit

from common.atomic import write_text_atomic

LAST = ("state.json", "manifest.json")  # completion markers: copied after the files they describe
# where an S3-compatible store is (MinIO, Ceph, a local test server): pyarrow's S3 client reads
# these from the environment. The driver forwards them to every Ray worker; credentials it does not
# (each node has its own: env vars, instance profile, IRSA).
ENDPOINT_VARS = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION")


# the schemes pyarrow's FileSystem.from_uri reads; the ones without a bucket or host may leave it empty
SCHEMES = ("file", "local", "mock", "s3", "gs", "gcs", "abfs", "abfss", "hdfs", "viewfs")
NO_HOST = ("file", "local", "mock", "hdfs", "viewfs")
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")


class BadLocation(ValueError):
    """A location that is neither a path nor a well-formed URI (the message is one line)."""


def is_uri(ref: str) -> bool:
    """True for ``scheme://...``, False for a path; raises :class:`BadLocation` for anything that
    looks like a URI and is not one (``s3:/b``, ``s3:b``, ``s3//b``, ``file:/x``, ``s3:///x``,
    ``file://host/x``, an unknown scheme), which would otherwise become a local directory named
    ``s3:`` or ``s3``. The one place locations are parsed: every reader and writer goes through it.
    A local directory whose name has a colon is written ``./name:x``."""
    s = str(ref)
    m = _SCHEME.match(s)
    if m is None:
        first = s.split("/", 1)[0]
        if first.lower() in SCHEMES and s[len(first):].startswith("//"):
            raise BadLocation(f"{s!r} is not a URI (no ':' after {first!r}): write {first}:{s[len(first):]}, "
                              f"or ./{s} for a local directory")
        return False
    scheme, rest = m.group(1).lower(), s[m.end():]
    form = f"{scheme}:///<absolute path>" if scheme in ("file", "local") else f"{scheme}://<bucket>/<path>"
    if not rest.startswith("//"):
        raise BadLocation(f"{s!r} is not a URI (write {form}); "
                          f"for a local directory of that name write ./{s}")
    if scheme not in SCHEMES:
        raise BadLocation(f"{s!r}: unknown scheme {scheme!r}; a URI's scheme is one of {list(SCHEMES)}")
    host = urlsplit(s).netloc
    if scheme == "file" and host not in ("", "localhost"):
        raise BadLocation(f"{s!r}: a file URI names an absolute path on this machine: write {form}")
    if not host and scheme not in NO_HOST:
        raise BadLocation(f"{s!r} names no bucket or host: write {form}")
    return True


def join(base: str, *parts: str) -> str:
    if is_uri(base):
        return "/".join([str(base).rstrip("/"), *(p.strip("/") for p in parts)])
    return str(Path(base).joinpath(*parts))


def endpoint_env() -> dict[str, str]:
    """The object-store endpoint settings of this process (``ENDPOINT_VARS`` that are set)."""
    return {k: os.environ[k] for k in ENDPOINT_VARS if os.environ.get(k)}


def _base() -> Path:
    return Path(os.environ.get("TASKSPEC_STAGING", Path(tempfile.gettempdir()) / "taskspec-staging"))


def node_dir(*parts: str) -> Path:
    """A directory of this node's own bookkeeping under its staging root (e.g. node_dir("fetched"))."""
    return _base().joinpath(*parts)


def staging_dir(uri: str) -> Path:
    """The driver's working directory for a run whose output is ``uri``."""
    return _base() / "driver" / hashlib.sha256(uri.encode()).hexdigest()[:16]


def node_cache(ref: str) -> Path:
    """Where this node keeps its copy of ``ref`` (a mirror of the URI's namespace)."""
    if not is_uri(ref):
        return Path(ref)
    u = urlsplit(str(ref))
    root = hashlib.sha256(f"{u.scheme}://{u.netloc}".encode()).hexdigest()[:8]
    return _base() / "cache" / root / u.path.lstrip("/")


def _fs(ref: str):
    from pyarrow import fs

    if is_uri(ref):
        return fs.FileSystem.from_uri(str(ref))
    return fs.LocalFileSystem(), str(Path(ref).resolve())


def filesystem(ref: str):
    """(pyarrow filesystem, path) of ``ref``: ``open_input_file(path)`` gives a random-access file
    whose ``read_at(nbytes, offset)`` is a ranged read (a ranged GET on object storage)."""
    return _fs(ref)


def _files(filesystem, path: str) -> dict:
    """{relative path: FileInfo} of a file or a tree ('' for a single file); {} if absent."""
    from pyarrow import fs

    info = filesystem.get_file_info(path)
    if info.type == fs.FileType.NotFound:
        return {}
    if info.type == fs.FileType.File:
        return {"": info}
    sel = fs.FileSelector(path, recursive=True)
    return {i.path[len(path.rstrip("/")) + 1 :]: i for i in filesystem.get_file_info(sel)
            if i.type == fs.FileType.File}


def list_files(ref: str) -> set[str]:
    """Every file under ``ref``, relative to it (one recursive listing)."""
    filesystem, path = _fs(ref)
    return set(_files(filesystem, path))


def file_sizes(ref: str) -> dict[str, int]:
    """{relative path: bytes} of every file under ``ref`` (one recursive listing)."""
    filesystem, path = _fs(ref)
    return {r: int(i.size) for r, i in _files(filesystem, path).items()}


def exists(ref: str) -> bool:
    filesystem, path = _fs(ref)
    return bool(_files(filesystem, path))


def _stale(src, dst) -> bool:
    if dst is None or src.size != dst.size:
        return True
    return src.mtime is not None and dst.mtime is not None and src.mtime > dst.mtime


def _copy_one(sfs, spath: str, dfs, dpath: str) -> None:
    from pyarrow import fs

    local = isinstance(dfs, fs.LocalFileSystem)
    target = f"{dpath}.{uuid.uuid4().hex[:8]}.tmp" if local else dpath
    dfs.create_dir(dpath.rsplit("/", 1)[0], recursive=True)
    if local and isinstance(sfs, fs.LocalFileSystem):  # both local (or a shared mount): the kernel copies
        shutil.copyfile(spath, target)
    else:  # pyarrow's chunked, multi-threaded transfer (multipart uploads on object stores)
        fs.copy_files(spath, target, source_filesystem=sfs, destination_filesystem=dfs, chunk_size=16 << 20,
                      use_threads=True)
    if local:
        os.replace(target, dpath)


def sync(src: str, dst: str, exclude: tuple = (), force: bool = False, prune: bool = False) -> int:
    """Copy the file or tree ``src`` to ``dst`` (paths or URIs); returns the number of files
    copied. ``prune`` deletes files under ``dst`` that ``src`` lacks. Raises FileNotFoundError if
    ``src`` does not exist."""
    sfs, spath = _fs(src)
    dfs, dpath = _fs(dst)
    have = _files(sfs, spath)
    if not have:
        raise FileNotFoundError(f"{src} does not exist")
    there = _files(dfs, dpath)
    if prune:
        for r in set(there) - set(have):
            dfs.delete_file(f"{dpath.rstrip('/')}/{r}")
    todo = [r for r, i in have.items() if Path(r).name not in exclude and (force or _stale(i, there.get(r)))]
    todo.sort(key=lambda r: Path(r).name in LAST)
    for r in todo:
        _copy_one(sfs, f"{spath.rstrip('/')}/{r}" if r else spath, dfs, f"{dpath.rstrip('/')}/{r}" if r
                  else dpath)
    return len(todo)


def fetch(ref: str) -> Path:
    """A local path holding ``ref`` (a path is returned as is; a URI is copied to the node cache)."""
    if not is_uri(ref):
        return Path(ref)
    local = node_cache(ref)
    sync(ref, str(local))
    return local


def publish(local: Path | str, ref: str, exclude: tuple = ()) -> None:
    """Copy a finished local file or tree to ``ref`` (no-op when ``ref`` is that same local path)."""
    if is_uri(ref) or Path(local).resolve() != Path(ref).resolve():
        sync(str(local), ref, exclude=exclude)


def remove(ref: str) -> None:
    from pyarrow import fs

    filesystem, path = _fs(ref)
    info = filesystem.get_file_info(path)
    if info.type == fs.FileType.Directory:
        filesystem.delete_dir(path)
    elif info.type == fs.FileType.File:
        filesystem.delete_file(path)


def listdir(ref: str) -> list[str]:
    """Names directly under ``ref`` ([] if it does not exist)."""
    from pyarrow import fs

    filesystem, path = _fs(ref)
    if filesystem.get_file_info(path).type != fs.FileType.Directory:
        return []
    return sorted(i.base_name for i in filesystem.get_file_info(fs.FileSelector(path)))


def check_writable_uri(uri: str) -> None:
    try:
        remote, path = _fs(uri)
        remote.create_dir(path, recursive=True)
        probe = f"{path.rstrip('/')}/.write-test-{os.getpid()}"
        with remote.open_output_stream(probe) as f:
            f.write(b"ok")
        remote.delete_file(probe)
    except (OSError, ValueError) as e:
        raise PermissionError(f"output URI {uri} is not writable: {e}") from e


def read_text(ref: str) -> str | None:
    """The text of the file ``ref`` (path or URI); None if it does not exist."""
    from pyarrow import fs

    filesystem, path = _fs(ref)
    if filesystem.get_file_info(path).type != fs.FileType.File:
        return None
    try:
        with filesystem.open_input_stream(path) as f:
            return f.read().decode()
    except FileNotFoundError:  # deleted between the two calls
        return None


def write_text(ref: str, text: str) -> None:
    """Write the file ``ref`` whole: a temp name renamed into place for a path, one PUT for an object."""
    from pyarrow import fs

    filesystem, path = _fs(ref)
    if isinstance(filesystem, fs.LocalFileSystem):  # a path, file://, or a mount
        write_text_atomic(path, text)
        return
    with filesystem.open_output_stream(path) as f:
        f.write(text.encode())
