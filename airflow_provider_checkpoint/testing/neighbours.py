"""Neighbours of a job for confinement tests: what an attacker's links and documents point at.

:func:`plant_neighbours` creates, next to a job, another table (staged files, commit logs,
rolled-back files), another job's directory (record, checkpoint, stats) and a plain
outside directory. :func:`tree` fingerprints a directory without following links, so a
test compares every file's hash and every directory before and after a refused effect.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path


def tree(root: Path) -> dict[str, str]:
    """Every entry under ``root``: files by SHA-256, directories as ``dir``, links by target (not followed)."""
    out: dict[str, str] = {}
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(directory) / name
            rel = str(path.relative_to(root))
            if path.is_symlink():
                out[rel] = "link -> " + os.readlink(path)
            elif path.is_dir():
                out[rel] = "dir"
            else:
                out[rel] = "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def plant_neighbours(base: Path, other_job: Path) -> dict[str, Path]:
    """Another table, another job directory and an outside directory under ``base`` (``other_job`` for the job).

    The other table holds staged output of checkpoints 1–3, commit logs 1–3 and a
    rolled-back checkpoint 4; the other job a record, a completed-looking ``chk-1`` and stats.
    """
    table, outside = base / "other_table", base / "outside"
    for cid in range(1, 4):
        staged = table / "_staging" / f"chk-{cid}" / "other" / "part-00000.parquet"
        staged.parent.mkdir(parents=True)
        staged.write_bytes(f"staged by the other job, checkpoint {cid}".encode())
        name = f"part-c{cid:010d}-00000.parquet"
        (table / name).write_bytes(f"committed row of {cid}".encode())
        (table / "_commits").mkdir(exist_ok=True)
        (table / "_commits" / f"{cid:010d}.json").write_text(json.dumps({"checkpoint_id": cid, "files": [name]}))
    parked = table / "_rolled_back" / "chk-4" / f"part-c{4:010d}-00000.parquet"
    parked.parent.mkdir(parents=True)
    parked.write_bytes(b"parked output of 4")
    (other_job / "chk-1").mkdir(parents=True)
    (other_job / "_job.json").write_text(json.dumps({"job_id": other_job.name}))
    (other_job / "chk-1" / "_metadata").write_text("{}")
    (other_job / "_stats").mkdir()
    (other_job / "_stats" / "1.json").write_text('{"checkpoint_id": 1}')
    outside.mkdir()
    (outside / "secret.json").write_bytes(b'{"k": 99}\n')
    return {"table": table, "job": other_job, "outside": outside}


def fingerprints(neighbours: dict[str, Path]) -> dict[str, dict[str, str]]:
    """:func:`tree` of every neighbour."""
    return {name: tree(path) for name, path in neighbours.items()}
