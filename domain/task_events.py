"""Task events declared outside the aggregate's module, which had grown past its bound.

``Task`` (``task.py``) names each of them in its body, and the event library redefines them
there as ``Task.<Name>`` in ``flowledger.domain.task``: that is the topic they are stored under
(``tests/unit/test_event_topics.py``), as for ``session_events.py``. Declared here, the classes
themselves are never stored; use ``Task.<Name>``.
"""

from __future__ import annotations

from flowledger.domain.aggregate import FlowledgerAggregate
from flowledger.domain.values import LlmUsage


class RankingDiscarded(FlowledgerAggregate.Event):
    """A paid model-ranking call (routing's ``model_ranked_matching``) that no assignment or
    escalation recorded: the task waited for capacity, another command had taken it during
    the call, or the assignment was refused. Kept for its cost; the task is unchanged."""

    class_version = 1
    reason: str
    usage: LlmUsage
