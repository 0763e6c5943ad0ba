"""First-checkpoint mode: a job's first checkpoint and big increments, ours vs Structured Streaming.

For every size in ``sizes`` and every round, one fresh job per side, each side in a fresh process
of its own (its own JVM, as a user runs a job; the order of the two processes alternates per round):
checkpoint 1 holds every one of ``size`` keys once (the first checkpoint of a job, a backfill, a
catch-up after downtime), each later one ``events`` events over random keys. Ours runs trigger →
step → finalize in process; the other side is Structured Streaming ``availableNow`` on RocksDB with
changelog checkpointing. Both sides' sessions are the provider's embedded one with the JIT a step
reading the first checkpoint's input gets, and each process first warms up its own side with a
small increment. Every output is checked against a pandas ground truth. Every one of our checkpoints
is profiled (:mod:`bench.breakdown`; the profiler adds a little to our side's time): its nodes' and Spark
jobs' seconds per checkpoint, and the whole breakdown of the first size's first checkpoint in round 1, or
of its increment ``BENCH_PROFILE`` (environment, counted from 1) when set.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench import breakdown
from bench.measure import CpuMeter, elapsed, log
from bench.report import machine_lines, med, verdict
from bench.sides import SideResult
from bench.workloads import DataSpec, generate

STORE = "rocksdb"
SS = f"ss-{STORE}"
SIDES = ("ours", SS)
TARGET = 0.5
"""Time ours/SS at most this for first checkpoints and big increments (issue #54)."""


def run(
    sizes: list[int], events: int, increments: int, work: Path, seed: int, pages: int, repeats: int = 1
) -> dict[str, Any]:
    """Every size's job ``repeats`` times on each side, each side in a fresh process; the raw figures (JSON-able)."""
    specs = [DataSpec("large-state", increments, events, size, pages, seed) for size in sizes]
    files = {spec.users: generate(work / "data" / f"first-checkpoint-{spec.users}", spec) for spec in specs}
    run_dir = work / "run" / "first-checkpoint"
    load_before, cpu_all, started = os.getloadavg(), CpuMeter(), time.perf_counter()
    jobs, facts = [], {}
    for spec in specs:
        rounds = []
        for r in range(repeats):
            order = SIDES if r % 2 == 0 else SIDES[::-1]
            by_side = {}
            for side in order:
                log(f"job of {spec.users:,} keys, round {r + 1} of {repeats}: {side} in a fresh process")
                root = run_dir / f"keys-{spec.users}-{r}-{side}"
                by_side[side] = _fresh_process(spec, files[spec.users], side, root)
                facts = facts or by_side[side]["machine"]
            rows = [
                {
                    "increment": i + 1,
                    "events": row["events"],
                    **{side: SideResult(**by_side[side]["rows"][i][side]) for side in SIDES},
                }
                for i, row in enumerate(by_side["ours"]["rows"])
            ]
            for i, row in enumerate(rows, start=1):
                log(f"  increment {i}: ours/{SS} {row['ours'].seconds / row[SS].seconds:.2f}")
            problems = {f"{side} (round {r + 1})": p for side in SIDES for p in by_side[side]["problems"].values()}
            rounds.append({"order": list(order), "rows": rows, "problems": problems})
        truth_rows = by_side["ours"]["truth_rows"]
        jobs.append({"spec": spec, "rounds": rounds, "truth_rows": truth_rows})
    return {
        "machine": facts,
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "other_processes_cores": round(cpu_all.stop()[1], 2),
        "wall_seconds": round(elapsed(started), 1),
        "jobs": jobs,
        "problems": {
            f"{job['spec'].users}/{k}": p for job in jobs for rnd in job["rounds"] for k, p in rnd["problems"].items()
        },
    }


def _fresh_process(spec: DataSpec, files: list[Path], side: str, root: Path) -> dict[str, Any]:
    """Run ``side``'s job in a new Python process (and JVM); its figures."""
    args = {"spec": asdict(spec), "files": [str(f) for f in files], "side": side, "root": str(root)}
    out = subprocess.run(
        [sys.executable, __file__, json.dumps(args)],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])},
        stdout=subprocess.PIPE,
        text=True,
        check=True,
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def _child(args: dict[str, Any]) -> None:
    """In the fresh process: the session, one side's warm-up, its job; the figures as one JSON line on stdout."""
    from bench.inprocess import run_job, start_run, warm_up

    spec, files, ours = DataSpec(**args["spec"]), [Path(f) for f in args["files"]], args["side"] == "ours"
    stores = () if ours else (STORE,)
    root = Path(args["root"])
    measured = start_run(root, input_bytes=files[0].stat().st_size)
    warm_up(measured.spark, root, files[0], stores, ours)
    job = run_job(measured.spark, spec, files, root / "job", -1, stores, ours=ours)
    job["rows"] = [{**row, args["side"]: asdict(row[args["side"]])} for row in job["rows"]]
    print(json.dumps({**job, **measured.finish()}, default=str))


