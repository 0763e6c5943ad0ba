"""The exceptions the provider raises on purpose: one small hierarchy.

- :class:`CheckpointError` — the base; catch it to catch anything the provider refuses
  or aborts on purpose.
- :class:`RefusedInputError` — a stored document, a UI or CLI param, a path, a record or
  a pipeline definition was refused. Nothing was read, moved, written or deleted because
  of it, and a retry cannot help: tasks fail without retry, the CLI prints the message and
  exits 2, the plugin answers HTTP 400 with it. The message names the document (or
  param), the field and the rule.
- :class:`CheckpointStorageError` — a checkpoint file is missing, corrupt or unreadable.
- :class:`CheckpointAbortedError` — a pending checkpoint cannot complete.

Subclasses live next to the code that raises them (``DocumentError`` with the decoders,
``UnsafePathError`` with path confinement, …); callers catch these bases.
"""

from __future__ import annotations


class CheckpointError(Exception):
    """Base of every exception the provider raises on purpose."""


class RefusedInputError(CheckpointError, ValueError):
    """Input was refused before any effect; the message names the document, the field and the rule."""


class CheckpointStorageError(CheckpointError, RuntimeError):
    """A checkpoint file is missing, corrupt or unreadable; the message names it."""


class CheckpointAbortedError(CheckpointError):
    """A checkpoint cannot complete; subclasses carry the abort reason."""
