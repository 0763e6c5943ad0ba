"""The chaos test's CDC pipeline: random transactions on a PostgreSQL table (inserts, updates, deletes,
single- and multi-row) between its runs, captured by ``PostgresCdcSource`` into a Delta and a PostgreSQL
upsert table (deletes applied). The truth is a plain ``SELECT`` of the source table at the end: after the
last clean run both targets hold exactly its rows (the runs' barriers all precede that SELECT and no
transaction runs after the last barrier)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pyarrow as pa

from tests.live.chaos_dags import CDC_TABLE

COLUMNS = ["id", "owner", "balance", "note"]


class ChaosCdc:
    """The source table and its workload; the keys that exist steer the generator only."""

    def __init__(self, db: Any) -> None:
        db.execute("CREATE SCHEMA chaos_src")
        db.execute(f"CREATE TABLE {CDC_TABLE} (id int PRIMARY KEY, owner text, balance numeric(12,2), note text)")
        self.keys: set[int] = set()
        self.next_id, self.changes = 1, 0

    def churn(self, db: Any, rng: random.Random) -> None:
        """10-40 transactions of 1-5 row changes each."""
        for _ in range(rng.randrange(10, 40)):
            with db.transaction():
                for _ in range(rng.choice((1, 1, 2, 5))):
                    self._change(db, rng)

    def _change(self, db: Any, rng: random.Random) -> None:
        op = rng.choice(("insert", "insert", "update", "delete")) if self.keys else "insert"
        values = (rng.choice(("ann", "bob", None)), rng.randrange(-(10**6), 10**6) / 100, f"n{rng.randrange(99)}")
        self.changes += 1
        if op == "insert":
            key, self.next_id = self.next_id, self.next_id + 1
            db.execute(f"INSERT INTO {CDC_TABLE} VALUES (%s, %s, %s, %s)", (key, *values))
            self.keys.add(key)
            return
        key = rng.choice(sorted(self.keys))
        if op == "delete":
            db.execute(f"DELETE FROM {CDC_TABLE} WHERE id = %s", (key,))
            self.keys.discard(key)
        else:
            db.execute(f"UPDATE {CDC_TABLE} SET owner = %s, balance = %s, note = %s WHERE id = %s", (*values, key))

    def problems(self, db: Any, base: Path) -> dict[str, str]:
        """Both targets against a SELECT of the source table: the same rows, one per key."""
        from deltalake import DeltaTable

        names = ", ".join(COLUMNS)
        truth = sorted(db.execute(f"SELECT {names} FROM {CDC_TABLE}").fetchall())
        delta = pa.table(DeltaTable(str(base / "cdc" / "lake" / "accounts")).scan()).select(COLUMNS).to_pylist()
        targets = {
            "accounts_delta": sorted(tuple(r[c] for c in COLUMNS) for r in delta),
            "accounts_pg": sorted(db.execute(f"SELECT {names} FROM chaos.cdc_accounts").fetchall()),
        }
        return {
            sink: f"{len(rows)} rows vs {len(truth)} in {CDC_TABLE} (first difference: "
            f"{next((a, b) for a, b in zip([*rows, None], [*truth, None], strict=False) if a != b)})"
            for sink, rows in targets.items()
            if rows != truth
        }

    @staticmethod
    def drop_slot(db: Any) -> None:
        """The job's replication slot holds the session server's WAL: drop it once the test is done."""
        db.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
            "WHERE slot_name = 'ckpt_chaos_cdc_accounts' AND NOT active"
        )