def render(result: dict[str, Any]) -> str:
    """Per job, round and increment: our phases, both sides' seconds and the ratio; the targets; the breakdown."""
    table = [
        f"| keys | round (first process) | inc | events | ours: trigger / step / finalize s | **ours s** | {SS} s "
        f"| **ours/{SS}** |",
        "|---:|:--|---:|---:|---:|---:|---:|---:|",
    ]
    targets, later = [], []
    for job in result["jobs"]:
        firsts = []
        for r, rnd in enumerate(job["rounds"], start=1):
            for row in rnd["rows"]:
                o, ratio = row["ours"], row["ours"].seconds / max(row[SS].seconds, 1e-9)
                (later if row["increment"] > 1 else firsts).append(ratio)
                table.append(
                    f"| {job['spec'].users:,} | {r} ({rnd['order'][0]}) | {row['increment']} | {row['events']:,} | "
                    f"{o.parts['trigger']:.2f} / {o.parts['step']:.2f} / {o.parts['finalize']:.2f} | "
                    f"**{o.seconds:.2f}** | {row[SS].seconds:.2f} | **{ratio:.2f}** |"
                )
        targets.append(
            f"- First checkpoint of {job['spec'].users:,} events, ours/{SS} (median of {len(firsts)} fresh jobs: "
            f"{', '.join(f'{v:.2f}' for v in firsts)}): {verdict(med(firsts), TARGET)}"
        )
    first = result["jobs"][0]
    phases = [
        "| keys | round | inc | ours: source / state / sink s | JVM GC s "
        "| Spark jobs: s each (call site of the longest) |",
        "|---:|---:|---:|---:|---:|:--|",
        *(
            _phases(job["spec"].users, r, row)
            for job in result["jobs"]
            for r, rnd in enumerate(job["rounds"], start=1)
            for row in rnd["rows"]
        ),
    ]
    if later:
        targets.append(
            f"- Increments of {first['spec'].events:,} events, ours/{SS} (median of {len(later)}: "
            f"{', '.join(f'{v:.2f}' for v in later)}): {verdict(med(later), TARGET)}"
        )
    correct = (
        "Every output equals the pandas ground truth ("
        + ", ".join(f"{job['truth_rows']:,}" for job in result["jobs"])
        + " keys)."
        if not result["problems"]
        else "**Outputs do NOT match the ground truth: " + ", ".join(result["problems"]) + "** — figures invalid."
    )
    profiled = first["rounds"][0]["rows"][int(os.environ.get("BENCH_PROFILE", 1)) - 1]["ours"]
    return "\n".join(
        [
            "### first checkpoint and big increments",
            "",
            f"{len(first['rounds'])} rounds per size; in each, one fresh job per side, **each side in a fresh "
            f"process of its own** (its own JVM; which side goes first alternates per round), warmed up by a "
            f"small increment of its own side; both sessions are the provider's embedded one with the JIT a "
            f"step reading the first input gets. Checkpoint 1 holds every key once, each later one "
            f"{first['spec'].events:,} events over random keys; {first['spec'].pages:,} pages, seed "
            f"{first['spec'].seed}. Ours vs Structured Streaming `availableNow` on RocksDB with changelog "
            f"checkpointing. {correct}",
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
            "**Where our checkpoints' time goes, run by run** (each one profiled)",
            "",
            *phases,
            "",
            breakdown.render(profiled.info["breakdown"], 1, profiled.parts).replace(
                "(increment 1,", f"(the first checkpoint of {first['spec'].users:,} keys,", 1
            ),
        ]
    )


def _phases(keys: int, r: int, row: dict[str, Any]) -> str:
    """One table row: our checkpoint's node seconds and its Spark jobs' seconds."""
    found = row["ours"].info.get("breakdown", {})
    nodes = " / ".join(f"{n['seconds']:.2f}" for n in found.get("nodes", []))
    jobs = found.get("jobs", [])
    longest = max(jobs, key=lambda j: j["seconds"])["site"] if jobs else ""
    each = " + ".join(f"{j['seconds']:.2f}" for j in jobs)
    gc = found.get("gc_seconds", 0.0)
    return f"| {keys:,} | {r} | {row['increment']} | {nodes} | {gc:.2f} | {each} (`{longest}`) |"


if __name__ == "__main__":
    _child(json.loads(sys.argv[1]))
