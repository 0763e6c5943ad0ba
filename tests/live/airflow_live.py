"""Real Airflow services (api-server, scheduler, dag-processor, triggerer) for the live tests.

Everything runs in subprocesses against an isolated ``AIRFLOW_HOME`` (by default SQLite and
LocalExecutor; a :class:`~tests.live.topology.Topology` selects PostgreSQL, CeleryExecutor,
several schedulers and Celery workers), on a free loopback port, with the repository's
``dags/`` folder. Each service is its own process group, so stopping it also stops the task
processes and Spark JVMs it started. Nothing here sleeps for a fixed time to synchronise:
every wait polls a condition with a deadline.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from tests.live.topology import Topology, kill_service, stop_process_group

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.prefix) / "bin"
ADMIN_USER = "admin"
DAGS = ("example_clickstream", "restore_from_checkpoint", "example_downstream")
# SimpleAuthManager users and roles: a viewer may read every DAG but trigger none; a user
# without a role is authenticated but has no permission at all (403 everywhere).
USER_ROLES = {ADMIN_USER: "admin", "viewer": "viewer", "nobody": ""}
TERMINAL_RUN_STATES = {"success", "failed"}
# What Airflow 3.3's UI trigger form sends as conf when only "Take a savepoint" is switched
# on: every Param with its value, the untouched savepoint_dir as null. test_ui_savepoint.py
# captures the real request and checks it against this.
UI_SAVEPOINT_CONF = {"savepoint": True, "savepoint_dir": None, "stop_after_savepoint": False}


class ServiceError(RuntimeError):
    """A service died, never became ready, or a run did not end as expected."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def reserved_port() -> socket.socket:
    """A socket bound to a free loopback port, held until the service that listens there starts: while it
    is bound, no other bind and no outgoing connection of this machine takes the port (the api-server
    starts a minute after its port is chosen, and once lost the race with another test's connection)."""
    held = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    held.bind(("127.0.0.1", 0))
    return held


