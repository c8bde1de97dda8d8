"""Whether the Hugging Face Hub can be reached, decided before any Hub call, so that an offline
machine gets one line at once instead of the libraries' retries (about 23 s a data set, 28 s a
verifier's config).

``HF_HUB_OFFLINE`` / ``HF_DATASETS_OFFLINE`` set: offline, no network call at all. Otherwise one
HEAD request to the endpoint (``$HF_ENDPOINT``, else https://huggingface.co; proxies as urllib
reads them from the environment), answered within ``PROBE_TIMEOUT_S`` or the Hub counts as
unreachable; the answer is kept for the process. Any HTTP answer, whatever its status, is reachable:
nothing changes for a machine that reaches the Hub. A local path is never probed. Used by the data
sources (drafters/data/hub.py) and the verifier's loader (common/verifiers.py).
"""
from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

DEFAULT_ENDPOINT = "https://huggingface.co"
PROBE_TIMEOUT_S = 2.0
OFFLINE_VARS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
_TRUE = {"1", "ON", "YES", "TRUE"}
_PROBED: dict[str, str | None] = {}  # endpoint -> None (it answered) or why not
_LOCK = threading.Lock()


def endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def offline_var() -> str | None:
    """The offline variable that is set to a true value, if any (as huggingface_hub reads them)."""
    return next((v for v in OFFLINE_VARS if os.environ.get(v, "").strip().upper() in _TRUE), None)


def _head(url: str, timeout: float) -> str | None:
    """None when ``url`` answers a HEAD request with any HTTP status, else why not (a few words).
    The certificate is not checked: the question is whether the host answers, and nothing is sent."""
    import ssl
    import urllib.error
    import urllib.request

    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=ctx))  # + env proxies
    try:
        with opener.open(urllib.request.Request(url, method="HEAD"), timeout=timeout):
            return None
    except urllib.error.HTTPError:
        return None
    except Exception as e:  # noqa: BLE001 - whatever stops the request is the answer
        why = getattr(e, "reason", e)
        return " ".join(f"{type(why).__name__}: {why}".split())[:120]


def probe(url: str, timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """:func:`_head` bounded in wall time too (name resolution ignores socket timeouts)."""
    out = [f"no answer within {timeout:g} s"]

    def run():
        out[0] = _head(url, timeout)

    t = threading.Thread(target=run, name="hub-probe", daemon=True)
    t.start()
    t.join(timeout + 1.0)
    return out[0]


def unreachable() -> tuple[str, str] | None:
    """None when the Hub can be called, else (why, what to do): offline by the environment (no
    network call), or the endpoint's probe failed (one probe per endpoint per process)."""
    var = offline_var()
    if var:
        return f"offline, {var}={os.environ[var]}", f"unset {var}"
    url = endpoint()
    with _LOCK:
        if url not in _PROBED:
            _PROBED[url] = probe(url)
        why = _PROBED[url]
    return None if why is None else (f"{url} unreachable, {why}", f"a network that reaches {url}")


def is_local(path: str) -> bool:
    """A filesystem path, not a Hub id (owner/name): never probed."""
    return Path(path).exists() or os.path.isabs(path) or path.startswith((".", "~"))


@contextmanager
def offline_library() -> Iterator[None]:
    """huggingface_hub in offline mode for one call (its cache only: not even the user-agent registry
    it fetches on its first request), its logs quiet. The environment variable alone is read once, at
    import: a process that imported the library before it was set would still reach out."""
    import huggingface_hub.constants as hub_constants

    saved, log = hub_constants.HF_HUB_OFFLINE, logging.getLogger("huggingface_hub")
    level = log.level
    hub_constants.HF_HUB_OFFLINE = True
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        hub_constants.HF_HUB_OFFLINE = saved
        log.setLevel(level)
