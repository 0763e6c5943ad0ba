"""What the Delta upsert writer checks before it commits (DESIGN §5b, invariant 3; issue #30).

:func:`check_version` takes the file actions of a version exactly as they are about to be
written to ``_delta_log/<v>.json`` and the table's live files before it, and refuses the
version (:class:`~airflow_provider_checkpoint.exceptions.DocumentError`, nothing written) unless

- it keeps the Delta protocol's rules for file actions: a path at most once among the adds
  and once among the removes; a path both removed and added only with two different
  deletion vectors (DVs); every remove names a live file with its live DV; a path live
  before is added again only together with the remove of its live entry;
- and the sink's own: a DV only on a file re-added in place (same size, same rows), whose
  bytes decode to exactly its cardinality, naming rows the file has (``< numRecords``),
  every row the file's old DV deleted and at least one more.

:func:`check_keys` checks, from what the writer already knows (no scan of the table), that
a checkpoint leaves one live row per key: the rows it adds hold each key once, the live rows
it deletes hold each key at most once (else the table held a key twice) and only keys it adds.

Pure Python (numpy for positions, pyarrow for keys); DV bytes are decoded by a callable so
that the checks run without storage in tests.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import numpy as np

from airflow_provider_checkpoint.connectors.delta.log import RawFile, dv_id
from airflow_provider_checkpoint.exceptions import DocumentError, shorten
from airflow_provider_checkpoint.fileio.arrow_numpy import arrow_of, numpy_of

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_provider_checkpoint.connectors.base.bucket_merge import IntKeys, KeySet

PositionsOf = Callable[[Mapping[str, Any], str], np.ndarray]
"""The sorted positions a raw ``deletionVector`` descriptor deletes, checked against its cardinality
(a :class:`DocumentError` if its bytes do not decode); the second argument names it for messages."""

_SHOWN = 5


def check_version(
    document: str,
    actions: Sequence[Mapping[str, Any]],
    live: Mapping[tuple[str, str | None], RawFile],
    positions: PositionsOf,
) -> None:
    """Refuse the version whose actions are ``actions`` on top of the live files ``live`` (by path and DV
    id, as :func:`~airflow_provider_checkpoint.connectors.delta.log.live_actions` gives them) unless it
    keeps the rules of the module docstring; the error lists every problem found (up to five)."""
    adds = [a["add"] for a in actions if isinstance(a.get("add"), Mapping)]
    removes = [a["remove"] for a in actions if isinstance(a.get("remove"), Mapping)]
    problems: list[str] = []
    added = _by_path(adds, "added", problems)
    removed = _by_path(removes, "removed", problems)
    live_paths: dict[str, list[tuple[str, str | None]]] = {}
    for key in live:
        live_paths.setdefault(key[0], []).append(key)
    for path, gone in removed.items():
        if (path, dv_id(gone.get("deletionVector"))) not in live:
            problems.append(f"{path} is removed as a file (path and deletion vector) the table does not hold live")
    for path, add in added.items():
        remove = removed.get(path)
        if remove is not None and dv_id(remove.get("deletionVector")) == dv_id(add.get("deletionVector")):
            problems.append(
                f"{path} is removed and re-added with the same deletion vector (the Delta protocol forbids "
                "it; readers drop the whole file)"
            )
            continue
        unremoved = [
            k for k in live_paths.get(path, []) if remove is None or k[1] != dv_id(remove.get("deletionVector"))
        ]
        if unremoved:
            problems.append(f"{path} is live in the table and added again without a remove of its live entry")
            continue
        if isinstance(add.get("deletionVector"), Mapping):
            problems += _dv_problems(path, add, remove, live, positions)
    if problems:
        more = f" (and {len(problems) - _SHOWN} more)" if len(problems) > _SHOWN else ""
        raise DocumentError(
            document, "", "refused before commit, nothing written: " + "; ".join(problems[:_SHOWN]) + more
        )


def _by_path(actions: list[Mapping[str, Any]], kind: str, problems: list[str]) -> dict[str, Mapping[str, Any]]:
    out: dict[str, Mapping[str, Any]] = {}
    for action in actions:
        raw = action.get("path")
        path = unquote(raw) if isinstance(raw, str) else ""
        if not path:
            problems.append(f"an {kind[:-1]} action has no path")
        elif path in out:
            problems.append(f"{path} is {kind} twice (the Delta protocol allows one add and one remove per path)")
        else:
            out[path] = action
    return out


def _dv_problems(
    path: str,
    add: Mapping[str, Any],
    remove: Mapping[str, Any] | None,
    live: Mapping[tuple[str, str | None], RawFile],
    positions: PositionsOf,
) -> list[str]:
    """What is wrong with the deletion vector ``add`` gives the live file ``path`` (``remove``: its live entry)."""
    if remove is None:
        return [f"{path} is new to the table but comes with a deletion vector"]
    entry = live.get((path, dv_id(remove.get("deletionVector"))))
    if entry is None:
        return []  # a stale remove, refused above
    before = entry[1]
    records = _records(add)
    problems = []
    if add.get("size") != before.get("size"):
        problems.append(f"{path} is re-added with size {shorten(add.get('size'))}, not its {before.get('size')} bytes")
    if records is None:
        return [*problems, f"{path} is re-added with a deletion vector but without numRecords"]
    if _records(before) not in (None, records):
        problems.append(f"{path} is re-added with {records} records, not its {_records(before)}")
    old_dv = remove.get("deletionVector")
    try:
        new = positions(add["deletionVector"], f"new deletion vector of {path}")
        old = positions(old_dv, f"deletion vector of {path}") if isinstance(old_dv, Mapping) else np.zeros(0, np.uint64)
    except DocumentError as e:
        return [*problems, f"a deletion vector does not decode: {e}"]
    if len(new) and int(new[-1]) >= records:
        problems.append(f"{path}'s deletion vector deletes row {int(new[-1])}, but the file has {records} rows")
    kept = np.setdiff1d(old, new, assume_unique=True)
    if len(kept):
        problems.append(
            f"{path}'s new deletion vector brings back {len(kept)} row(s) its old one deleted (e.g. row {int(kept[0])})"
        )
    elif len(new) <= len(old):
        problems.append(f"{path}'s new deletion vector deletes no row its old one did not ({len(new)} rows)")
    return problems


def _records(action: Mapping[str, Any]) -> int | None:
    """``numRecords`` of an action's stats (a JSON string), ``None`` if absent or not a count."""
    stats = action.get("stats")
    try:
        count = json.loads(stats).get("numRecords") if isinstance(stats, str) else None
    except (ValueError, AttributeError):
        return None
    return count if isinstance(count, int) and not isinstance(count, bool) and count >= 0 else None


