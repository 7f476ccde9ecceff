"""An append that never reached the server: its outcome is known (nothing was stored)."""

from __future__ import annotations

from eventsourcing.persistence import OperationalError


class AppendNotSent(OperationalError):
    """The append was not sent: no pooled connection could be taken, or its operation ended
    while it waited for a group commit's leader. Nothing was stored, so the store does not
    count the attempt as one whose outcome is unknown (``StoreUnavailable.outcome_unknown``)."""


__all__ = ["AppendNotSent"]
