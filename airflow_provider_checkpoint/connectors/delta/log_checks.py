"""The provider's check of a Delta log before delta-rs parses it (docs/security.md).

delta-rs 1.6.6 panics on stats nested ~1,000 deep and its process dies (SIGSEGV) at
100,000: a log anyone may write must not reach it unchecked. :func:`check_log` lists the
log once and parses, before delta-rs does, every file delta-rs will read for what the
caller does with the table:

- a plain open (the latest version, ``whole=False``): ``_last_checkpoint``, the newest
  complete classic checkpoint (its Parquet parts) and the commits after it — what
  delta-kernel's log segment holds;
- history, time travel and ``RESTORE`` (``whole=True``): every commit and every checkpoint.

A line that is not JSON, or a line or a JSON string in one (such as ``stats`` or
``schemaString``) nesting deeper than :data:`MAX_JSON_DEPTH`, refuses the table with a
:class:`~airflow_provider_checkpoint.exceptions.DocumentError`; so does a checkpoint part
larger than :data:`MAX_CHECKPOINT_BYTES`, with a Parquet schema nested deeper than that, or
holding such a JSON string in any column. Commit and checkpoint files never change once
written: each (path, size) is parsed once per process; ``_last_checkpoint`` (rewritten in
place) at every check. Checked right before delta-rs opens the table, not atomically with
it: callers open delta-rs at the version checked (:class:`.opened.OpenedTable`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from airflow_provider_checkpoint.core.documents import load_json
from airflow_provider_checkpoint.exceptions import DocumentError

if TYPE_CHECKING:
    import fsspec
    import pyarrow as pa

LOG_DIR = "_delta_log"
LAST_CHECKPOINT = "_last_checkpoint"
COMMIT = re.compile(r"^(\d{20})\.json$")
CHECKPOINT = re.compile(r"^(\d{20})\.checkpoint(?:\.(\d{10})\.(\d{10}))?\.parquet$")
MAX_JSON_DEPTH = 64
"""Deepest nesting a log line, a JSON string inside one (``stats``, ``schemaString``) or a checkpoint's
Parquet schema may have. A Delta log nests a few levels (stats: one per struct level of a column)."""
MAX_CHECKPOINT_BYTES = 1 << 30
"""Largest checkpoint part delta-rs is handed (it loads a checkpoint whole): 1 GiB, some millions of files."""
_parsed: dict[tuple[str, int | None], Found] = {}
"""Commit and checkpoint files (path, size) already found parseable in this process: each is read once."""


def newest_checkpoint(names: list[str], end: int | None = None) -> tuple[int, list[str]] | None:
    """The newest complete classic checkpoint (at or before ``end``) among the log's file ``names``: its
    version and part names, sorted."""
    found: dict[int, dict[int, list[str]]] = {}
    for name in names:
        match = CHECKPOINT.match(name)
        if match and (end is None or int(match.group(1)) <= end):
            parts = int(match.group(3) or 1)
            found.setdefault(int(match.group(1)), {}).setdefault(parts, []).append(name)
    for v in sorted(found, reverse=True):
        for parts, files in found[v].items():
            if len(files) == parts:
                return v, sorted(files)
    return None


@dataclass
class Found:
    """What a checked log file holds that the sink reads without delta-rs: its ``txn`` versions by app
    id and its ``metaData`` action (the last one); of ``_last_checkpoint``: the version it names."""

    txns: dict[str, int] = field(default_factory=dict)
    metadata: dict[str, Any] | None = None
    version: int = -1


class LogState(NamedTuple):
    """A checked log: the table's latest version and, when ``replayed``, its ``txn`` versions by app id
    and its ``metaData`` at that version, replayed from the files checked as the protocol replays them
    (the checkpoint's, then each commit's after it in order). ``replayed`` is false when the log holds
    anything delta-rs might read in another way (a gap in the commits, a checkpoint kind or file not
    listed here, a ``_last_checkpoint`` past the checkpoint found): callers then ask delta-rs."""

    version: int
    replayed: bool
    txns: dict[str, int]
    metadata: dict[str, Any] | None
    files: dict[str, int | None] = {}
    """The log's files and sizes as the check listed them."""


