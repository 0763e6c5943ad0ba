"""The ``airflow checkpoints`` command group (loaded by Airflow's CLI parser through the provider info)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

EXIT_CODES = """Exit codes scripts can rely on:

* ``0`` — done (for ``audit``: the job is clean; for ``restore --dry-run``: the snapshot is restorable;
  for ``check``: the pipeline passes the pipeline check)
* ``1`` — an unexpected error (a traceback: please report it)
* ``2`` — refused: wrong usage (argparse), an unknown job or checkpoint, a path outside the
  allowed roots, a snapshot that cannot be restored, a malformed stored document; the
  message names the document or argument, the field and the rule
* ``3`` — ``audit`` or ``check`` found problems (one finding a line)
"""


def _at_least(low: int) -> Callable[[str], int]:
    """An argparse ``type``: an integer ``>= low``, else argparse's usage error (exit 2, no traceback)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if not low <= value <= sys.maxsize:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer >= {low}")
        return value

    return parse


def get_cli_commands() -> list[Any]:
    from airflow.cli.cli_config import (
        ARG_BUNDLE_NAME,
        ARG_DAGFILE_PATH,
        ARG_OUTPUT,
        ActionCommand,
        Arg,
        GroupCommand,
        lazy_load_command,
    )

    def command(name: str) -> Any:
        return lazy_load_command(f"airflow_provider_checkpoint.cli.commands.{name}")

    job = Arg(("job_id",), help="The checkpointed job (a pipeline's job_id, by default its dag_id)")
    offset = Arg(("--offset",), help="Rows to skip (newest first)", type=_at_least(0), default=0)
    limit = Arg(("--limit",), help="Rows to show", type=_at_least(1), default=20)
    commands = [
        ActionCommand(
            name="list",
            help="List every checkpointed job and its status",
            func=command("list_jobs_command"),
            args=(ARG_OUTPUT,),
        ),
        ActionCommand(
            name="history",
            help="Checkpoint history of a job, newest first",
            func=command("history"),
            args=(job, offset, limit, ARG_OUTPUT),
        ),
        ActionCommand(
            name="show",
            help="One checkpoint of a job: stats, operators' state, sinks",
            func=command("show"),
            args=(job, Arg(("checkpoint_id",), help="The checkpoint id", type=int), ARG_OUTPUT),
        ),
        ActionCommand(
            name="savepoint",
            help="Trigger a savepoint run of a pipeline DAG",
            func=command("savepoint"),
            args=(
                Arg(("dag_id",), help="The pipeline DAG"),
                Arg(("--stop",), help="Set the job STOPPED once the savepoint is written", action="store_true"),
                Arg(
                    ("--dir",),
                    help="Savepoint directory (under an allowed root); default: the first savepoint root",
                    dest="savepoint_dir",
                ),
            ),
        ),
        ActionCommand(
            name="restore",
            help="Request a restore of a job from a checkpoint or savepoint (taken by its next checkpoint)",
            func=command("restore"),
            args=(
                job,
                Arg(("--checkpoint",), help="'latest', a checkpoint id, or a checkpoint/savepoint path", required=True),
                Arg(
                    ("--allow-non-restored-state",),
                    help="Drop state of operators the pipeline no longer has",
                    action="store_true",
                ),
                Arg(("--dry-run",), help="Validate only; write nothing", action="store_true"),
            ),
        ),
        ActionCommand(
            name="check",
            help="Check a pipeline DAG before it runs: every step's Spark plan on empty input, every sink "
            "against its existing table (the check the trigger runs once per version)",
            func=command("check"),
            args=(Arg(("dag_id",), help="The pipeline DAG"), ARG_BUNDLE_NAME, ARG_DAGFILE_PATH, ARG_OUTPUT),
        ),
        ActionCommand(
            name="audit",
            help="Check a quiescent job's storage for leftovers and damage",
            func=command("audit"),
            args=(job,),
        ),
    ]
    return [
        GroupCommand(
            name="checkpoints",
            help="Checkpointed jobs: status, history, savepoints, restore, audit, check",
            subcommands=commands,
            epilog=EXIT_CODES.replace("``", ""),
        )
    ]
