"""Landing files that mix good and malformed records, and their ground truth by Python's own parse.

The ground truth reads the landed files back and judges every line with ``json`` / ``csv``
against the schema ``user STRING, page STRING, ts LONG``, independently of Spark and of
the dead-letter code under test.
"""

from __future__ import annotations

import csv
import json
import random
import re
from pathlib import Path

import pandas as pd

SCHEMA = "user STRING, page STRING, ts LONG"
CSV_HEADER = "user,page,ts"
MALFORMED = {
    "json": [
        '{"user": "u1", "page"',
        '{"user": "u2", "page": "/x", "ts": "soon"}',
        "not json at all",
        '{"user": "u3", "page": "/y", "ts": 1.5}',
    ],
    "csv": ["u1,/p", "u2,/q,soon", "u3,/r,7,extra"],
}
DEAD_LETTER_KEY = ["source", "file", "line", "raw", "checkpoint_id"]


def land_mixed(landing: Path, name: str, format: str, n: int, seed: int, malformed_every: int = 5) -> None:
    """Land ``n`` records, every ``malformed_every``-th one malformed (repeats included), atomically."""
    rng = random.Random(seed)
    lines = [CSV_HEADER] if format == "csv" else []
    for i in range(n):
        if i % malformed_every == malformed_every - 1:
            lines.append(rng.choice(MALFORMED[format]))
            continue
        user, page, ts = f"u{rng.randrange(20)}", f"/p{rng.randrange(6)}", rng.randrange(10**6)
        lines.append(json.dumps({"user": user, "page": page, "ts": ts}) if format == "json" else f"{user},{page},{ts}")
    landing.mkdir(parents=True, exist_ok=True)
    hidden = landing / f".{name}"
    hidden.write_text("".join(line + "\n" for line in lines))
    hidden.rename(landing / name)


def _good(format: str, line: str) -> dict[str, object] | None:
    """The record of ``line`` if it matches the schema, else ``None``."""
    if format == "csv":
        fields = next(csv.reader([line]))
        ok = len(fields) == 3 and re.fullmatch(r"-?\d+", fields[2]) is not None
        return {"user": fields[0], "page": fields[1], "ts": int(fields[2])} if ok else None
    try:
        value = json.loads(line)
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    ts = value.get("ts")
    strings = all(isinstance(value.get(c), str | None) for c in ("user", "page"))
    return value if strings and (ts is None or (isinstance(ts, int) and not isinstance(ts, bool))) else None


def ground_truth(
    source: str, landing: Path, format: str, files_by_checkpoint: dict[int, list[str]]
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Good records (``user, page, ts``) and dead letters (:data:`DEAD_LETTER_KEY`) of the landed files."""
    good: list[dict[str, object]] = []
    dead: list[dict[str, object]] = []
    for checkpoint_id, names in files_by_checkpoint.items():
        for name in names:
            lines = (landing / name).read_text().splitlines()
            first = 2 if format == "csv" else 1  # the CSV header is no record
            for number, line in enumerate(lines[first - 1 :], start=first):
                record = _good(format, line)
                if record is not None:
                    good.append(record)
                else:
                    dead.append(
                        {"source": source, "file": name, "line": number, "raw": line, "checkpoint_id": checkpoint_id}
                    )
    return pd.DataFrame(good, columns=["user", "page", "ts"]), pd.DataFrame(dead, columns=DEAD_LETTER_KEY)


def sorted_frame(df: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """``df[columns]`` sorted by every column, index reset, for comparing as multisets."""
    return df[columns].sort_values(columns).reset_index(drop=True)
