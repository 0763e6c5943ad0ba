"""The CDC example (``dags/example_cdc.py``) through real Airflow (``dag.test()``), real Spark, delta-rs
and the test session's real PostgreSQL (``wal_level=logical``), the connection given as a user gives it.

Run 1 copies the tables' rows (the slot's snapshot); then random inserts, updates and deletes, single-
and multi-row transactions spanning both tables, run between checkpoints; an order id deleted is sometimes
inserted again. One run's finalize fails
after the first Delta table committed and before the second; the next run completes that checkpoint
and its own. After every successful run both Delta tables, read with delta-rs, equal a plain ``SELECT``
of the source tables (no commit happens while a run is in flight), the orders table (soft deletes) plus every
order deleted and not inserted again, with the values its ``DELETE … RETURNING`` gave, marked deleted: the
oracle never goes through the source's decoder.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from types import ModuleType
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from airflow_provider_checkpoint.jobs.audit import audit_job
from airflow_provider_checkpoint.storage import JobStorage
from tests.airflow.conftest import load_dag_module
from tests.conftest import REPO
from tests.servers.postgres import PostgresServer

pytestmark = pytest.mark.airflow
ORDER_COLUMNS = "order_id, customer_id, amount, status, placed_at"
SLOT = "ckpt_example_cdc_shop"  # the source's default: ckpt_<job>_<uid>, the publication named after it
DDL = """DROP SCHEMA IF EXISTS shop CASCADE; CREATE SCHEMA shop;
CREATE TABLE shop.customers (customer_id int PRIMARY KEY, name text, email text, country text);
CREATE TABLE shop.orders (order_id bigint PRIMARY KEY, customer_id int, amount numeric(10,2), status text,
                          placed_at timestamptz);
