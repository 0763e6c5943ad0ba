"""Example: an orders database copied into Delta Lake by change data capture, deletes included.

Every committed insert, update and delete of the PostgreSQL tables ``shop.customers`` and
``shop.orders`` reaches two Delta tables (``$CDC_DIR/lake/customers`` and ``$CDC_DIR/lake/orders``)
that hold one row per primary key, exactly as the source table was at the checkpoint's barrier, nothing
lost or applied twice. A deleted customer is deleted (``delete_when="deleted"``); a deleted order is kept,
marked ``deleted = true`` (``deletes="soft"``: an order history for audits), and comes back unmarked if its
id is inserted again. Under ``ALTER TABLE shop.orders REPLICA IDENTITY FULL`` a deleted order keeps its last
values; otherwise its key alone (the other columns null), as the delete's WAL record carries no more.

One ``PostgresCdcSource`` reads both tables through one logical replication slot. Each DAG run is one
checkpoint: its trigger takes the server's WAL position as the barrier (the first run also creates
the slot and publication and reads both tables in the slot's snapshot); the step reads the changes
committed before the barrier, whole transactions only, splits them by ``source_table`` and stages
them; the finalize commits both Delta tables, then advances the slot. A failed run leaves the slot
where it was, so the next run reads its changes again and the sinks apply them once. Each Delta
table keeps the change's ``op``, ``lsn``, ``commit_time`` and ``xid`` as lineage columns.

The server needs ``wal_level=logical`` and a user that may replicate and owns the tables (see
``docs/cdc.md``). It comes from the Airflow connection ``CDC_PG_CONN`` (default ``shop_db``, of
type ``postgres``), for example::

    export AIRFLOW_CONN_SHOP_DB='postgres://cdc:secret@db.example.com:5432/shop'

Parsing this file needs neither the connection nor the server. When the job is retired, drop its
slot (``SELECT pg_drop_replication_slot('ckpt_example_cdc_shop')``): a slot left behind keeps WAL.
"""

from __future__ import annotations

import os

from airflow_provider_checkpoint import CheckpointedPipeline, DeltaTableSink, PostgresCdcSource, Transform

BASE = os.environ.get("CDC_DIR") or os.path.join(os.environ.get("AIRFLOW_HOME", "."), "cdc")
CONN_ID = os.environ.get("CDC_PG_CONN") or "shop_db"
LINEAGE = ["op", "lsn", "commit_time", "xid", "deleted"]
TABLES = {  # keys, columns, deletes
    "customers": (["customer_id"], ["customer_id", "name", "email", "country"], "hard"),
    "orders": (["order_id"], ["order_id", "customer_id", "amount", "status", "placed_at"], "soft"),
}


def only(table: str, columns: list[str]):  # type: ignore[no-untyped-def]
    """The changes of ``shop.<table>``, with its own columns (the source merges both tables' columns)."""

    def split(df):  # type: ignore[no-untyped-def]
        return df.where(df.source_table == f"shop.{table}").select(*columns, *LINEAGE)

    return split


with CheckpointedPipeline(dag_id="example_cdc", schedule=None, retained_checkpoints=3, doc_md=__doc__) as pipeline:
    changes = PostgresCdcSource(uid="shop", tables=[f"shop.{t}" for t in TABLES], postgres_conn_id=CONN_ID)
    for name, (keys, columns, deletes) in TABLES.items():
        DeltaTableSink(
            uid=f"{name}_delta",
            input=Transform(uid=name, input=changes, fn=only(name, columns)),
            path=f"{BASE}/lake/{name}",
            mode="upsert",
            keys=keys,
            delete_when="deleted",
            deletes=deletes,
            deleted_column="deleted" if deletes == "soft" else None,
        )

dag = pipeline.dag
