"""Where a PostgresTableSink load's server time goes, phase by phase, and the candidate floors, in one run.

``python scripts/bench/pg_phases.py --rows 1000000 --rounds 3`` starts PostgreSQL as the tests do
(:func:`tests.servers.postgres.start_server`, ``fsync=off``) and, per round, in a fresh schema, with the
benchmark's narrow rows ``(id bigint, label text, value double precision)`` sent in pgpq's binary form
from memory (no Spark: the step's Spark part is ``scripts/benchmark.py postgres``), times the SQL the
sink runs and the alternatives considered for issue #54, every side in the same round, order rotated:

- **floor**: one binary ``COPY`` of the rows into a new logged table (one stream);
- the step: the staging ``COPY`` in two parallel streams (one per core, as the executors send it), the
  same into an ``UNLOGGED`` table, and with ``synchronous_commit=off``; upsert: ``ANALYZE`` and the
  ``GROUP BY … HAVING count(*) > 1`` check; finalize's verify (``count(*)``);
- the commit transaction: append ``INSERT … SELECT`` + marker + ``DROP`` of the staging table; upsert
  first load into an empty table ``INSERT … SELECT … ORDER BY`` the key into the table with its unique
  index, and, as an alternative, the unique index built after the rows (``ADD CONSTRAINT`` after the
  ``INSERT``); the first load into a table the sink makes (:func:`~.staging.take_over`): the staging
  table counted, renamed, given ``_checkpoint_id`` (append, a catalog change) or its unique index (upsert),
  built with the server's ``maintenance_work_mem`` and with the sink's 256 MB (``SET LOCAL``).

Prints a Markdown table: median seconds (spread), ratio floor / phase, WAL bytes of the phase.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

REPO = Path(__file__).resolve().parents[2]
COLUMNS = "id bigint, label text, value double precision"


def _rows(n: int) -> pa.Table:
    ids = np.arange(n, dtype=np.int64)
    labels = pa.array([f"label-{i}" for i in ids], pa.string())
    return pa.table({"id": ids, "label": labels, "value": np.random.default_rng(7).random(n)})


def _copy(db: Any, table: str, rows: pa.Table) -> None:
    import pgpq

    encoder = pgpq.ArrowToPostgresBinaryEncoder(rows.schema)
    with db.cursor() as cur, cur.copy(f"COPY {table} FROM STDIN (FORMAT binary)") as copy:
        copy.write(encoder.write_header())
        for batch in rows.to_batches(max_chunksize=65536):
            copy.write(encoder.write_batch(batch))
        copy.write(encoder.finish())


def _wal(db: Any) -> int:
    return int(db.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()[0])


class Round:
    """One round's schema ``s<n>`` and its timed phases."""

    def __init__(self, server: Any, n: int, rows: pa.Table) -> None:
        self.server, self.schema, self.rows = server, f"s{n}", rows
        self.times: dict[str, tuple[float, int]] = {}
        with server.connect() as db:
            db.execute(f"CREATE SCHEMA {self.schema}")
            db.execute(f"CREATE TABLE {self.schema}.markers (job text, checkpoint bigint, rows bigint)")

    def timed(self, name: str, work: Callable[[Any], None]) -> None:
        with self.server.connect() as db:
            wal = _wal(db)
            started = time.perf_counter()
            work(db)
            seconds = time.perf_counter() - started
            self.times[name] = (seconds, _wal(db) - wal)

    def staged(self, name: str, unlogged: bool = False) -> str:
        """A staging table ``name`` holding the rows (untimed)."""
        with self.server.connect() as db:
            db.execute(f"CREATE {'UNLOGGED ' if unlogged else ''}TABLE {self.schema}.{name} ({COLUMNS})")
            _copy(db, f"{self.schema}.{name}", self.rows)
        return f"{self.schema}.{name}"

    def streams(self, db: Any, table: str, parts: int, settings: str = "") -> None:
        """``COPY`` the rows into ``table`` in ``parts`` parallel streams, one transaction each."""
        chunk = -(-self.rows.num_rows // parts)

        def one(i: int) -> None:
            with self.server.connect() as conn:
                if settings:
                    conn.execute(settings)
                with conn.transaction():
                    _copy(conn, table, self.rows.slice(i * chunk, chunk))

        threads = [threading.Thread(target=one, args=(i,)) for i in range(parts)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()


def _phases(r: Round) -> list[tuple[str, Callable[[], None]]]:
    s = r.schema

    def floor() -> None:
        def work(db: Any) -> None:
            db.execute(f"CREATE TABLE {s}.floor ({COLUMNS})")
            _copy(db, f"{s}.floor", r.rows)

        r.timed("floor: one binary COPY, one stream", work)

    def staging(kind: str, unlogged: bool = False, settings: str = "") -> Callable[[], None]:
        def run() -> None:
            name = f"{s}.stg_{abs(hash(kind)) % 10**6}"

            def work(db: Any) -> None:
                db.execute(f"CREATE {'UNLOGGED ' if unlogged else ''}TABLE {name} ({COLUMNS})")
                r.streams(db, name, 2, settings)

            r.timed(kind, work)

        return run

    def step_checks() -> None:
        name = r.staged("chk")
        r.timed("upsert step: ANALYZE staging", lambda db: db.execute(f"ANALYZE {name}"))
        r.timed(
            "upsert step: a key staged twice? (GROUP BY)",
            lambda db: db.execute(f"SELECT 1 FROM {name} GROUP BY id HAVING count(*) > 1 LIMIT 1").fetchall(),
        )
        r.timed("finalize verify: count(*)", lambda db: db.execute(f"SELECT count(*) FROM {name}").fetchone())

    def append_commit() -> None:
        name = r.staged("app")
        with r.server.connect() as db:
            db.execute(f"CREATE TABLE {s}.app_t ({COLUMNS}, _checkpoint_id bigint NOT NULL)")

        def work(db: Any) -> None:
            with db.transaction():
                db.execute(
                    f"INSERT INTO {s}.app_t (id, label, value, _checkpoint_id) SELECT id, label, value, 1 FROM {name}"
                )
                db.execute(f"INSERT INTO {s}.markers VALUES ('j', 1, %s)", [r.rows.num_rows])
                db.execute(f"DROP TABLE {name}")

        r.timed("append commit: INSERT … SELECT, marker, DROP staging", work)

    def append_made() -> None:
        name = r.staged("app_made")

        def work(db: Any) -> None:
            with db.transaction():
                db.execute(f"SELECT count(*) FROM {name}").fetchone()
                db.execute(f"ALTER TABLE {name} RENAME TO app_made_t")
                db.execute(f"ALTER TABLE {s}.app_made_t ADD COLUMN _checkpoint_id bigint NOT NULL DEFAULT 1")
                db.execute(f"ALTER TABLE {s}.app_made_t ALTER COLUMN _checkpoint_id DROP DEFAULT")
                db.execute(f"INSERT INTO {s}.markers VALUES ('j', 1, %s)", [r.rows.num_rows])

        r.timed("append first load making the table: count, rename, add _checkpoint_id, marker", work)

    def upsert_commit(kind: str) -> Callable[[], None]:
        def run() -> None:
            name = r.staged(f"up_{kind}")
            target = f"{s}.up_{kind}_t"
            with r.server.connect() as db:
                db.execute(f"CREATE TABLE {target} ({COLUMNS}, CONSTRAINT {kind}_k UNIQUE NULLS NOT DISTINCT (id))")

            def work(db: Any) -> None:
                with db.transaction():
                    db.execute(f"LOCK TABLE {target} IN SHARE ROW EXCLUSIVE MODE")
                    if kind == "now":
                        db.execute(f"INSERT INTO {target} SELECT * FROM {name} ORDER BY id")
                    elif kind == "after":  # the unique index built after the rows
                        db.execute(f"ALTER TABLE {target} DROP CONSTRAINT {kind}_k")
                        db.execute(f"INSERT INTO {target} SELECT * FROM {name}")
                        db.execute(f"ALTER TABLE {target} ADD CONSTRAINT {kind}_k UNIQUE NULLS NOT DISTINCT (id)")
                    else:  # the staging table made the table (the sink's take-over: the table was absent)
                        db.execute(f"DROP TABLE {target}")
                        db.execute(f"SELECT count(*) FROM {name}").fetchone()
                        db.execute(f"ALTER TABLE {name} RENAME TO up_{kind}_t")
                        if kind == "swap_mem":  # as the sink builds it (staging.INDEX_MEMORY_KB)
                            db.execute("SET LOCAL maintenance_work_mem = '256MB'")
                        db.execute(f"ALTER TABLE {target} ADD CONSTRAINT {kind}_k UNIQUE NULLS NOT DISTINCT (id)")
                    db.execute(f"INSERT INTO {s}.markers VALUES ('j', 1, %s)", [r.rows.num_rows])
                    if not kind.startswith("swap"):
                        db.execute(f"DROP TABLE {name}")

            label = {
                "now": "upsert first-load commit: INSERT … ORDER BY into the indexed table (now)",
                "after": "… alternative: unique index built after the rows",
                "swap": "upsert first load making the table: count, rename, unique index built (default memory)",
                "swap_mem": "… the same, the index built with maintenance_work_mem 256 MB (now)",
            }[kind]
            r.timed(label, work)

        return run

    return [
        ("floor", floor),
        ("stage", staging("step: staging COPY, two streams (now)")),
        ("unlogged", staging("… alternative: into an UNLOGGED table", unlogged=True)),
        ("async", staging("… alternative: synchronous_commit=off", settings="SET synchronous_commit = off")),
        ("checks", step_checks),
        ("append", append_commit),
        ("append_made", append_made),
        ("upsert", upsert_commit("now")),
        ("after", upsert_commit("after")),
        ("swap", upsert_commit("swap")),
        ("swap_mem", upsert_commit("swap_mem")),
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from tests.servers.postgres import start_server

    rows = _rows(args.rows)
    load_before = os.getloadavg()[0]
    root = Path(tempfile.mkdtemp(prefix="pg-phases-"))
    server = start_server(root)
    results: list[dict[str, tuple[float, int]]] = []
    try:
        for n in range(args.rounds):
            r = Round(server, n, rows)
            phases = _phases(r)
            shift = n % len(phases)
            for _, run in phases[shift:] + phases[:shift]:  # rotated: no phase always first
                run()
            results.append(r.times)
            with server.connect() as db:
                db.execute(f"DROP SCHEMA {r.schema} CASCADE")
            print(f"round {n + 1}: " + ", ".join(f"{k[:24]} {v[0]:.2f}" for k, v in r.times.items()), file=sys.stderr)
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
    floors = [t["floor: one binary COPY, one stream"][0] for t in results]
    print(f"{args.rows} rows, {args.rounds} rounds; load average {load_before:.1f} -> {os.getloadavg()[0]:.1f}\n")
    print("| phase | s, median (spread) | floor / phase, median | WAL MB |")
    print("|---|---:|---:|---:|")
    for name in results[0]:
        secs = [t[name][0] for t in results]
        ratios = [f / t[name][0] for f, t in zip(floors, results, strict=True)]
        wal = statistics.median(t[name][1] for t in results) / 1e6
        print(
            f"| {name} | {statistics.median(secs):.2f} ({min(secs):.2f}–{max(secs):.2f}) "
            f"| {statistics.median(ratios):.2f} | {wal:.0f} |"
        )


if __name__ == "__main__":
    main()
