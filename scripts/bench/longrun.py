"""Long-run mode: many small checkpoints of one job, timing each phase and sizing ``_metadata``.

A job's age must not cost: per-checkpoint time and ``_metadata`` size should stay flat.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from bench.inprocess import machine_facts, start_spark
from bench.measure import log
from bench.sides import Ours
from bench.workloads import DataSpec, generate, land


def run(spec: DataSpec, work: Path) -> dict[str, Any]:
    """Run ``spec.increments`` checkpoints of our side only; one row per checkpoint."""
    files = generate(work / "data" / f"long-run-{spec.workload}", spec)
    run_dir = work / "run" / "long-run"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    landing = run_dir / "landing"
    landing.mkdir(parents=True)
    spark, session_seconds = start_spark()
    facts = machine_facts(spark, session_seconds)
    # a long-lived job moves what it read out of the landing directory, so its source position stays small
    ours = Ours(spark, run_dir / "ours", landing, clean_source="archive")
    rows: list[dict[str, Any]] = []
    for i, data_file in enumerate(files, start=1):
        land(data_file, landing)
        r = ours.run(i)
        rows.append({"checkpoint": i, **r.parts, "seconds": r.seconds, "metadata_bytes": r.info["metadata_bytes"]})
        if i % 10 == 0 or i == 1:
            log(f"checkpoint {i}: {r.seconds:.2f}s, _metadata {r.info['metadata_bytes']:,} B")
    spark.stop()
    return {"spec": spec, "machine": facts, "rows": rows}


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Time per phase (stacked) and ``_metadata`` size per checkpoint, as a PNG."""
    try:
        import matplotlib
    except ImportError as e:
        raise SystemExit(
            "the long-run mode plots with matplotlib: install the bench extra, "
            '`.venv/bin/uv pip install --python .venv/bin/python -c constraints.txt -e ".[bench]"`'
        ) from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [r["checkpoint"] for r in rows]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    parts = ["trigger", "step", "finalize"]
    top.stackplot(x, *[[r[p] for r in rows] for p in parts], labels=parts)
    top.set_ylabel("seconds per checkpoint")
    top.set_ylim(bottom=0)
    top.legend(loc="upper left")
    bottom.plot(x, [r["metadata_bytes"] / 1000 for r in rows], color="black")
    bottom.set_ylabel("_metadata size (kB)")
    bottom.set_ylim(bottom=0)
    bottom.set_xlabel("checkpoint")
    fig.suptitle(f"{len(rows)} checkpoints of one job")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
