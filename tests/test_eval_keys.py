"""Eval unit keys name each drafter by its place in the run, not by the run's location: a run moved
to another directory or copied to a URI resumes without evaluating anything again."""
import shutil

from common.verifiers import resolve
from orchestrator.grid import eval_cells, merge_cells, train_cells
from orchestrator.plan.sizing import load_profile
from orchestrator.run.driver import Driver


def _keys(output: str, sets=()) -> list[list[str]]:
    d = Driver(load_profile("smoke", list(sets)), output)
    d.verifier_name = resolve(d.p.verifier).name  # (set by Driver.run's preflight)
    try:
        names = [c.name for c in train_cells(d.p)] + [m.name for m in merge_cells(d.p)]
        ckpts = {n: d.ref(f"checkpoints/{n}/final") for n in names}
        assert all(not m for *_, m in d._eval_units(ckpts)), "every cell's drafters are known"
        return [keys for _, _, keys, _ in d._eval_units(ckpts)]
    finally:
        d.lease.release()


def test_eval_keys_do_not_depend_on_where_the_run_lives(tmp_path, monkeypatch):
    monkeypatch.setenv("TASKSPEC_STAGING", str(tmp_path / "staging"))
    a = _keys(str(tmp_path / "a"))
    b = _keys(str(tmp_path / "moved" / "b"))
    c = _keys(f"file://{tmp_path / 'bucket' / 'run'}")
    assert len(a) == len(b) == len(c) > len(eval_cells(load_profile("smoke"))) // 2
    assert [k[0] for k in a] == [k[0] for k in b] == [k[0] for k in c]
    # the second key is the one runs wrote before keys were relative: still found done, per location
    with_drafters = [i for i, k in enumerate(a) if k[0] != k[1]]
    assert with_drafters and all(a[i][1] != b[i][1] for i in with_drafters)
    shutil.rmtree(tmp_path / "staging", ignore_errors=True)


def test_a_system_prompt_reaches_the_keys_only_when_set(tmp_path, monkeypatch):
    """eval.system_prompt changes what is decoded, so it is part of every eval key; unset, the keys are
    the ones runs had before the setting existed."""
    monkeypatch.setenv("TASKSPEC_STAGING", str(tmp_path / "staging"))
    base = _keys(str(tmp_path / "a"))
    with_system = _keys(str(tmp_path / "a"), ["eval.system_prompt='You are a careful tutor.'"])
    assert len(base) == len(with_system) and all(a[0] != b[0] for a, b in zip(base, with_system))
    assert load_profile("paper").eval.system_prompt.startswith("You are a helpful, respectful and honest "
                                                               "assistant.")
