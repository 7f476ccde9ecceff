"""How the CLI and the dashboard page write an analytics group as text, so that the group of
calls with no model (sessions without a breakdown's value) reads apart from every name.

The projections give such a group as None (JSON ``null``). Written ``(no model)``, it could
still be passed for by a model a provider or caller named so; so every name of the shape
``(…)``, with any double quotes around it, is written inside one more pair of double quotes:
no name is then written as a bare ``(…)``, and two names are never written alike. The shape is
judged without spaces and characters drawn as nothing (``(no model)`` and a zero-width space
read as the group on a page and in a terminal). A task's step (``TaskStep``) is written bare as
``(task classification)``, which a session step of any name is not.
"""

from __future__ import annotations

import re

from flowledger.domain.bounds import IGNORABLE_CLASS
from flowledger.projections import TaskStep

_BRACKETED = re.compile(r'"*\(.*\)"*', re.DOTALL)
_UNSEEN = re.compile(rf"[\s{IGNORABLE_CLASS}]")


def group_label(value: object, grouping: str) -> str:
    """``value`` of the ``grouping`` (``model``, ``metadata.channel``, ``hour`` …) as text:
    ``(no model)`` for None, ``(task classification)`` for a task's step, a name of the shape
    ``(…)`` quoted (``"(none)"``), any other value as written."""
    if value is None:
        return f"(no {grouping})"
    if isinstance(value, TaskStep):
        return f"(task {value.task_step})"
    text = str(value)
    return f'"{text}"' if _BRACKETED.fullmatch(_UNSEEN.sub("", text)) else text
