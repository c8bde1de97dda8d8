"""A stubbed Hugging Face Hub for tests: a local dataset directory the same ``datasets`` calls read
(``TASKSPEC_HUB_<NAME>`` points the Hub step at it; there is no network here), with the split's
``num_examples`` in its card's metadata, as the Hub's own cards give it."""
from __future__ import annotations

import json
from pathlib import Path

# the split and a row of each corpus, as the real Hub data set has them (drafters.data.sources.HUB_IDS)
ROWS = {
    "sharegpt": lambda i: {"id": f"stub{i}", "conversations": [{"from": "human", "value": f"Question {i}?"},
                                                             {"from": "gpt", "value": f"Answer {i}."}]},
    "mathinstruct": lambda i: {"instruction": f"What is {i} + {i}?", "output": f"{i} + {i} = {2 * i}."},
}


def stub_hub(root: Path, name: str, rows: int) -> Path:
    """A local copy of corpus ``name``'s Hub data set with ``rows`` rows: README.md (the card, its
    dataset_info naming the train split's num_examples) and data/train.jsonl."""
    d = Path(root) / f"{name}_hub"
    (d / "data").mkdir(parents=True, exist_ok=True)
    with open(d / "data/train.jsonl", "w") as f:
        for i in range(rows):
            f.write(json.dumps(ROWS[name](i)) + "\n")
    size = (d / "data/train.jsonl").stat().st_size
    (d / "README.md").write_text(
        "---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n    path: data/train.jsonl\n"
        f"dataset_info:\n  splits:\n  - name: train\n    num_examples: {rows}\n    num_bytes: {size}\n---\n"
        f"# stub of {name}\n")
    return d


def paper_hub_env(root: Path, rows: int = 70_512) -> dict:
    """Environment variables that point the Hub step of both training corpora at stubs holding the
    paper profile's n + heldout: a dry run or preflight of ``paper`` finds its data without a network."""
    return {f"TASKSPEC_HUB_{name.upper()}": str(stub_hub(root, name, rows)) for name in ROWS}
