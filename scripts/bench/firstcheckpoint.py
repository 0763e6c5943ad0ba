"""First-checkpoint mode: a job's first checkpoint and big increments, ours vs Structured Streaming.

For every size in ``sizes`` a fresh job on each side (ours, and Structured Streaming
``availableNow`` on RocksDB with changelog checkpointing): checkpoint 1 holds every one of
``size`` keys once (the first checkpoint of a job, a backfill, a catch-up after downtime),
each later one ``events`` events over random keys. All jobs run in one process and one
SparkSession, the sides alternating per increment (:func:`bench.inprocess.run_job`); every
output is checked against a pandas ground truth. Our first checkpoint of the first size is
profiled (:mod:`bench.breakdown`; the profiler adds a little to it), or its increment ``BENCH_PROFILE``
(environment, counted from 1) when set.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench import breakdown
from bench.inprocess import run_job, start_run, warm_up
from bench.measure import log
from bench.report import machine_lines, med, verdict
from bench.workloads import DataSpec, generate

STORES = ("rocksdb",)
TARGET = 0.8
"""Time ours/SS at most this for first checkpoints and big increments (issue #35)."""


def run(
    sizes: list[int], events: int, increments: int, work: Path, seed: int, pages: int, repeats: int = 1
) -> dict[str, Any]:
    """Every size's job on both sides in one session, then ``repeats - 1`` more fresh jobs per size that
    run the first checkpoint only (the side that starts alternating); the raw figures (JSON-able)."""
    specs = [DataSpec("large-state", increments, events, size, pages, seed) for size in sizes]
    files = {spec.users: generate(work / "data" / f"first-checkpoint-{spec.users}", spec) for spec in specs}
    run_dir = work / "run" / "first-checkpoint"
    measured = start_run(run_dir)
    warm_up(measured.spark, run_dir, files[sizes[0]][0], STORES)
    jobs = []
    for n, spec in enumerate(specs):
        log(f"job of {spec.users:,} keys")
        job = run_job(
            measured.spark,
            spec,
            files[spec.users],
            run_dir / f"keys-{spec.users}",
            int(os.environ.get("BENCH_PROFILE", 1)) if n == 0 else 0,
            STORES,
        )
        firsts = [job["rows"][0]]
        for again in range(1, repeats):
            log(f"first checkpoint of {spec.users:,} keys, fresh job {again + 1} of {repeats}")
            one = run_job(
                measured.spark,
                replace(spec, increments=1),
                files[spec.users][:1],
                run_dir / f"keys-{spec.users}-again-{again}",
                0,
                STORES,
                rotate=again,
            )
            firsts.append(one["rows"][0])
            job["problems"].update({f"{side} (again {again})": p for side, p in one["problems"].items()})
        jobs.append({"spec": spec, **job, "firsts": firsts})
    return {
        **measured.finish(),
        "jobs": jobs,
        "problems": {f"{job['spec'].users}/{side}": p for job in jobs for side, p in job["problems"].items()},
    }


def render(result: dict[str, Any]) -> str:
    """Per job and increment: our phases, both sides' seconds and the ratio; the targets; the breakdown."""
    ss = f"ss-{STORES[0]}"
    table = [
        f"| keys | inc | events | ours: trigger / step / finalize s | **ours s** | {ss} s | **ours/{ss}** |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    firsts: list[tuple[int, float]] = []
    later: list[tuple[int, float]] = []
    for job in result["jobs"]:
        for again, r in enumerate([*job["rows"], *job["firsts"][1:]]):
            o, ratio = r["ours"], r["ours"].seconds / max(r[ss].seconds, 1e-9)
            (later if r["increment"] > 1 else firsts).append((job["spec"].users, ratio))
            inc = f"1 (fresh job {again - len(job['rows']) + 2})" if again >= len(job["rows"]) else r["increment"]
            table.append(
                f"| {job['spec'].users:,} | {inc} | {r['events']:,} | "
                f"{o.parts['trigger']:.2f} / {o.parts['step']:.2f} / {o.parts['finalize']:.2f} | "
                f"**{o.seconds:.2f}** | {r[ss].seconds:.2f} | **{ratio:.2f}** |"
            )
    targets = []
    for job in result["jobs"]:
        k = job["spec"].users
        ratios = [v for size, v in firsts if size == k]
        each = (
            f" (median of {len(ratios)} fresh jobs: {', '.join(f'{v:.2f}' for v in ratios)})" if len(ratios) > 1 else ""
        )
        targets.append(f"- First checkpoint of {k:,} events, ours/{ss}{each}: {verdict(med(ratios), TARGET)}")
    if later:
        events = result["jobs"][0]["spec"].events
        targets.append(
            f"- Increments of {events:,} events, ours/{ss} (median of {len(later)}, worst "
            f"{max(v for _, v in later):.2f}): {verdict(med([v for _, v in later]), TARGET)}"
        )
    correct = (
        "Every output equals the pandas ground truth ("
        + ", ".join(f"{job['truth_rows']:,}" for job in result["jobs"])
        + " keys)."
        if not result["problems"]
        else "**Outputs do NOT match the ground truth: " + ", ".join(result["problems"]) + "** — figures invalid."
    )
    first = result["jobs"][0]
    profiled = first["rows"][int(os.environ.get("BENCH_PROFILE", 1)) - 1]["ours"]
    return "\n".join(
        [
            "### first checkpoint and big increments",
            "",
            f"One fresh job per size and side, and {len(first['firsts']) - 1} more per size that run only "
            f"the first checkpoint (the side that starts alternating); checkpoint 1 holds every key once, "
            f"each later one {first['spec'].events:,} events over random keys; {first['spec'].pages:,} pages, seed "
            f"{first['spec'].seed}. Ours vs Structured Streaming `availableNow` on RocksDB with changelog "
            f"checkpointing, in one process and one SparkSession, the sides alternating. {correct}",
            "",
            *machine_lines(result),
            f"- Wall time {result['wall_seconds']}s",
            "",
            "**Targets**",
            "",
            *targets,
            "",
            "**Time per checkpoint**",
            "",
            *table,
            "",
            breakdown.render(profiled.info["breakdown"], 1, profiled.parts).replace(
                "(increment 1,", f"(the first checkpoint of {first['spec'].users:,} keys,", 1
            ),
        ]
    )
