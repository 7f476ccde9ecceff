"""flowledger projections: read models in PostgreSQL, rebuilt from the log and kept current.

Current state (``sessions``), the cost dashboard (``llm_calls``), the completion funnel
(``funnel_sessions``, ``funnel_steps``) and the seed article's ``workflow_states`` /
``workflow_executions``, all readable as views in the ``<schema>_read`` schema. Every row
carries its tenant, and every query function takes the ``tenant`` whose rows it reads.
"""

from flowledger.domain.errors import RebuildInProgress
from flowledger.projections.base import Envelope, Projection
from flowledger.projections.cost_queries import DashboardRow, Price, RepriceRow, TaskStep, dashboard, reprice
from flowledger.projections.dead_letters import DeadLetter
from flowledger.projections.follow import follow, follow_until_stopped
from flowledger.projections.funnel_queries import FunnelReport, FunnelStep, funnel_report, workflows
from flowledger.projections.processor import Projector
from flowledger.projections.rebuild import Difference, rebuild, verify
from flowledger.projections.registry import all_projections, projector_for, tenant_views
from flowledger.projections.status import BuildStatus, dead_letter_events, recent_dead_letters, status

__all__ = [
    "BuildStatus",
    "DashboardRow",
    "DeadLetter",
    "Difference",
    "Envelope",
    "FunnelReport",
    "FunnelStep",
    "Price",
    "Projection",
    "Projector",
    "RebuildInProgress",
    "RepriceRow",
    "TaskStep",
    "all_projections",
    "dashboard",
    "dead_letter_events",
    "follow",
    "follow_until_stopped",
    "funnel_report",
    "projector_for",
    "rebuild",
    "recent_dead_letters",
    "reprice",
    "status",
    "tenant_views",
    "verify",
    "workflows",
]
