"""The provider as a team installs it into the Airflow it already runs: from its wheel, with nothing of this checkout.

1. ``uv build`` builds the sdist from a copy of the package's source tree, then the wheel from that sdist (so the
   sdist holds everything the wheel is built from). Every file of the package's source tree but bytecode must be in
   the wheel and the sdist, so that no static asset can be left out again; the LICENSE in both.
2. A fresh venv gets the site's Airflow first, :data:`SITE_AIRFLOW` (another 3.3 patch release than constraints.txt
   pins), then the wheel with extras, both with the site's constraints (constraints.txt without its Airflow pins,
   standing in for Airflow's own constraints file), from a temp directory with ``PYTHONPATH`` unset.
   ``airflow version`` must still say :data:`SITE_AIRFLOW`: the provider does not move a site's Airflow.
3. The real services run from that venv with a DAGs folder holding a small pipeline and the documented lines of the
   restore DAG (``dags/restore_from_checkpoint.py``), both parsed: a checkpoint through REST API v2, then (``make
   test-full``; in CI the chaos test runs the restore DAG under the real scheduler) a restore through the shipped
   restore DAG, which triggers the pipeline's restoring checkpoint; the table always equals a ground truth computed
   here with plain Python.
4. The Checkpoints page in headless Chromium: the page and every asset it loads answer 200, and it lists the job.
"""

from __future__ import annotations

import collections
import json
import os
import random
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest

from tests.conftest import FULL
from tests.live.airflow_live import REPO, VENV_BIN, LiveAirflow, running_airflow
from tests.live.conftest import log_in
from tests.live.storage_view import latest_metadata

pytestmark = pytest.mark.live

PACKAGE = "airflow_provider_checkpoint"
SITE_AIRFLOW = "3.3.1"
AIRFLOW_PINS = ("apache-airflow==", "apache-airflow-core==", "apache-airflow-task-sdk==")
"""The lines of constraints.txt a site's own Airflow decides."""
EXTRAS = "delta,postgres,s3"
WHEELHOUSE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "airflow-provider-checkpoint" / "wheels"
"""Where scripts/bootstrap.sh keeps the pyspark wheel it built once."""
PIPELINE = "installed_page_views"
RESTORE = "restore_from_checkpoint"
RUN_TIMEOUT = 300.0
PIPELINE_DAG = """\
from airflow_provider_checkpoint import CheckpointedPipeline, FileSource, KeyedAggregate, ParquetTableSink

with CheckpointedPipeline(dag_id="{dag_id}", schedule=None) as pipeline:
    events = FileSource(uid="events", path="{landing}", format="json", schema="user STRING, page STRING, ts LONG")
    views = KeyedAggregate(
        uid="page_views", input=events, keys=["page"], aggs={{"views": "count", "last_seen": "max(ts)"}}
    )
    ParquetTableSink(uid="page_views_table", input=views, path="{table}", mode="upsert", keys=["page"])

dag = pipeline.dag
"""


def run(args: list[str | Path], cwd: Path, env: dict[str, str], timeout: float = 300) -> str:
    done = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, f"{' '.join(map(str, args))} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def phase(what: str, since: float) -> float:
    """Log one phase's wall time (shown with a failure, and with ``-s``); return now."""
    now = time.monotonic()
    print(f"installed wheel: {what} in {now - since:.1f}s")
    return now


def package_files() -> set[str]:
    """Every file of the package's source tree, but Python's bytecode caches."""
    return {
        p.relative_to(REPO).as_posix()
        for p in (REPO / PACKAGE).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".pyo")
    }


@pytest.fixture(scope="module")
def work() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="airflow-checkpoint-install-")).resolve()
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def clean_env() -> dict[str, str]:
    """This process's environment without anything that would put the checkout or its venv on a path; the venv's
    first imports write their bytecode, as a site's would (``airflow version`` writes most of what the services load).
    """
    unset = ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONDONTWRITEBYTECODE")
    return {k: v for k, v in os.environ.items() if k not in unset and not k.startswith("UV_")}


@pytest.fixture(scope="module")
def dists(work: Path, clean_env: dict[str, str]) -> tuple[Path, Path]:
    """(sdist, wheel): the sdist from a copy of the source tree, the wheel from the sdist."""
    started = time.monotonic()
    src = work / "src"
    for name in (*package_files(), "pyproject.toml", "README.md", "LICENSE"):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, src / name)
    run([VENV_BIN / "uv", "build", "--out-dir", work / "dist", src], cwd=work, env=clean_env)
    (sdist,) = (work / "dist").glob("*.tar.gz")
    (wheel,) = (work / "dist").glob("*.whl")
    phase("sdist and wheel built", started)
    return sdist, wheel


