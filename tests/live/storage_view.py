"""Read-only views of a job's checkpoint storage and savepoints, as an operator would inspect them."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

_CHK = re.compile(r"^chk-(\d+)$")


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def completed_ids(job_dir: Path) -> list[int]:
    """Ids of the retained completed checkpoints (``chk-<id>/_metadata`` exists)."""
    ids = []
    for p in job_dir.glob("chk-*"):
        m = _CHK.match(p.name)
        if m and (p / "_metadata").exists():
            ids.append(int(m.group(1)))
    return sorted(ids)


def known_ids(job_dir: Path) -> set[int]:
    """Every checkpoint id the job ever used: retained directories, stats (never pruned), the id counter."""
    ids = {int(m.group(1)) for p in job_dir.glob("chk-*") if (m := _CHK.match(p.name))}
    ids |= {int(p.stem) for p in (job_dir / "_stats").glob("*.json") if p.stem.isdigit()}
    job = job_dir / "_job.json"
    if job.exists():
        ids.add(int(read_json(job)["last_checkpoint_id"]))
    return ids


def latest_metadata(job_dir: Path) -> dict[str, Any]:
    ids = completed_ids(job_dir)
    assert ids, f"no completed checkpoint in {job_dir}"
    return dict(read_json(job_dir / f"chk-{ids[-1]}" / "_metadata"))


def savepoint_dirs(root: Path) -> set[Path]:
    """Complete savepoints under ``root`` (``_metadata`` is written last)."""
    return {p.parent for p in root.glob("savepoint-*/_metadata")}


class Deadline:
    """A whole test's time budget; every wait inside it gets ``bounded(limit)``."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.end = time.monotonic() + seconds

    def bounded(self, limit: float) -> float:
        remaining = self.end - time.monotonic()
        assert remaining > 0, f"the test's budget of {self.seconds:.0f}s is used up"
        return min(limit, remaining)