def check_keys(document: str, keys: Sequence[str], added: pa.Table | KeySet, deleted: pa.Table) -> None:
    """Refuse a checkpoint that would not leave one live row per key: ``added`` (the key columns of the
    rows it adds, or the writer's :class:`~.bucket_merge.KeySet` of them: their index reused) must hold each
    key once, ``deleted`` (those of the live rows it deletes) each key at most once, and only keys of
    ``added`` (null-safe: a null is a key value like any other)."""

    from airflow_provider_checkpoint.connectors.base.bucket_merge import KeySet

    changed = added if isinstance(added, KeySet) else KeySet(added, keys)
    problems = []
    for table, index, what in (
        (changed.table, changed.index, "the rows the checkpoint adds hold"),
        (deleted, None, "the table holds live rows of"),
    ):
        twice = _repeated(table, keys, index)
        if twice:
            count = "some" if len(twice) == _SHOWN else len(twice)
            problems.append(f"{what} {count} key(s) more than once, e.g. {shorten(twice[0])}")
    if deleted.num_rows:
        stray = deleted.filter(arrow_of(np.logical_not(changed.changed(deleted))))
        if stray.num_rows:
            example = tuple(stray.slice(0, 1).to_pylist()[0].values())
            problems.append(f"{stray.num_rows} deleted row(s) have keys the checkpoint does not add, e.g. {example}")
    if problems:
        raise DocumentError(
            document, "", "refused before commit (one live row per key), nothing written: " + "; ".join(problems)
        )


def _repeated(table: pa.Table, keys: Sequence[str], index: IntKeys | None = None) -> list[tuple[Any, ...]]:
    """The keys ``table`` holds more than once (nulls group together); ``index``: its one integer key's
    :class:`~.bucket_merge.IntKeys`, when known (else made here: one integer key is checked without grouping)."""
    import pyarrow.compute as pc

    if table.num_rows < 2:
        return []
    from airflow_provider_checkpoint.connectors.base.bucket_merge import int_keys

    index = int_keys(table, keys) if index is None else index
    if index is not None and not index.nulls:
        if not index.repeats:
            return []
        ints = np.sort(numpy_of(table[keys[0]]))  # a refusal: which keys, sorted once
        twice = np.unique(ints[1:][ints[1:] == ints[:-1]])[:_SHOWN]
        return [(int(v),) for v in twice]
    counts = table.select(list(keys)).group_by(list(keys), use_threads=False).aggregate([([], "count_all")])
    repeated = counts.filter(pc.greater(counts["count_all"], 1)).select(list(keys))
    return [tuple(r.values()) for r in repeated.slice(0, _SHOWN).to_pylist()]


def check_rewrite(document: str, path: str, rows: int, deleted: int, written: int) -> None:
    """Refuse a compaction of ``path`` that did not write exactly its live rows."""
    if written != rows - deleted:
        raise DocumentError(
            document,
            "",
            f"refused before commit, nothing written: the rewrite of {path} holds {written} rows, not its "
            f"{rows - deleted} live ones ({rows} less {deleted} deleted)",
        )
