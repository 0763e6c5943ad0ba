"""Pipeline-wide defaults of every source: what a malformed record does, where dead letters go."""

from __future__ import annotations

from dataclasses import dataclass

from airflow_provider_checkpoint.exceptions import PipelineDefinitionError

ON_MALFORMED = ("fail", "dead_letter")


def check_malformed_policy(owner: str, on_malformed: str | None, max_malformed_fraction: float | None) -> None:
    """Refuse an ``on_malformed`` outside :data:`ON_MALFORMED` or a fraction outside [0, 1]."""
    if on_malformed is not None and on_malformed not in ON_MALFORMED:
        raise PipelineDefinitionError(f"{owner}: on_malformed must be one of {ON_MALFORMED}, got {on_malformed!r}")
    fraction = max_malformed_fraction
    if fraction is not None and (isinstance(fraction, bool) or not isinstance(fraction, int | float)):
        raise PipelineDefinitionError(f"{owner}: max_malformed_fraction must be a number, got {fraction!r}")
    if fraction is not None and not 0 <= fraction <= 1:
        raise PipelineDefinitionError(f"{owner}: max_malformed_fraction must be in [0, 1], got {fraction!r}")


@dataclass(frozen=True)
class SourceDefaults:
    """Pipeline-wide settings a source takes unless it sets its own.

    ``dead_letter_path``: the directory of the dead-letter tables, one per source at
    ``<dead_letter_path>/<source uid>`` (``None``: a source routing to dead letters must
    name its own table).
    """

    on_malformed: str = "fail"
    max_malformed_fraction: float = 0.5
    dead_letter_path: str | None = None

    def __post_init__(self) -> None:
        check_malformed_policy("pipeline", self.on_malformed, self.max_malformed_fraction)


def resolve_malformed(
    uid: str,
    own: tuple[str | None, float | None],
    dead_letter_path: str | None,
    defaults: SourceDefaults | None,
    parseable: bool,
) -> tuple[str, float, str | None]:
    """A source's ``(on_malformed, max_malformed_fraction, dead-letter table)``: its ``own`` settings,
    else the pipeline's ``defaults``; a source whose records always parse (Parquet, raw bytes) fails.
    The table is ``None`` unless routing to dead letters: the source's ``dead_letter_path``, else
    ``<pipeline dead_letter_path>/<uid>``, else :class:`PipelineDefinitionError`."""
    defaults = defaults or SourceDefaults()
    on_malformed = own[0] or defaults.on_malformed if parseable else "fail"
    fraction = defaults.max_malformed_fraction if own[1] is None else own[1]
    if on_malformed == "fail":
        return on_malformed, fraction, None
    if dead_letter_path is not None:
        return on_malformed, fraction, dead_letter_path
    if defaults.dead_letter_path is None:
        raise PipelineDefinitionError(
            f"{uid}: on_malformed='dead_letter' needs a dead-letter table: set dead_letter_path "
            "on the source or on the pipeline (a pipeline whose storage uses a connection has no default)"
        )
    return on_malformed, fraction, f"{defaults.dead_letter_path.rstrip('/')}/{uid}"