def listing(fs: fsspec.AbstractFileSystem, root: str) -> dict[str, int | None]:
    """The names of the files in the table's log and their sizes: one listing (empty: no log)."""
    try:
        entries = fs.ls(f"{root}/{LOG_DIR}", detail=True)
    except FileNotFoundError:
        return {}
    return {str(e["name"]).rstrip("/").rsplit("/", 1)[-1]: e.get("size") for e in entries}


def check_log(fs: fsspec.AbstractFileSystem, root: str, table: str, whole: bool = False) -> LogState | None:
    """Refuse (:class:`DocumentError`) a table whose log holds a file delta-rs would parse unsafely (see
    the module docstring); one listing of the log. ``None`` if the log has no version, else its state
    (:class:`LogState`; ``whole``: not replayed): a caller opens delta-rs at that version, so it reads
    nothing this check did not see."""
    sizes = listing(fs, root)
    names = sorted(sizes)
    commits = [int(m.group(1)) for m in map(COMMIT.match, names) if m]
    checkpoint = newest_checkpoint(names)
    latest = max([*commits, *([checkpoint[0]] if checkpoint else [])], default=None)
    if latest is None:
        return None
    after = checkpoint[0] if checkpoint else -1
    parts = checkpoint[1] if checkpoint else []
    replayed = [f"{v:020d}.json" for v in range(after + 1, latest + 1)]
    if whole:
        todo = [n for n in names if COMMIT.match(n) or CHECKPOINT.match(n) or n == LAST_CHECKPOINT]
    else:
        todo = [*([LAST_CHECKPOINT] if LAST_CHECKPOINT in sizes else []), *parts, *(n for n in replayed if n in sizes)]
    found = {name: _checked(fs, root, table, name, sizes[name]) for name in todo}
    known = all(COMMIT.match(n) or CHECKPOINT.match(n) or n == LAST_CHECKPOINT for n in names)
    hint = found.get(LAST_CHECKPOINT)
    exact = not whole and known and all(n in sizes for n in replayed) and (hint is None or hint.version <= after)
    txns: dict[str, int] = {}
    metadata = None
    for name in [*parts, *replayed] if exact else []:
        txns.update(found[name].txns)
        metadata = found[name].metadata or metadata
    return LogState(latest, exact, txns, metadata, sizes)


def remember(fs: fsspec.AbstractFileSystem, root: str, table: str, name: str, data: bytes) -> None:
    """Check the commit file ``name`` this process just created with ``data``, as the next check of the log
    would: that check then does not read it back."""
    _checked(fs, root, table, name, len(data), data)


def _checked(
    fs: fsspec.AbstractFileSystem, root: str, table: str, name: str, size: int | None, data: bytes | None = None
) -> Found:
    """Check the log file ``name`` (listed with ``size``; ``data``: its content if known); what it holds
    (``_last_checkpoint``: its version as the ``txns`` of app id ``"_"``, -1 if it has none)."""
    key = (f"{root}/{LOG_DIR}/{name}", size)
    if key in _parsed:
        return _parsed[key]
    document = f"{table}/{LOG_DIR}/{name}"
    if CHECKPOINT.match(name):
        found = _check_checkpoint(fs, key[0], size, document)
    else:
        found = Found()
        for number, line in enumerate((read(fs, key[0], size) if data is None else data).splitlines(), 1):
            if line.strip():
                action = load_json(line, document)
                check_depth(action, document, f"line {number}")
                _collect(action, found)
        if name == LAST_CHECKPOINT:  # rewritten in place: checked every time
            return found
    if len(_parsed) > 100_000:
        _parsed.clear()
    _parsed[key] = found
    return found


def _collect(action: Any, found: Found) -> None:
    """Keep what a well-formed ``txn``, ``metaData`` or ``_last_checkpoint`` line says (others are
    delta-rs's to refuse)."""
    if not isinstance(action, dict):
        return
    txn, metadata, version = action.get("txn"), action.get("metaData"), action.get("version")
    if isinstance(txn, dict) and isinstance(txn.get("appId"), str) and type(txn.get("version")) is int:
        found.txns[txn["appId"]] = txn["version"]
    if isinstance(metadata, dict):
        found.metadata = metadata
    if type(version) is int:
        found.version = version


def read(fs: fsspec.AbstractFileSystem, path: str, size: int | None) -> bytes:
    """The file at ``path`` of ``size`` bytes (as listed): one GET on an object store (a ranged read
    needs no HEAD first)."""
    return b"" if size == 0 else bytes(fs.cat_file(path, start=0, end=size))


