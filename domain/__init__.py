"""flowledger domain: aggregates, events, value objects and errors. Pure: no I/O."""

from flowledger.domain.agent import Agent, agent_uuid
from flowledger.domain.errors import (
    AgentAtCapacity,
    AgentConflict,
    AgentError,
    AgentNotFound,
    ConcurrentUpdate,
    FlowledgerError,
    SessionClosed,
    SessionConflict,
    SessionError,
    SessionExpired,
    SessionNotFound,
    StoreUnavailable,
    TaskConflict,
    TaskError,
    TaskNotFound,
    TaskNotHeld,
    TaskTransitionRejected,
    ValidationError,
)
from flowledger.domain.session import Session, session_uuid
from flowledger.domain.session_views import SessionState, SessionStatus, StepFailure, StepRecord
from flowledger.domain.task import Task, task_uuid
from flowledger.domain.task_views import (
    AgentState,
    EscalationReason,
    TaskPriority,
    TaskState,
    TaskStatus,
)
from flowledger.domain.values import LlmUsage

__all__ = [
    "Agent",
    "AgentAtCapacity",
    "AgentConflict",
    "AgentError",
    "AgentNotFound",
    "AgentState",
    "ConcurrentUpdate",
    "EscalationReason",
    "FlowledgerError",
    "LlmUsage",
    "Session",
    "SessionClosed",
    "SessionConflict",
    "SessionError",
    "SessionExpired",
    "SessionNotFound",
    "SessionState",
    "SessionStatus",
    "StepFailure",
    "StepRecord",
    "StoreUnavailable",
    "Task",
    "TaskConflict",
    "TaskError",
    "TaskNotFound",
    "TaskNotHeld",
    "TaskPriority",
    "TaskState",
    "TaskStatus",
    "TaskTransitionRejected",
    "ValidationError",
    "agent_uuid",
    "session_uuid",
    "task_uuid",
]
