"""The pgoutput decoder on messages built byte by byte as PostgreSQL's "Logical Replication Message Formats"
describes them (the real server's bytes are decoded in tests/spark/test_postgres_cdc.py)."""

from __future__ import annotations

import struct

import pytest

from airflow_provider_checkpoint.connectors.postgres.pgoutput import (
    POSTGRES_EPOCH_MICROS,
    UNCHANGED,
    Decoder,
    int_to_lsn,
    lsn_to_int,
)
from airflow_provider_checkpoint.exceptions import CdcSourceError

OID = 16384


def s(text: str) -> bytes:
    return text.encode() + b"\0"


def begin(final_lsn: int, xid: int, ts: int = 1_000_000) -> bytes:
    return b"B" + struct.pack(">qqI", final_lsn, ts, xid)


def commit(commit_lsn: int, end_lsn: int, ts: int = 1_000_000) -> bytes:
    return b"C" + struct.pack(">bqqq", 0, commit_lsn, end_lsn, ts)


def relation(identity: bytes = b"f") -> bytes:
    columns = [(1, "id", 23, -1), (0, "name", 25, -1), (0, "doc", 25, -1)]
    body = struct.pack(">I", OID) + s("public") + s("orders") + identity + struct.pack(">h", len(columns))
    for flags, name, oid, mod in columns:
        body += struct.pack(">b", flags) + s(name) + struct.pack(">Ii", oid, mod)
    return b"R" + body


def tuple_data(*values: object) -> bytes:
    out = struct.pack(">h", len(values))
    for v in values:
        if v is None:
            out += b"n"
        elif v is UNCHANGED:
            out += b"u"
        else:
            raw = str(v).encode()
            out += b"t" + struct.pack(">i", len(raw)) + raw
    return out


def test_lsn_text_round_trips():
    assert lsn_to_int("16/B374D848") == (0x16 << 32) + 0xB374D848
    assert int_to_lsn(lsn_to_int("16/B374D848")) == "16/B374D848"
    assert int_to_lsn(0) == "0/0"


def test_a_transaction_with_every_change_kind_decodes_whole_and_in_order():
    oid = struct.pack(">I", OID)
    messages = [
        begin(0x200, 740, ts=5),
        b"O" + struct.pack(">q", 0x100) + s("origin"),
        relation(),
        b"Y" + struct.pack(">I", 99) + s("public") + s("mood"),
        b"I" + oid + b"N" + tuple_data(1, "a", None),
        b"U" + oid + b"O" + tuple_data(1, "a", "big") + b"N" + tuple_data(1, "b", UNCHANGED),
        b"U" + oid + b"N" + tuple_data(2, "c", "x"),
        b"D" + oid + b"K" + tuple_data(2, None, None),
        b"M" + struct.pack(">bq", 1, 0x150) + s("prefix") + struct.pack(">i", 2) + b"hi",
        commit(0x200, 0x230, ts=5),
    ]
    (txn,) = list(Decoder("slot").transactions(messages))
    assert (txn.xid, txn.commit_lsn, txn.end_lsn) == (740, 0x200, 0x230)
    assert txn.commit_time_micros == POSTGRES_EPOCH_MICROS + 5
    ops = [(c.op, c.values, c.old) for c in txn.changes]
    assert ops == [
        ("insert", ("1", "a", None), None),
        ("update", ("1", "b", UNCHANGED), ("1", "a", "big")),
        ("update", ("2", "c", "x"), None),
        ("delete", ("2", None, None), None),
    ]
    rel = txn.changes[0].relation
    assert rel.qualified == "public.orders" and rel.replica_identity == "f"
    assert [(c.name, c.type_oid, c.key) for c in rel.columns] == [
        ("id", 23, True),
        ("name", 25, False),
        ("doc", 25, False),
    ]


def test_a_delete_under_replica_identity_full_carries_the_old_row():
    oid = struct.pack(">I", OID)
    messages = [begin(0x10, 1), relation(), b"D" + oid + b"O" + tuple_data(3, "z", "d"), commit(0x10, 0x20)]
    (txn,) = Decoder("slot").transactions(messages)
    assert txn.changes[0].values == ("3", "z", "d") == txn.changes[0].old


def test_truncate_is_reported_with_its_relations():
    body = b"T" + struct.pack(">ib", 1, 0) + struct.pack(">I", OID)
    (txn,) = Decoder("slot").transactions([begin(0x10, 1), relation(), body, commit(0x10, 0x20)])
    assert [r.qualified for r in txn.truncated] == ["public.orders"] and not txn.changes


def test_changes_of_transactions_committed_before_since_are_skipped_undecoded():
    oid = struct.pack(">I", OID)
    garbage = b"I" + oid + b"N" + b"\xff"  # never decoded: its transaction commits before `since`
    messages = [begin(0x10, 1), relation(), garbage, commit(0x10, 0x20)]
    messages += [begin(0x30, 2), b"I" + oid + b"N" + tuple_data(4, "n", None), commit(0x30, 0x40)]
    txns = list(Decoder("slot", since=0x30).transactions(messages))
    assert [t.changes for t in txns][0] == [] and txns[1].changes[0].values == ("4", "n", None)


@pytest.mark.parametrize(
    ("messages", "why"),
    [
        ([b"I" + struct.pack(">I", OID) + b"N" + tuple_data(1, "a", None)], "outside a transaction"),
        ([begin(0x10, 1), b"I" + struct.pack(">I", 7) + b"N" + tuple_data(1)], "before its Relation"),
        ([begin(0x10, 1), commit(0x11, 0x20)], "Commit LSN 0/11 of a Begin at 0/10"),
        ([b"S" + struct.pack(">Ib", 1, 1)], "streamed or two-phase"),
        ([b"Z"], "unknown message type"),
        (
            [
                begin(0x10, 1),
                relation(),
                b"I" + struct.pack(">I", OID) + b"N" + struct.pack(">h", 1) + b"t\0\0\0\x09ab",
            ],
            "ends inside",
        ),
        ([begin(0x10, 1), relation(), b"I" + struct.pack(">I", OID) + b"N" + struct.pack(">h", 1) + b"b"], "kind b'b'"),
        ([b"B\0"], "unpack"),
    ],
)
def test_malformed_messages_are_refused_naming_the_slot_and_message(messages, why):
    with pytest.raises(CdcSourceError, match="replication slot slot: cannot decode pgoutput message") as e:
        list(Decoder("slot").transactions(messages))
    assert why in str(e.value)
