"""The benchmark's data and report plumbing (scripts/bench): pure Python, no Spark."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from bench.report import markers, write_doc  # noqa: E402
from bench.workloads import DataSpec  # noqa: E402


def test_large_state_builds_every_key_then_changes_a_small_share() -> None:
    spec = DataSpec("large-state", increments=3, events=40, users=2_000, pages=5, seed=1)
    first, later = spec.increment(1), spec.increment(2)
    assert len(first) == 2_000 and first["user"].nunique() == 2_000
    assert len(later) == 40 and later["user"].nunique() / 2_000 <= 0.02
    assert set(later["user"]) <= set(first["user"])
    assert later.equals(spec.increment(2))  # deterministic in (seed, i)
    assert first["ts"].max() < later["ts"].min()  # timestamps rise across increments


def test_unknown_workload_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown workload 'tiny'"):
        DataSpec("tiny", 1, 1, 1, 1, 1)


def test_write_doc_replaces_only_its_own_section(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    a_start, a_end = markers("clickstream")
    b_start, b_end = markers("long-run")
    doc.write_text(f"# head\n{a_start}\nold a\n{a_end}\n\n{b_start}\nold b\n{b_end}\n\n## tail\n")
    write_doc(doc, "clickstream", "new a")
    write_doc(doc, "large-state", "new c")
    text = doc.read_text()
    assert "new a" in text and "old a" not in text and "old b" in text and "## tail" in text
    assert text.index("## tail") < text.index("new c")  # a missing section is appended


def test_every_tenth_compares_each_compaction_checkpoint_with_its_nine_predecessors() -> None:
    from bench.tasks import every_tenth

    # checkpoint 1 (the whole key set) is slow and left out; 11 and 21 over checkpoints 2-10 and 12-20
    seconds = {1: 50.0, **{n: 2.0 for n in range(2, 26)}, 11: 4.0, 21: 5.0}
    rows = [{"checkpoint": n, "s": s} for n, s in seconds.items()]
    assert every_tenth(rows, lambda r: r["s"]) == pytest.approx([2.0, 2.5])
    # a checkpoint missing one of its predecessors gives no ratio
    assert every_tenth([r for r in rows if r["checkpoint"] != 15], lambda r: r["s"]) == pytest.approx([2.0])
