"""The model of :func:`.pgoutput_columns.decode_rows`: the rows of decoded :class:`.pgoutput.Transaction`\\ s,
one change at a time (the source's decoding before the one-pass decoder), for the Hypothesis comparison."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from airflow_provider_checkpoint.connectors.postgres.cdc_rows import toast_refusal, truncate_refusal
from airflow_provider_checkpoint.connectors.postgres.cdc_schema import check_sent
from airflow_provider_checkpoint.connectors.postgres.cdc_types import TableColumn
from airflow_provider_checkpoint.connectors.postgres.pgoutput import UNCHANGED, Change, Relation, Transaction
from airflow_provider_checkpoint.exceptions import CdcSourceError


def change_rows(
    uid: str, catalog: dict[str, dict[str, TableColumn]], txns: Iterable[Transaction]
) -> Iterator[tuple[dict[str, Any], tuple[Any, ...]]]:
    shapes: dict[Relation, list[bool]] = {}
    for txn in txns:
        if txn.truncated:
            raise truncate_refusal(uid, txn)
        for change in txn.changes:
            relation = change.relation
            if relation not in shapes:
                shapes[relation] = _shape(uid, catalog, relation)
            meta = (
                relation.qualified,
                change.op,
                change.op == "delete",
                txn.commit_lsn,
                txn.commit_time_micros,
                txn.xid,
            )
            moved = _moved_from(catalog[relation.qualified], change)
            if moved is not None:  # the key changed: the old key's row goes, as a delete
                yield (
                    {c.name: v for c, v, r in zip(relation.columns, moved, shapes[relation], strict=True) if r},
                    (
                        relation.qualified,
                        "delete",
                        True,
                        *meta[3:],
                    ),
                )
            yield _values(uid, change, shapes[relation]), meta


def _moved_from(known: dict[str, TableColumn], change: Change) -> tuple[Any, ...] | None:
    """An update's old row (the old key's values, the others as sent) when it changed the primary key (or,
    without one, the replica identity index's columns); ``None`` otherwise."""
    if change.op != "update" or change.old_key is None:
        return None
    columns = change.relation.columns
    primary = [i for i, c in enumerate(columns) if c.name in known and known[c.name].key]
    key = primary or ([i for i, c in enumerate(columns) if c.key] if change.relation.replica_identity == "i" else [])
    if not key or all(change.values[i] in (UNCHANGED, change.old_key[i]) for i in key):
        return None
    return tuple(v if v is not UNCHANGED else None for v in change.old_key)


def _shape(uid: str, catalog: dict[str, dict[str, TableColumn]], relation: Relation) -> list[bool]:
    """Which of a Relation message's columns are read into the recorded columns (a schema change in the
    checkpoint's span: rows before and after it each come with the shape of their own Relation message)."""
    if relation.qualified not in catalog:
        raise CdcSourceError(
            f"source {uid}: a change of table {relation.qualified}, which is not among the source's tables"
        )
    known = catalog[relation.qualified]
    return [check_sent(uid, known, c.name, c.type_oid, c.type_modifier) for c in relation.columns]


def _values(uid: str, change: Change, read: list[bool]) -> dict[str, Any]:
    relation, table = change.relation, change.relation.qualified
    values = list(change.values)
    for i, value in enumerate(values):
        if value is UNCHANGED:
            if change.old is None:
                raise toast_refusal(uid, table, relation.columns[i].name)
            values[i] = change.old[i]
    return {c.name: v for c, v, r in zip(relation.columns, values, read, strict=True) if r}