def test_distributions_hold_every_file_of_the_package(dists: tuple[Path, Path]) -> None:
    sdist, wheel = dists
    with zipfile.ZipFile(wheel) as z:
        in_wheel = set(z.namelist())
        entry_points = next(z.read(n).decode() for n in in_wheel if n.endswith(".dist-info/entry_points.txt"))
    with tarfile.open(sdist) as t:
        in_sdist = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    expected = package_files()
    assert {
        "airflow_provider_checkpoint/plugin/static/js/main.js",
        "airflow_provider_checkpoint/spark/log4j2.properties",
    } <= expected
    assert sorted(expected - in_wheel) == [], "files of the package missing from the wheel"
    assert sorted(expected - in_sdist) == [], "files of the package missing from the sdist"
    outside = {n for n in in_wheel if not n.startswith((f"{PACKAGE}/", f"{PACKAGE}-"))}
    assert outside == set(), "the wheel installs files outside the package"
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in in_wheel) and "LICENSE" in in_sdist
    assert "Apache License" in (REPO / "LICENSE").read_text()
    assert "provider_info = airflow_provider_checkpoint.get_provider_info:get_provider_info" in entry_points
    assert "checkpoints = airflow_provider_checkpoint.plugin:CheckpointsPlugin" in entry_points


@pytest.fixture(scope="module")
def site_venv(work: Path, dists: tuple[Path, Path], clean_env: dict[str, str]) -> Path:
    """A fresh venv with the site's Airflow, then the provider's wheel with extras; its ``bin``."""
    started = time.monotonic()
    site = work / "site"
    site.mkdir()
    constraints = site / "constraints.txt"
    lines = (REPO / "constraints.txt").read_text().splitlines()
    constraints.write_text("\n".join(line for line in lines if not line.startswith(AIRFLOW_PINS)) + "\n")
    venv = site / "venv"
    uv = VENV_BIN / "uv"
    wheel = f"{dists[1]}[{EXTRAS}]"
    run([uv, "venv", "--quiet", "--python", sys.executable, venv], cwd=site, env=clean_env)
    install = [uv, "pip", "install", "--quiet", "--python", venv / "bin" / "python", "-c", constraints]
    if WHEELHOUSE.is_dir():  # pyspark's wheel, built once by scripts/bootstrap.sh
        install += ["--find-links", WHEELHOUSE]
    for requirement, what in ((f"apache-airflow=={SITE_AIRFLOW}", f"Airflow {SITE_AIRFLOW}"), (wheel, "the wheel")):
        # from the warm uv cache first: online, uv revalidates PyPI's answers, and a changed one rebuilds the
        # pyspark sdists (two minutes); online only when the cache lacks a distribution (the first run)
        offline = [str(a) for a in (*install, "--offline", requirement)]
        if subprocess.run(offline, cwd=site, env=clean_env, capture_output=True, timeout=300).returncode != 0:
            run([*install, requirement], site, clean_env)
        started = phase(f"{what} installed into the fresh venv", started)
    return venv / "bin"


def land(landing: Path, name: str, n: int, seed: int) -> list[dict[str, Any]]:
    """``n`` events with unique timestamps as one JSON Lines file, written under a hidden name then renamed."""
    rng = random.Random(seed)
    rows = [
        {"user": f"u{rng.randrange(20)}", "page": f"/p{rng.randrange(8)}", "ts": seed * 100_000 + i} for i in range(n)
    ]
    (landing / f".{name}").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (landing / f".{name}").rename(landing / name)
    return rows


def truth(events: list[dict[str, Any]]) -> dict[str, tuple[int, int]]:
    """page → (views, last_seen) over ``events``, counted here in plain Python."""
    views = collections.Counter(e["page"] for e in events)
    last: dict[str, int] = {}
    for e in events:
        last[e["page"]] = max(last.get(e["page"], e["ts"]), e["ts"])
    return {page: (views[page], last[page]) for page in views}


def table(path: Path) -> dict[str, tuple[int, int]]:
    rows = ds.dataset(str(path), format="parquet").to_table().to_pylist()
    out = {r["page"]: (int(r["views"]), int(r["last_seen"])) for r in rows}
    assert len(out) == len(rows), f"{len(rows) - len(out)} duplicate page(s) in {path}"
    return out