def poll(what: str, check: Callable[[], Any], timeout: float, interval: float = 1.0) -> Any:
    """Call ``check`` until it returns something truthy; raise after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            result = check()
            if result:
                return result
        except ServiceError:
            raise
        except Exception as e:  # not ready yet (connection refused, 404, ...)
            last_error = e
        if time.monotonic() > deadline:
            raise ServiceError(f"timed out after {timeout:.0f}s waiting for {what}; last error: {last_error!r}")
        time.sleep(interval)


def tail(path: Path, lines: int = 60) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError as e:
        return f"({path}: {e})"
    return "\n".join(text[-lines:])


@dataclass
class LiveAirflow:
    """Handles to the running services and their isolated directories."""

    root: Path
    port: int
    password: str
    env: dict[str, str]
    bin_dir: Path = VENV_BIN
    """The ``bin`` directory of the venv the services run from."""
    topology: Topology = field(default_factory=Topology)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    commands: dict[str, tuple[str, ...]] = field(default_factory=dict)
    passwords: dict[str, str] = field(default_factory=dict)
    username: str = ADMIN_USER
    _token: str | None = None
    _client: httpx.Client | None = None

    # -- layout ------------------------------------------------------------------------
    @property
    def home(self) -> Path:
        return self.root / "airflow-home"

    @property
    def service_logs(self) -> Path:
        return self.root / "service-logs"

    @property
    def clickstream(self) -> Path:
        return self.root / "clickstream"

    @property
    def landing(self) -> Path:
        return self.clickstream / "landing"

    @property
    def marts(self) -> Path:
        return self.clickstream / "marts"

    @property
    def storage_root(self) -> Path:
        return self.root / "checkpoints"

    @property
    def savepoint_root(self) -> Path:
        return self.root / "savepoints"

    @property
    def job_dir(self) -> Path:
        return self.storage_root / "example_clickstream"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- HTTP --------------------------------------------------------------------------
    @property
    def client(self) -> httpx.Client:
        if self._client is None:
            self._client = httpx.Client(base_url=self.base_url, timeout=30.0)
        return self._client

    def token(self, refresh: bool = False) -> str:
        if self._token is None or refresh:
            r = self.client.post("/auth/token", json={"username": self.username, "password": self.password})
            if r.status_code != 201:
                raise ServiceError(f"POST /auth/token answered {r.status_code}: {r.text}")
            self._token = r.json()["access_token"]
        return self._token

    def token_of(self, username: str) -> str:
        """A fresh JWT of one of :data:`USER_ROLES`."""
        r = self.client.post("/auth/token", json={"username": username, "password": self.passwords[username]})
        if r.status_code != 201:
            raise ServiceError(f"POST /auth/token for {username} answered {r.status_code}: {r.text}")
        return str(r.json()["access_token"])

    def api(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """A REST API v2 call with the admin's bearer token (refreshed once on 401)."""
        for attempt in (1, 2):
            headers = {"Authorization": f"Bearer {self.token(refresh=attempt == 2)}"}
            r = self.client.request(method, path, headers=headers, **kwargs)
            if r.status_code != 401:
                return r
        return r

    def api_json(self, method: str, path: str, expect: int = 200, **kwargs: Any) -> Any:
        r = self.api(method, path, **kwargs)
        if r.status_code != expect:
            raise ServiceError(f"{method} {path} answered {r.status_code} (expected {expect}): {r.text}")
        return r.json()

    def trigger(self, dag_id: str, conf: Mapping[str, Any]) -> str:
        """Trigger a run through REST API v2 as a user would; return its run id."""
        body = {"logical_date": None, "conf": dict(conf)}
        run = self.api_json("POST", f"/api/v2/dags/{dag_id}/dagRuns", expect=200, json=body)
        return str(run["dag_run_id"])

    def run(self, dag_id: str, run_id: str) -> dict[str, Any]:
        return dict(self.api_json("GET", f"/api/v2/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}"))

    def run_state(self, dag_id: str, run_id: str) -> str:
        return str(self.run(dag_id, run_id)["state"])

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str | None]:
        path = f"/api/v2/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}/taskInstances"
        return {ti["task_id"]: ti["state"] for ti in self.api_json("GET", path)["task_instances"]}

    def xcom(self, dag_id: str, run_id: str, task_id: str, key: str = "return_value") -> Any:
        path = f"/api/v2/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}/taskInstances/{task_id}/xcomEntries/{key}"
        return self.api_json("GET", path)["value"]

    def wait_for_run(self, dag_id: str, run_id: str, timeout: float = 360.0, expect_success: bool = True) -> str:
        """Poll until the run is terminal; raise with task states and logs if it is not ``success``
        (unless ``expect_success`` is false: then return the terminal state)."""

        def terminal() -> str | None:
            self.check_alive()
            state = self.run_state(dag_id, run_id)
            return state if state in TERMINAL_RUN_STATES else None

        try:
            # every 0.5 s: a run's end is seen 0.75 s sooner on average than at 2 s (one small GET each)
            state = poll(f"run {dag_id}/{run_id} to finish", terminal, timeout, interval=0.5)
        except ServiceError as e:
            raise ServiceError(f"{e}\ntask states: {self._safe_task_states(dag_id, run_id)}") from e
        if state != "success" and expect_success:
            raise ServiceError(
                f"run {dag_id}/{run_id} ended {state}; task states: {self._safe_task_states(dag_id, run_id)}\n"
                + self.task_log_tails(dag_id, run_id)
            )
        return state

    def _safe_task_states(self, dag_id: str, run_id: str) -> Any:
        try:
            return self.task_states(dag_id, run_id)
        except Exception as e:
            return f"(unavailable: {e!r})"

    # -- processes ---------------------------------------------------------------------
    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            code = proc.poll()
            if code is not None:
                raise ServiceError(f"airflow {name} exited with code {code}:\n{tail(self.log_of(name))}")

    def log_of(self, name: str) -> Path:
        return self.service_logs / f"{name}.log"

    def task_log_tails(self, dag_id: str | None = None, run_id: str | None = None, files: int = 4) -> str:
        """The ends of the most recently written task logs (of one run, if given)."""
        logs_dir = self.home / "logs"
        pattern = "**/*.log"
        if dag_id:
            pattern = f"dag_id={dag_id}/" + (f"run_id={run_id}/" if run_id else "") + pattern
        found = sorted(logs_dir.glob(pattern), key=lambda p: p.stat().st_mtime)[-files:]
        return "\n".join(f"--- task log {p.relative_to(logs_dir)} ---\n{tail(p, 40)}" for p in found)

    def diagnostics(self) -> str:
        parts = [f"AIRFLOW_HOME={self.home}  api={self.base_url}"]
        for name in self.commands:
            parts.append(f"--- airflow {name} ({self.log_of(name)}) ---\n{tail(self.log_of(name))}")
        parts.append(self.task_log_tails())
        return "\n".join(parts)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def start(self, name: str, *args: str) -> None:
        """Start service ``name`` (``airflow <args>``; with no args, the command it was started with
        before) in a process group of its own, its output appended to :meth:`log_of`."""
        args = args or self.commands[name]
        self.commands[name] = args
        with open(self.log_of(name), "ab") as log:
            self.procs[name] = subprocess.Popen(
                [str(self.bin_dir / "airflow"), *args],
                env=self.env,
                cwd=self.home,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # own process group: task processes and JVMs stop with it
            )

    def kill(self, name: str) -> list[str]:
        """SIGKILL service ``name`` with every process it started (task processes, Spark JVMs), as a
        machine that dies would (:func:`~tests.live.topology.kill_service`); return the command names
        of the processes killed. :meth:`start` restarts it."""
        return kill_service(self.procs.pop(name))

    def wait_for_workers(self, names: list[str], timeout: float) -> None:
        """Poll until each Celery worker of ``names`` logged that it is ready (connected to the broker)."""

        def ready() -> bool:
            self.check_alive()
            return all(f"{name}@" in (log := self.log_of(name).read_text(errors="replace")) and " ready." in log
                       for name in names)  # fmt: skip

        poll(f"Celery workers {', '.join(names)} to be ready", ready, timeout)


