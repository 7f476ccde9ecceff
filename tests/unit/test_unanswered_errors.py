"""Which psycopg errors mean the database could not answer (decide without it) and which are
a statement of ours it refused (raise it): ``infrastructure/postgres/unanswered.py``."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import errors

from flowledger.infrastructure.postgres.unanswered import unanswered


@pytest.mark.parametrize(
    "error",
    [
        errors.AdminShutdown("terminating connection due to administrator command"),
        errors.QueryCanceled("canceling statement due to statement timeout"),
        errors.LockNotAvailable("canceling statement due to lock timeout"),
        errors.DeadlockDetected("deadlock detected"),
        errors.SerializationFailure("could not serialize access"),
        errors.IdleInTransactionSessionTimeout("terminating connection due to idle-in-transaction timeout"),
        errors.TooManyConnections("sorry, too many clients already"),
        errors.OutOfMemory("out of shared memory"),
        errors.CannotConnectNow("the database system is starting up"),
        errors.ConnectionFailure("connection failure"),
        errors.DataCorrupted("invalid page in block 0"),
        psycopg.OperationalError("server closed the connection unexpectedly"),
        errors.ConnectionTimeout("connection timeout expired"),
    ],
    ids=lambda error: type(error).__name__,
)
def test_a_database_that_could_not_answer_is_unanswered(error: psycopg.Error) -> None:
    assert unanswered(error)


@pytest.mark.parametrize(
    "error",
    [
        errors.SyntaxError('syntax error at or near "SELEC"'),
        errors.UndefinedColumn('column "originator" does not exist'),
        errors.UndefinedFunction("function pg_try_advisory_xact_lock(text) does not exist"),
        errors.UndefinedTable('relation "events" does not exist'),
        errors.InvalidTextRepresentation('invalid input syntax for type uuid: "x"'),
        errors.InFailedSqlTransaction("current transaction is aborted"),
        errors.StatementTooComplex("stack depth limit exceeded"),
        errors.ObjectNotInPrerequisiteState("not in prerequisite state"),
        psycopg.InterfaceError("the cursor is closed"),
        psycopg.ProgrammingError("the query has 2 placeholders but 1 parameters were passed"),
        psycopg.DataError("cannot dump int"),
    ],
    ids=lambda error: type(error).__name__,
)
def test_a_statement_of_ours_the_database_refused_is_not(error: psycopg.Error) -> None:
    assert not unanswered(error)