def _check_checkpoint(fs: fsspec.AbstractFileSystem, path: str, size: int | None, document: str) -> Found:
    """A checkpoint part: at most :data:`MAX_CHECKPOINT_BYTES`, a Parquet schema at most
    :data:`MAX_JSON_DEPTH` deep, no string in it holding JSON nested deeper (or not JSON); its ``txn``
    rows and ``metaData``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if size is None or size > MAX_CHECKPOINT_BYTES:
        raise DocumentError(document, "", f"is {size} bytes, more than a checkpoint may have ({MAX_CHECKPOINT_BYTES})")
    try:
        with pq.ParquetFile(pa.BufferReader(read(fs, path, size))) as parquet:  # one GET, no HEAD
            if _type_depth(pa.struct(list(parquet.schema_arrow))) > MAX_JSON_DEPTH:
                raise DocumentError(document, "", f"has a schema nested deeper than {MAX_JSON_DEPTH} levels")
            content = parquet.read()
    except (pa.ArrowException, OSError) as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise DocumentError(document, "", f"is not a readable Parquet checkpoint ({str(e)[:200]})") from None
    for column in content.columns:
        for strings in _strings(column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)):
            for value in strings.to_pylist():
                check_json_string(value, document, "a string value")
    found = Found()
    for row in content.column("txn").to_pylist() if "txn" in content.column_names else []:
        _collect({"txn": row}, found)
    for row in content.column("metaData").to_pylist() if "metaData" in content.column_names else []:
        if isinstance(row, dict):
            _collect({"metaData": {**row, "configuration": dict(row.get("configuration") or [])}}, found)
    return found


def _type_depth(t: pa.DataType) -> int:
    """How deep an Arrow type nests (a primitive: 1)."""
    return 1 + max((_type_depth(t.field(i).type) for i in range(t.num_fields)), default=0)


def _strings(array: pa.Array) -> Iterator[pa.Array]:
    """The string arrays of ``array``'s leaves (through structs, lists and maps)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_string(array.type) or pa.types.is_large_string(array.type):
        yield array.filter(pc.starts_with(array, "{")) if len(array) else array
        yield array.filter(pc.starts_with(array, "[")) if len(array) else array
    elif pa.types.is_struct(array.type):
        for i in range(array.type.num_fields):
            yield from _strings(array.field(i))
    elif pa.types.is_map(array.type):
        yield from _strings(array.keys)
        yield from _strings(array.items)
    elif pa.types.is_list(array.type) or pa.types.is_large_list(array.type):
        yield from _strings(array.flatten())


def check_depth(value: Any, document: str, where: str) -> None:
    """``value`` (parsed) nests at most :data:`MAX_JSON_DEPTH` deep, and so does every string in it that
    holds JSON (an object or an array)."""
    todo: list[tuple[Any, int]] = [(value, 1)]
    while todo:
        item, depth = todo.pop()
        if depth > MAX_JSON_DEPTH:
            raise DocumentError(document, where, f"nests deeper than {MAX_JSON_DEPTH} levels")
        if isinstance(item, dict):
            todo += [(v, depth + 1) for v in item.values()]
        elif isinstance(item, list):
            todo += [(v, depth + 1) for v in item]
        elif isinstance(item, str):
            check_json_string(item, document, where)


def check_json_string(value: str | None, document: str, where: str) -> None:
    """A string that holds JSON (an object or an array, as ``stats`` and ``schemaString`` do) nests at
    most :data:`MAX_JSON_DEPTH` deep. Any other string is opaque, even one that starts with a bracket (a
    deletion vector's Z85 id may): its brackets outside quotes must still nest no deeper, since a parser
    that takes it for JSON recurses on them before it finds the fault."""
    if not value or value[:1] not in ("{", "["):
        return
    try:
        parsed = json.loads(value)
    except RecursionError:
        raise DocumentError(document, where, f"nests deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError:
        if _bracket_depth(value) > MAX_JSON_DEPTH:
            raise DocumentError(document, where, f"nests deeper than {MAX_JSON_DEPTH} levels") from None
        return
    check_depth(parsed, document, where)


_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"?')


def _bracket_depth(value: str) -> int:
    """How deep the brackets of ``value`` nest outside double-quoted strings (unbalanced ones count)."""
    depth = deepest = 0
    for char in _QUOTED.sub("", value):
        if char in "{[":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "}]" and depth:
            depth -= 1
    return deepest
