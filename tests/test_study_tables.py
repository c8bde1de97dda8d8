"""The study's tables as data (orchestrator/report/study_tables.csv): every Table 1 cell at T=0 and
T=1, one row per source where the paper and TAPS's README disagree, a loader that stops on a
malformed row with one error, and the report's comparison reading it."""
from __future__ import annotations

import re
from pathlib import Path

import polars as pl
import pytest

from orchestrator.report import study_tables as st
from orchestrator.report.claims import study as cs

ROOT = Path(__file__).parents[1]
HEADER = ",".join(st.COLUMNS)


def test_table1_has_every_cell_of_both_temperatures():
    """7 rows x 2 backbones x (4 benchmarks + average) x 2 temperatures = 140 cells, each once per source."""
    tau = [c for c in st.cells() if c.quantity == "tau"]
    cells = {(c.backbone, c.row, c.benchmark, c.temperature) for c in tau}
    assert len(cells) == 140
    assert {c.row for c in tau} == {"MathInstruct", "ShareGPT", "Mixed 35k+35k", "Mixed 70k+70k", "Averaged",
                                    "Confidence Routed", "Merged Trees"}
    readme = {(c.backbone, c.row, c.benchmark, c.temperature) for c in tau if "TAPS README" in c.source}
    assert readme == cells  # the README gives all of them
    got = {(c.backbone, c.row, c.benchmark, c.temperature, c.source): c.value for c in tau}
    assert got[("hass", "MathInstruct", "svamp", 0.0, "TAPS README")] == 3.13
    assert got[("hass", "ShareGPT", "svamp", 0.0, "TAPS README")] == 4.44
    assert got[("eagle2", "Averaged", "average", 1.0, "TAPS README")] == 2.34
    assert got[("hass", "MathInstruct", "gsm8k", 0.0, "paper Table 1 and TAPS README")] == 5.02
    # tables 2-4 where they hold numbers
    assert {c.table for c in st.cells()} >= {"1", "2", "3-4"}
    assert sum(c.quantity == "matched_share" for c in st.cells()) == 8


def test_the_csv_states_the_tau_convention():
    text = st.CSV_PATH.read_text()
    assert "compute_tau.py" in text and "tau_taps" in text and "bonus token" in text


def _disagreements() -> list:
    """(paper's row, README's row) for every cell the two sources give with different values."""
    by = {}
    for c in st.cells():
        by.setdefault((c.quantity, c.backbone, c.row, c.benchmark, c.temperature), []).append(c)
    out = []
    for group in by.values():
        paper = [c for c in group if c.from_paper]
        readme = [c for c in group if not c.from_paper and c.source.startswith(st.README)]
        out += [(p, r) for p in paper for r in readme if p.value != r.value]
    return out


def test_paper_and_readme_disagreements_are_kept_and_documented():
    """Both rows are kept; the paper's number is the one the claims read; docs/study.md lists each."""
    dis = _disagreements()
    assert [(p.backbone, p.row, p.benchmark, p.temperature, p.value, r.value) for p, r in dis] == \
        [("eagle2", "Merged Trees", "average", 0.0, 5.03, 5.02)]
    assert st.tau_of("eagle2", 0.0, "merged", "average")[0] == 5.03
    doc = (ROOT / "docs" / "study.md").read_text()
    section = doc[doc.index("## Study tables: where the paper and TAPS disagree"):]
    section = section[: section.find("\n## ", 5)] if "\n## " in section[5:] else section
    for p, r in dis:
        assert re.search(rf"{p.row}.*{p.value:.2f}.*{r.value:.2f}", section), (p, r)


