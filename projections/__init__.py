"""flowledger projections: read models in PostgreSQL, rebuilt from the log and kept current.

Current state (``sessions``), the cost dashboard (``llm_calls``), the completion funnel
(``funnel_sessions``, ``funnel_steps``) and the seed article's ``workflow_states`` /
``workflow_executions``, all readable as views in the ``<schema>_read`` schema.
"""

from flowledger.domain.errors import RebuildInProgress
from flowledger.projections.base import Envelope, Projection
from flowledger.projections.cost_queries import DashboardRow, Price, RepriceRow, dashboard, reprice
from flowledger.projections.follow import follow, follow_until_stopped
from flowledger.projections.funnel_queries import FunnelReport, FunnelStep, funnel_report
from flowledger.projections.processor import Projector
from flowledger.projections.rebuild import Difference, rebuild, verify
from flowledger.projections.registry import all_projections, projector_for
from flowledger.projections.status import BuildStatus, status

__all__ = [
    "BuildStatus",
    "DashboardRow",
    "Difference",
    "Envelope",
    "FunnelReport",
    "FunnelStep",
    "Price",
    "Projection",
    "Projector",
    "RebuildInProgress",
    "RepriceRow",
    "all_projections",
    "dashboard",
    "follow",
    "follow_until_stopped",
    "funnel_report",
    "projector_for",
    "rebuild",
    "reprice",
    "status",
    "verify",
]