ALTER TABLE shop.orders REPLICA IDENTITY FULL"""  # a soft-deleted order keeps its last values


def drop_slot(server: PostgresServer) -> None:
    with server.connect() as db:
        db.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s", (SLOT,))
        db.execute(f"DROP PUBLICATION IF EXISTS {SLOT}")


@pytest.fixture
def example(airflow_db, postgres_server, tmp_path, monkeypatch) -> Iterator[ModuleType]:
    monkeypatch.setenv("CDC_DIR", str(tmp_path / "cdc"))
    monkeypatch.setenv("AIRFLOW_CONN_SHOP_DB", postgres_server.uri())
    monkeypatch.setenv("AIRFLOW__CHECKPOINT__STORAGE_ROOT", f"file://{tmp_path}/checkpoints")
    monkeypatch.delenv("CHECKPOINT_FAULTS", raising=False)
    drop_slot(postgres_server)
    with postgres_server.connect() as db:
        db.execute(DDL)
    yield load_dag_module(REPO / "dags" / "example_cdc.py")
    drop_slot(postgres_server)  # a slot left behind would hold the session server's WAL


class Shop:
    """Random transactions over both tables; ``customers``/``orders`` only steer the generator."""

    def __init__(self, server: PostgresServer, seed: int) -> None:
        self.db, self.rng = server.connect(), random.Random(seed)
        self.customers: set[int] = set()
        self.orders: set[int] = set()
        self.deleted_orders: dict[int, tuple[Any, ...]] = {}  # order id -> its row when deleted

    def change(self) -> None:
        r, cur = self.rng, self.db.cursor()
        op = r.choice(["customer", "order", "order", "order", "update", "update", "delete"])
        if op == "customer" or not self.customers:
            key = max(self.customers, default=0) + 1
            cur.execute(
                "INSERT INTO shop.customers VALUES (%s, %s, %s, %s)",
                (key, f"c{key}", r.choice([f"c{key}@example.com", None]), r.choice(["FR", "DE", "NL"])),
            )
            self.customers.add(key)
        elif op == "order" or not self.orders:
            key = max(self.orders, default=0) + 1
            placed = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(
                seconds=r.randrange(10**7), microseconds=r.randrange(10**6)
            )
            if self.deleted_orders and r.random() < 0.3:  # a deleted order's id again: revived in the lake
                key = r.choice(sorted(self.deleted_orders))
            values = (key, r.choice(sorted(self.customers)), Decimal(r.randrange(1, 10**5)) / 100, "new", placed)
            cur.execute("INSERT INTO shop.orders VALUES (%s, %s, %s, %s, %s)", values)
            self.orders.add(key)
            self.deleted_orders.pop(key, None)
        elif op == "update":
            key = r.choice(sorted(self.orders))
            status, amount = r.choice(["paid", "shipped", None]), Decimal(r.randrange(1, 10**5)) / 100
            cur.execute("UPDATE shop.orders SET status = %s, amount = %s WHERE order_id = %s", (status, amount, key))
        elif r.random() < 0.7:
            key = r.choice(sorted(self.orders))
            cur.execute(f"DELETE FROM shop.orders WHERE order_id = %s RETURNING {ORDER_COLUMNS}", (key,))
            self.forget_orders(cur.fetchall())
        else:  # a customer and their orders, in one statement each
            key = r.choice(sorted(self.customers))
            cur.execute(f"DELETE FROM shop.orders WHERE customer_id = %s RETURNING {ORDER_COLUMNS}", (key,))
            self.forget_orders(cur.fetchall())
            cur.execute("DELETE FROM shop.customers WHERE customer_id = %s", (key,))
            self.customers.discard(key)

    def forget_orders(self, rows: list[tuple[Any, ...]]) -> None:
        for row in rows:
            self.orders.discard(row[0])
            self.deleted_orders[row[0]] = normal(row)

    def transactions(self, n: int) -> None:
        for _ in range(n):
            with self.db.transaction():
                for _ in range(self.rng.choice([1, 1, 2, 6])):  # multi-row, across both tables
                    self.change()

    def select(self, table: str, columns: list[str]) -> set[tuple[Any, ...]]:
        return {normal(row) for row in self.db.execute(f"SELECT {', '.join(columns)} FROM shop.{table}").fetchall()}

    def expected(self, table: str, columns: list[str], deletes: str) -> set[tuple[Any, ...]]:
        """The lake's rows: the source's; soft deletes: each marked, with every deleted order marked deleted."""
        if deletes == "hard":
            return self.select(table, columns)
        live = {(*row, False) for row in self.select(table, columns)}
        return live | {(*row, True) for row in self.deleted_orders.values()}


def normal(row: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(v.astimezone(UTC) if isinstance(v, datetime) else v for v in row)


def assert_lake_equals_source(example: ModuleType, shop: Shop, base: str) -> None:
    for table, (_, columns, deletes) in example.TABLES.items():
        read = columns + (["deleted"] if deletes == "soft" else [])
        rows = pa.table(DeltaTable(f"{base}/lake/{table}").scan()).select(read).to_pylist()  # DVs applied
        got = [normal(tuple(r[c] for c in read)) for r in rows]
        assert len({row[0] for row in got}) == len(got), f"{table}: one row per key"
        assert set(got) == shop.expected(table, columns, deletes), table


def test_example_cdc_exactly_once_with_deletes(example, postgres_server, tmp_path, monkeypatch):
    dag, base = example.dag, str(tmp_path / "cdc")
    shop = Shop(postgres_server, seed=55)
    shop.transactions(40)
    shop.deleted_orders.clear()  # deleted before the slot existed: the snapshot never sees them
    assert dag.test().state == "success"  # the snapshot
    assert_lake_equals_source(example, shop, base)

    shop.transactions(40)
    assert dag.test().state == "success"
    assert_lake_equals_source(example, shop, base)

    shop.transactions(40)
    monkeypatch.setenv("CHECKPOINT_FAULTS", "finalize.between_sink_commits:checkpoint=3")
    assert dag.test().state == "failed"  # one Delta table committed, the other not, the slot not advanced
    monkeypatch.delenv("CHECKPOINT_FAULTS")
    shop.transactions(40)
    assert dag.test().state == "success"  # checkpoint 3 completed, then 4: nothing lost or doubled
    assert_lake_equals_source(example, shop, base)
    assert shop.orders and shop.customers and shop.deleted_orders, "the workload left rows to compare"

    storage = JobStorage.for_job(f"file://{tmp_path}/checkpoints", "example_cdc")
    assert audit_job(storage, retained=3, sinks=example.pipeline.job.graph.sinks) == []


def test_example_cdc_parses_without_connection_or_server(airflow_db, monkeypatch):
    monkeypatch.delenv("AIRFLOW_CONN_SHOP_DB", raising=False)
    module = load_dag_module(REPO / "dags" / "example_cdc.py")
    assert {s.uid for s in module.pipeline.job.graph.sinks} == {"customers_delta", "orders_delta"}