@pytest.mark.parametrize("line,problem", [
    ("1,tau,hass,MathInstruct,gsm8k,0,5.02", "expected the 8 columns"),
    ("1,tau,hass,MathInstruct,humaneval,0,5.02,paper", "benchmark 'humaneval' is not one of"),
    ("1,tau,hass,Math,gsm8k,0,5.02,paper", "row 'Math' is not one of"),
    ("1,tau,hass,MathInstruct,gsm8k,0,five,paper", "must be numbers"),
    ("1,tau,hass,MathInstruct,gsm8k,0.7,5.02,paper", "temperature 0.7 is not one of"),
    ("1,tau,hass,MathInstruct,gsm8k,0,-1,paper", "must be >= 0 for quantity tau (only the gaps"),
    ("1,tau,hass,MathInstruct,gsm8k,0,inf,paper", "must be a finite number"),
    ("1,tau,hass,MathInstruct,gsm8k,0,5.02,", "source must not be empty"),
    ("1,tau,hass,MathInstruct,gsm8k,0,5.03,paper Table 1", "repeats the cell of line 3"),
])
def test_a_malformed_row_is_one_clear_error(tmp_path, line, problem):
    f = tmp_path / "t.csv"
    f.write_text(f"# comment\n{HEADER}\n1,tau,hass,MathInstruct,gsm8k,0,5.02,paper Table 1\n{line}\n")
    with pytest.raises(ValueError, match="line 4: ") as e:
        st.load(f)
    assert problem in str(e.value) and str(f) in str(e.value)
    f.write_text("table,quantity,backbone,row,benchmark,value,source\n")
    with pytest.raises(ValueError, match="header"):
        st.load(f)


def test_the_comparison_reads_the_csv_and_the_taps_column():
    t1 = pl.DataFrame([{"backbone": "hass", "temperature": 1.0, "method": "math", "benchmark": "svamp",
                        "tau": 1.5,
                        "tau_taps": 2.0}])
    cmp = st.study_comparison(t1)
    assert cmp.height == sum(c.quantity == "tau" for c in st.cells()) == 141
    row = cmp.filter((pl.col("backbone") == "hass") & (pl.col("temperature") == 1.0)
                     & (pl.col("method") == "math") & (pl.col("benchmark") == "svamp")).row(0, named=True)
    assert row["study_tau"] == 2.46 and row["source"] == "TAPS README"
    assert row["our_tau_taps"] == 2.0 and row["diff"] == pytest.approx(2.0 - 2.46)
    assert "`tau_taps` is ours in the study's convention" in st.comparison_note(t1)
    # another column by name; a missing one leaves the comparison empty and says so
    named = st.study_comparison(t1.rename({"tau_taps": "tau_x"}), column="tau_x")
    assert named["our_tau_x"].drop_nulls().to_list() == [2.0, 2.0]  # the svamp cell and the average
    bare = st.study_comparison(t1.drop("tau_taps"))
    assert bare["our_tau_taps"].null_count() == bare.height and bare["diff"].null_count() == bare.height
    assert "has no `tau_taps` column" in st.comparison_note(t1.drop("tau_taps"))


def test_entropy_gaps_are_signed(tmp_path):
    """Table 4 reports rejected - accepted gaps below 0 for some checkpoints: a gap may be negative."""
    f = tmp_path / "t.csv"
    f.write_text(f"{HEADER}\n4,draft_entropy_gap,hass,Averaged,gsm8k,0,-0.5,paper Table 4\n"
                 "4,verifier_entropy_gap,hass,Averaged,gsm8k,0,-0.25,paper Table 4\n")
    cells = st.load(f)
    assert [c.value for c in cells] == [-0.5, -0.25]


def test_the_backbones_evidence_orders_the_methods_the_run_compares():
    """The study's side of the `backbones` claim is ordered over the same methods as the run's side."""
    every = cs.backbones(0.0)["study"]
    assert "Averaged" in every and "Mixed 35k+35k" in every
    three = cs.backbones(0.0, ["math", "chat", "merged", "hedge(step)"])["study"]
    assert three.count(" > ") == 4 and "Averaged" not in three and "Merged trees" in three, three
