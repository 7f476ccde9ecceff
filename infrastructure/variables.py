"""The ``FLOWLEDGER_*`` environment variables flowledger reads, and the refusal of a name that
misses one of them by a typo (read as unset, it chose a default in silence)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from flowledger.domain.errors import ValidationError

PREFIX = "FLOWLEDGER_"
READ: frozenset[str] = frozenset(
    {
        "FLOWLEDGER_AGENT_LOCKS",
        "FLOWLEDGER_API_KEYS",
        "FLOWLEDGER_AUDIT_CHAIN",
        "FLOWLEDGER_AUDIT_KEY_DIR",
        "FLOWLEDGER_CHAIN_KEY",
        "FLOWLEDGER_CHAIN_KEY_REPLACED",
        "FLOWLEDGER_CHECKPOINT_EVERY_EVENTS",
        "FLOWLEDGER_CHECKPOINT_EVERY_S",
        "FLOWLEDGER_CLASSIFY_LOCK_WAIT_S",
        "FLOWLEDGER_CONNECT_TIMEOUT_S",
        "FLOWLEDGER_DASHBOARD_URL_KEYS",
        "FLOWLEDGER_DATABASE_URL",
        "FLOWLEDGER_DATA_KEY_CACHE_S",
        "FLOWLEDGER_EVENT_PARTITIONS",
        "FLOWLEDGER_GROUP_COMMIT",
        "FLOWLEDGER_GROUP_COMMIT_LEADERS",
        "FLOWLEDGER_HOME",
        "FLOWLEDGER_HTTP_AUTH_FAILURES",
        "FLOWLEDGER_HTTP_AUTH_FAILURE_WINDOW_S",
        "FLOWLEDGER_HTTP_MAX_BODY_BYTES",
        "FLOWLEDGER_HTTP_MAX_TENANT_ENGINES",
        "FLOWLEDGER_HTTP_RATE_BURST",
        "FLOWLEDGER_HTTP_RATE_PER_S",
        "FLOWLEDGER_LIBPQ_PARAMS",
        "FLOWLEDGER_LLM_API_KEY",
        "FLOWLEDGER_LLM_BASE_URL",
        "FLOWLEDGER_LLM_BREAKER_RECOVERY_S",
        "FLOWLEDGER_LLM_BREAKER_THRESHOLD",
        "FLOWLEDGER_LLM_CONNECT_TIMEOUT_S",
        "FLOWLEDGER_LLM_DEFAULT_MODEL",
        "FLOWLEDGER_LLM_KEEPALIVE_S",
        "FLOWLEDGER_LLM_MAX_REPLY_BYTES",
        "FLOWLEDGER_LLM_MAX_RETRIES",
        "FLOWLEDGER_LLM_MAX_TOKENS",
        "FLOWLEDGER_LLM_READ_TIMEOUT_S",
        "FLOWLEDGER_LLM_REQUEST_TIMEOUT_S",
        "FLOWLEDGER_LLM_RPM",
        "FLOWLEDGER_LLM_STREAM",
        "FLOWLEDGER_LLM_TPM",
        "FLOWLEDGER_LLM_TRANSPORT",
        "FLOWLEDGER_LLM_UNPRICED_MODELS",
        "FLOWLEDGER_MAX_CONFLICT_RETRIES",
        "FLOWLEDGER_OPERATION_DEADLINE_S",
        "FLOWLEDGER_PGBOUNCER",
        "FLOWLEDGER_POOL_SIZE",
        "FLOWLEDGER_POOL_TIMEOUT_S",
        "FLOWLEDGER_PRICING_FILE",
        "FLOWLEDGER_READY_TIMEOUT_S",
        "FLOWLEDGER_READ_DATABASE_URL",
        "FLOWLEDGER_ROUTING_FILE",
        "FLOWLEDGER_SCHEMA",
        "FLOWLEDGER_SEAL_PERSONAL_DATA",
        "FLOWLEDGER_SIGNING_KEY",
        "FLOWLEDGER_SKILL_CATALOGUE_FILE",
        "FLOWLEDGER_STATEMENT_TIMEOUT_S",
        "FLOWLEDGER_STEP_LEASE_S",
        "FLOWLEDGER_TENANT",
        "FLOWLEDGER_WEBHOOK_ALLOW_PRIVATE",
        "FLOWLEDGER_WEBHOOK_STRICT",
        "FLOWLEDGER_WRITE_CACHE_BYTES",
    }
)
"""Every variable some part of flowledger reads (``tests/unit/test_settings.py`` checks the
source for others)."""
INTERNAL: frozenset[str] = frozenset({"FLOWLEDGER_LIBPQ_PARAMS"})
"""Names among ``READ`` that the engine sets for itself (the database URL's other parameters,
handed to the event library's pool), not a user: the README's configuration table lists the
others (``tests/unit/test_settings.py``)."""
LEFT_ALONE: frozenset[str] = frozenset(
    {
        "FLOWLEDGER_TEST_DATABASE_URL",
        "FLOWLEDGER_TEST_RUN_ID",
        "FLOWLEDGER_TEST_ARTIFACTS",
        "FLOWLEDGER_FUZZ_EXAMPLES",
        "FLOWLEDGER_FUZZ_REPORT",
        "FLOWLEDGER_SOAK_SECONDS",
    }
)
"""Names the test suite and the make targets read: not settings, yet not typos either."""
_CLOSE = 0.85
"""difflib's ratio from which a name is taken for a typo of one read: a letter dropped,
swapped or doubled, or a unit suffix left off, in names of this length."""


def refuse_misspelt_variables(names: Iterable[str]) -> None:
    """Refuse a ``FLOWLEDGER_*`` name that is not read but resembles one that is, naming both;
    a name of the embedding service's own that resembles none is left alone."""
    for name in sorted(names):
        if not name.startswith(PREFIX) or name in READ or name in LEFT_ALONE:
            continue
        meant = difflib.get_close_matches(name, READ, n=1, cutoff=_CLOSE)
        if meant:
            raise ValidationError(name, f"is not a variable flowledger reads: did you mean {meant[0]}?")