def checkout_on_path() -> dict[str, str]:
    """``PYTHONPATH`` for the services when the venv's editable install is another checkout (a git
    worktree of it), so they run this checkout's package; none when it is this one: the checkout's
    ``*.egg-info`` on the path would be a second distribution and register the plugin twice."""
    import json
    from importlib.metadata import distributions

    installed = [  # the venv's install (a checkout's egg-info on the path has no direct_url.json)
        json.loads(direct).get("url", "").removeprefix("file://")
        for d in distributions(name="airflow-provider-checkpoint")
        if (direct := d.read_text("direct_url.json"))
    ]
    return {} if any(Path(i).resolve() == REPO.resolve() for i in installed if i) else {"PYTHONPATH": str(REPO)}


def service_env(
    root: Path,
    port: int,
    password_file: Path,
    dags_folder: Path = REPO / "dags",
    extra: dict[str, str] | None = None,
    installed_bin: Path | None = None,
) -> dict[str, str]:
    """The environment of every service: inherited, minus any Airflow settings, plus ours. With
    ``installed_bin`` (the ``bin`` of a venv the provider was installed into from its wheel) the services
    run from that venv with no part of this checkout on their path (an empty plugins folder)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("AIRFLOW")
        and k not in ("CHECKPOINT_FAULTS", "CHECKPOINT_FAULTS_FILE", "CLICKSTREAM_DIR", "PYTHONPATH")
        # an installed venv holds no bytecode yet (uv compiles none): its first imports write it, as pip's would
        and not (installed_bin and k == "PYTHONDONTWRITEBYTECODE")
    }
    base_url = f"http://127.0.0.1:{port}"
    env.update(
        {
            "PATH": f"{installed_bin or VENV_BIN}{os.pathsep}{os.environ.get('PATH', '/usr/local/bin:/usr/bin:/bin')}",
            "PYTHONUNBUFFERED": "1",
            **({} if installed_bin else checkout_on_path()),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "AIRFLOW_HOME": str(root / "airflow-home"),
            "AIRFLOW__CORE__DAGS_FOLDER": str(dags_folder),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(root / "plugins" if installed_bin else REPO / "plugins"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
            "AIRFLOW__CORE__PARALLELISM": "6",  # 3 steps + the restore DAG's waiting trigger task
            "AIRFLOW__CORE__AUTH_MANAGER": (
                "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
            ),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": ",".join(f"{u}:{r}" for u, r in USER_ROLES.items()),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(password_file),
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{base_url}/execution/",
            "AIRFLOW__API__BASE_URL": base_url,
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(port),
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API__SECRET_KEY": secrets.token_hex(16),
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(32),
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            # no DAG file changes while the services run: each is parsed once (re-parsing them every
            # 30 s, Airflow's default, took 9 % of a core while the services were idle)
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "3600",
            "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1",
            "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "False",
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__CHECKPOINT__STORAGE_ROOT": f"file://{root / 'checkpoints'}",
            "AIRFLOW__CHECKPOINT__SAVEPOINT_ROOTS": f"file://{root / 'savepoints'}",
            "CLICKSTREAM_DIR": str(root / "clickstream"),
            **(extra or {}),
        }
    )
    # Each step task starts its own Spark JVM, three at once on a small machine: the C1
    # compiler alone and the serial GC start them faster and with less CPU. Set
    # JDK_JAVA_OPTIONS yourself (even empty) to run the JVMs with other options.
    env.setdefault("JDK_JAVA_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
    return env


def _healthy(live: LiveAirflow) -> bool:
    live.check_alive()
    r = live.client.get("/api/v2/monitor/health")
    if r.status_code != 200:
        return False
    health = r.json()
    components = ("metadatabase", "scheduler", "dag_processor", "triggerer")
    return all((health.get(c) or {}).get("status") == "healthy" for c in components)


def _dags_parsed(live: LiveAirflow, dag_ids: tuple[str, ...] = DAGS) -> bool:
    live.check_alive()
    errors = live.api_json("GET", "/api/v2/importErrors")["import_errors"]
    if errors:
        raise ServiceError("DAG import errors:\n" + "\n".join(f"{e['filename']}: {e['stack_trace']}" for e in errors))
    return all(live.api("GET", f"/api/v2/dags/{dag_id}").status_code == 200 for dag_id in dag_ids)


@contextlib.contextmanager
def running_airflow(
    root: Path,
    startup_timeout: float = 240.0,
    dags_folder: Path = REPO / "dags",
    dag_ids: tuple[str, ...] = DAGS,
    extra_env: dict[str, str] | None = None,
    installed_bin: Path | None = None,
    topology: Topology | None = None,
) -> Iterator[LiveAirflow]:
    """Migrate the DB, start the services of ``topology`` (default: :class:`Topology`'s), wait until
    they are healthy, the Celery workers ready and the DAGs ``dag_ids`` of ``dags_folder`` parsed and
    unpaused; stop everything on exit, also after a failure. ``installed_bin``: run them from that venv
    instead (:func:`service_env`)."""
    topology = topology or Topology()
    held = reserved_port()
    port = int(held.getsockname()[1])
    passwords = {user: secrets.token_urlsafe(12) for user in USER_ROLES}
    password = passwords[ADMIN_USER]
    home = root / "airflow-home"
    for d in (
        home,
        root / "plugins",
        root / "service-logs",
        root / "clickstream" / "landing",
        root / "checkpoints",
        root / "savepoints",
    ):
        d.mkdir(parents=True, exist_ok=True)
    password_file = home / "simple_auth_manager_passwords.json"
    password_file.write_text(json.dumps(passwords) + "\n")  # SimpleAuthManager keeps known users
    live = LiveAirflow(
        root=root,
        port=port,
        password=password,
        env=service_env(root, port, password_file, dags_folder, {**topology.env(), **(extra_env or {})}, installed_bin),
        bin_dir=installed_bin or VENV_BIN,
        passwords=passwords,
        topology=topology,
    )
    try:
        with open(live.log_of("db-migrate"), "wb") as log:
            migrated = subprocess.run(
                [str(live.bin_dir / "airflow"), "db", "migrate"],
                env=live.env,
                cwd=home,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=300,
            )
        if migrated.returncode != 0:
            raise ServiceError(f"airflow db migrate failed:\n{tail(live.log_of('db-migrate'))}")
        live.start("dag-processor", "dag-processor")
        for name in topology.scheduler_names():
            live.start(name, "scheduler", "--skip-serve-logs")  # task logs are local files
        live.start("triggerer", "triggerer", "--skip-serve-logs")  # deferred sensors wait here
        for name in topology.worker_names():
            live.start(name, *topology.worker_command(name))
        held.close()
        live.start("api-server", "api-server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1")
        try:
            started = time.monotonic()
            poll(
                "api-server, scheduler, dag-processor and triggerer to report healthy",
                lambda: _healthy(live),
                startup_timeout,
            )
            live.wait_for_workers(topology.worker_names(), max(30.0, startup_timeout - (time.monotonic() - started)))
            remaining = max(30.0, startup_timeout - (time.monotonic() - started))
            poll(
                f"DAGs {', '.join(dag_ids)} to be parsed", lambda: _dags_parsed(live, dag_ids), remaining, interval=2.0
            )
            for dag_id in dag_ids:
                dag = live.api_json("PATCH", f"/api/v2/dags/{dag_id}", json={"is_paused": False})
                if dag["is_paused"]:
                    raise ServiceError(f"DAG {dag_id} is still paused after PATCH is_paused=false")
        except ServiceError as e:
            raise ServiceError(f"{e}\n{live.diagnostics()}") from None
        yield live
    finally:
        held.close()
        live.close()
        for name in reversed(list(live.procs)):
            stop_process_group(live.procs[name])
