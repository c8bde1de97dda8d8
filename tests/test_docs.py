"""The documentation stays an entry point, its links resolve, and nothing is dated by a work round.

Fast: reads files only (no Ray, no model). The README's job-submit block itself is run by
tests/test_grid.py; here only that it is still found where that test looks for it."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

from orchestrator.plan.sizing import load_profile
from tests.test_grid import _readme_job_block

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
# where the evidence lives: one document per subject, each linked from the README
EVIDENCE = {"study.md", "performance.md", "cluster.md", "design.md", "training.md", "bad-input.md",
            "report.md", "testing.md"}
# a result dated by a numbered work round or session (the word "session" or "round" and then a number),
# which cannot be checked against the history; dates and commits say when instead
ROUND = re.compile(r"\b(session|round) ?[0-9]+", re.IGNORECASE)
# [text](target) in markdown, not inside inline code
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _relative_links(path: Path) -> list[str]:
    text = re.sub(r"`[^`\n]*`", "", path.read_text())
    return [t for t in LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]


def test_readme_is_a_short_entry_point_and_keeps_the_blocks_other_tests_run():
    text = README.read_text()
    assert len(text.splitlines()) < 350, f"README.md has {len(text.splitlines())} lines; move detail to docs/"
    block = _readme_job_block()  # exactly as tests/test_grid.py extracts it (and then runs it)
    assert "RAY_AUTH_MODE=token" in block and "ray start --head" in block
    assert "ray job submit" in block and "experiments/full_grid.py --profile smoke" in block
    quick = text.split("## Quick start", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    assert quick[0].startswith("make demo") and quick[1].startswith("make test"), quick
    for metric in ("ray_taskspec_units_done_total", "ray_taskspec_acceptance_length"):
        assert f"`{metric}{{" in text, metric  # tests/test_grid.py checks these names against a live run


def test_the_readmes_example_profile_loads(tmp_path):
    """The "Writing your own" example goes through the same validation as any profile."""
    text = README.read_text().split("## Profiles", 1)[1]
    example = tmp_path / "my-study.yaml"
    example.write_text(text.split("```yaml\n", 1)[1].split("```", 1)[0])
    p = load_profile(str(example))
    assert p.name == "my-study" and list(p.train.variants) == ["math", "chat", "mixed_half"]
    assert p.eval.benchmarks == {"gsm8k": 20, "mt_bench": 20}


def test_the_readme_links_every_doc_and_every_relative_link_resolves():
    names = {p.name for p in DOCS}
    assert EVIDENCE <= names, f"docs/ lacks {sorted(EVIDENCE - names)}"
    linked = {(ROOT / t.split("#", 1)[0]).resolve() for t in _relative_links(README)}
    assert not [p.name for p in DOCS if p.resolve() not in linked], "docs the README does not link"
    broken = [f"{path.relative_to(ROOT)} -> {target}" for path in [README, *DOCS]
              for target in _relative_links(path) if not (path.parent / target.split("#", 1)[0]).exists()]
    assert not broken, "links to missing files:\n" + "\n".join(broken)


def test_no_tracked_file_dates_anything_by_a_numbered_round():
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    found = []
    for name in filter(None, files.decode().split("\0")):
        path = ROOT / name
        if name == "tests/test_docs.py" or not path.is_file():
            continue
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue  # binary data
        found += [f"{name}:{n}: {line.strip()}" for n, line in enumerate(text.splitlines(), 1)
                  if ROUND.search(line)]
    assert not found, "dated by a work round (use the date and commit):\n" + "\n".join(found)
