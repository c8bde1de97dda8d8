"""Preflight: everything a run will need from outside, resolved before any work starts.

Each benchmark the profile evaluates and each corpus its variants train on must be found (local
data root, data package or Hub metadata: ``drafters.data.sources.locate``, no rows read), and
the verifier must resolve: the GGUF file of a GGUF verifier is there (its header is read, not its
weights), any other verifier's config loads. A missing benchmark is reported here, before hours of
training, not when evaluation starts. Each problem is one line; all of them are reported together.
Checked on the driver's node: workers on other nodes resolve the same names on theirs.
"""
from __future__ import annotations

import os
from pathlib import Path

from drafters.data.sources import DataSourceNotFound, SourceOptions, locate

from .grid import corpora
from .profile import Profile

GGUF_MAGIC = b"GGUF"


class PreflightError(RuntimeError):
    """What the run would miss, one line per problem (``problems``)."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())


def _data(p: Profile, options: SourceOptions) -> tuple[list[str], list[str]]:
    """(found lines, problem lines) for every benchmark and training corpus of ``p``."""
    needs = [(b, "eval.benchmarks") for b in p.eval.benchmarks] + [(c, "train.variants") for c in corpora(p)]
    found, problems = [], []
    for name, key in needs:
        try:
            found.append(f"{name}: {locate(name, options)}")
        except DataSourceNotFound as e:
            problems.append(f"{key}: {_one_line(e)}")
    return found, problems


def _verifier(p: Profile) -> tuple[list[str], list[str]]:
    """The verifier resolves: the GGUF file is there and is a GGUF file, or the config loads."""
    from decoding.verifiers import resolve, verifier_config

    try:
        source = resolve(p.verifier)
    except (ValueError, FileNotFoundError) as e:
        return [], [f"verifier {p.verifier!r}: {_one_line(e)}"]
    if source.gguf_file:  # AutoConfig would parse the whole GGUF file (~10 s): its header says enough
        path = Path(source.path) / source.gguf_file
        try:
            with open(path, "rb") as f:
                magic = f.read(4)
        except OSError as e:
            return [], [f"verifier {p.verifier!r}: cannot read {path}: {_one_line(e)}"]
        if magic != GGUF_MAGIC:
            return [], [f"verifier {p.verifier!r}: {path} is not a GGUF file (starts with {magic!r})"]
        return [f"verifier: {path}"], []
    try:
        _, meta = verifier_config(p.verifier)
    except Exception as e:  # noqa: BLE001 - what stops the config (network, gated, no file) is the problem
        token = "" if os.environ.get("HF_TOKEN") else " (HF_TOKEN is not set)"
        return [], [f"verifier {p.verifier!r}: its config does not load from {source.path}{token}: "
                    f"{type(e).__name__}: {_one_line(e)[:300]}"]
    return [f"verifier: {meta['name_or_path']} ({', '.join(map(str, meta['architectures']))})"], []


def preflight(p: Profile, options: SourceOptions | None = None) -> list[str]:
    """Resolve every data set and the verifier's config of ``p``; returns one line per thing found.
    Raises :class:`PreflightError` listing every problem (one line each) when anything is missing."""
    found, problems = _data(p, options or SourceOptions())
    vfound, vproblems = _verifier(p)
    if problems or vproblems:
        raise PreflightError(problems + vproblems)
    return found + vfound