def test_installed_wheel_runs_restores_and_shows_the_page(
    browser: Any, work: Path, site_venv: Path, clean_env: dict[str, str]
) -> None:
    started = time.monotonic()
    home = work / "site" / "airflow-version-home"
    version = run([site_venv / "airflow", "version"], work / "site", {**clean_env, "AIRFLOW_HOME": str(home)})
    assert version.strip().splitlines()[-1] == SITE_AIRFLOW, "installing the provider moved the site's Airflow"
    find = f"import importlib.util; print(importlib.util.find_spec({PACKAGE!r}).origin)"  # what an import loads
    where = run([site_venv / "python", "-c", find], work / "site", clean_env)
    assert Path(where.strip()).is_relative_to(site_venv.parent), f"the provider imported from {where.strip()}"
    started = phase(f"airflow version {SITE_AIRFLOW} and the provider imported from the venv", started)

    root = work / "airflow"
    dags = root / "dags"
    dags.mkdir(parents=True)
    landing, marts = root / "clickstream" / "landing", root / "clickstream" / "marts" / "page_views"
    (dags / f"{PIPELINE}.py").write_text(PIPELINE_DAG.format(dag_id=PIPELINE, landing=landing, table=marts))
    shutil.copy(REPO / "dags" / f"{RESTORE}.py", dags / f"{RESTORE}.py")  # the documented lines
    with running_airflow(root, dags_folder=dags, dag_ids=(PIPELINE, RESTORE), installed_bin=site_venv) as live:
        try:
            check_pipeline_restore_and_page(live, browser, landing, marts, phase("services started", started))
        except BaseException:
            print(live.diagnostics())
            raise


def check_pipeline_restore_and_page(
    live: LiveAirflow, browser: Any, landing: Path, marts: Path, started: float
) -> None:
    from playwright.sync_api import expect

    # the restore DAG's job_id is required: a run without it is refused before it exists
    refused = live.api("POST", f"/api/v2/dags/{RESTORE}/dagRuns", json={"logical_date": None, "conf": {}})
    assert refused.status_code == 400, refused.text
    assert live.api_json("GET", f"/api/v2/dags/{RESTORE}/dagRuns")["total_entries"] == 0

    events = land(landing, "events-1.json", 300, seed=1)
    live.wait_for_run(PIPELINE, live.trigger(PIPELINE, {}), timeout=RUN_TIMEOUT)
    assert table(marts) == truth(events)
    started = phase("checkpoint 1 through REST API v2", started)

    if FULL:
        events += land(landing, "events-2.json", 200, seed=2)
        conf = {"job_id": PIPELINE, "checkpoint": "1", "trigger_pipeline": True}
        restore_run = live.trigger(RESTORE, conf)
        live.wait_for_run(RESTORE, restore_run, timeout=RUN_TIMEOUT)
        assert set(live.task_states(RESTORE, restore_run).values()) == {"success"}
        assert live.xcom(RESTORE, restore_run, "request_restore")["checkpoint_id"] == 1
        assert latest_metadata(live.storage_root / PIPELINE)["restored_from"] == 1
        assert table(marts) == truth(events), "the restoring checkpoint read the second file exactly once"
        started = phase("restore DAG and the restoring checkpoint 2", started)

    context = browser.new_context()
    try:
        page = context.new_page()
        answers: dict[str, int] = {}
        page.on("response", lambda r: answers.__setitem__(r.url.split("?")[0].split(live.base_url, 1)[-1], r.status))
        log_in(page, live, "/plugin/checkpoints")
        expect(page.frame_locator("iframe").locator("#jobs tbody tr", has_text=PIPELINE)).to_be_visible()
        static = REPO / PACKAGE / "plugin" / "static"
        assets = {f"/checkpoints/ui/{p.relative_to(static).as_posix()}" for p in static.rglob("*") if p.is_file()}
        assets = {a.replace("/index.html", "/") for a in assets}
        loaded = {url: status for url, status in answers.items() if url.startswith("/checkpoints/ui/")}
        assert sorted(assets - set(loaded)) == [], "assets the page did not load"
        assert {url: s for url, s in loaded.items() if s != 200} == {}
    finally:
        context.close()
    phase(f"Checkpoints page with its {len(assets)} assets", started)
