"""JIT mode: one step in a fresh process, as a step task runs it, with the C1 compiler alone or the full JIT.

A step task starts its own JVM, so the JIT it starts with decides how fast its first (and often
only) job runs. For each size in ``sizes`` (the first-checkpoint mode's data: every key once) and
each round, two fresh processes, alternating: one starts the provider's session with C1 alone, the
other with the full JIT (C1, then C2 for hot code); each runs our first checkpoint of that file and
checks its table against pandas. The figures: the session's start, the checkpoint, and the
process's time up to the checkpoint's end; the provider picks the full JIT for a step reading at least
``FULL_JIT_INPUT_BYTES`` (:mod:`airflow_provider_checkpoint.spark.session`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.measure import log
from bench.report import med
from bench.workloads import DataSpec, generate

JITS = ("c1", "full")


def run(sizes: list[int], rounds: int, work: Path, seed: int, pages: int) -> dict[str, Any]:
    """Every size, ``rounds`` times each JIT in a fresh process, alternating; the raw figures."""
    from airflow_provider_checkpoint.spark.session import FULL_JIT_INPUT_BYTES

    rows = []
    for size in sizes:
        spec = DataSpec("large-state", 1, size, size, pages, seed)
        (data,) = generate(work / "data" / f"first-checkpoint-{size}", spec)
        runs: dict[str, list[dict[str, Any]]] = {jit: [] for jit in JITS}
        for r in range(rounds):
            for jit in JITS if r % 2 == 0 else JITS[::-1]:
                runs[jit].append(_fresh_process(spec, data, jit, work / "run" / "jit" / f"{size}-{jit}-{r}"))
                log(f"{size:,} keys, {jit}: {runs[jit][-1]}")
        rows.append({"size": size, "bytes": data.stat().st_size, "runs": runs})
    return {"rows": rows, "threshold": FULL_JIT_INPUT_BYTES, "rounds": rounds, "problems": _problems(rows)}


def _problems(rows: list[dict[str, Any]]) -> dict[str, str]:
    return {
        f"{r['size']}/{jit}": run["problem"] for r in rows for jit in JITS for run in r["runs"][jit] if run["problem"]
    }


def _fresh_process(spec: DataSpec, data: Path, jit: str, root: Path) -> dict[str, Any]:
    shutil.rmtree(root, ignore_errors=True)
    out = subprocess.run(
        [sys.executable, __file__, json.dumps({**spec.__dict__, "data": str(data), "jit": jit, "root": str(root)})],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])},
        capture_output=True,
        text=True,
        check=True,
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def render(result: dict[str, Any]) -> str:
    threshold = result["threshold"] >> 20
    table = [
        "| keys | input MB | C1 alone: session / checkpoint / process s | full JIT: session / checkpoint / process s "
        "| **full/C1 (process)** | the provider starts |",
        "|---:|---:|---:|---:|---:|:--|",
    ]
    for r in result["rows"]:
        c1, full = ({k: med([x[k] for x in r["runs"][j]]) for k in ("session", "checkpoint", "process")} for j in JITS)
        choice = "full JIT" if r["bytes"] >= result["threshold"] else "C1 alone"
        table.append(
            f"| {r['size']:,} | {r['bytes'] / 1e6:.0f} | {c1['session']:.2f} / {c1['checkpoint']:.2f} / "
            f"{c1['process']:.2f} | {full['session']:.2f} / {full['checkpoint']:.2f} / {full['process']:.2f} | "
            f"**{full['process'] / c1['process']:.2f}** | {choice} |"
        )
    correct = (
        "Every table equals the pandas ground truth."
        if not result["problems"]
        else "**Tables do NOT match the ground truth: " + ", ".join(result["problems"]) + "** — figures invalid."
    )
    return "\n".join(
        [
            "### JIT of a step's JVM: C1 alone vs the full JIT",
            "",
            f"Run on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. One fresh process per run (a step task's "
            f"JVM), `local[2]`: the provider's session started with C1 alone (`-XX:TieredStopAtLevel=1`) or "
            f"with the full JIT, then our first checkpoint of every key once; medians of {result['rounds']} runs "
            f"each, alternating. The provider starts a step that reads at least {threshold} MiB with the full "
            f"JIT. {correct}",
            "",
            *table,
        ]
    )


def _child(args: dict[str, Any]) -> None:
    """In the fresh process: start the session, run the checkpoint, check the table, print the figures
    (``process``: from this function's start, imports included, to the checkpoint's end)."""
    started = time.perf_counter()
    import pandas as pd

    from airflow_provider_checkpoint.spark.session import FULL_JIT_INPUT_BYTES, get_spark
    from bench.sides import Ours
    from bench.workloads import ground_truth, land, normalized

    t0 = time.perf_counter()
    input_bytes = FULL_JIT_INPUT_BYTES if args.pop("jit") == "full" else None
    spark = get_spark(master="local[2]", input_bytes=input_bytes)
    spark.sparkContext.setLogLevel("ERROR")
    t1 = time.perf_counter()
    root, data = Path(args.pop("root")), Path(args.pop("data"))
    land(data, root / "landing")
    side = Ours(spark, root / "ours", root / "landing")
    seconds = side.run(1).seconds
    process = time.perf_counter() - started
    problem = ""
    try:
        pd.testing.assert_frame_equal(normalized(side.output()), ground_truth(DataSpec(**args).increment(1)))
    except AssertionError as e:
        problem = str(e)[:200]
    figures = {"session": round(t1 - t0, 2), "checkpoint": round(seconds, 2), "process": round(process, 2)}
    print(json.dumps({**figures, "problem": problem}))


if __name__ == "__main__":
    _child(json.loads(sys.argv[1]))
