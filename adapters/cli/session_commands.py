"""CLI commands on sessions: ``history`` and ``replay`` read them, ``extend`` moves the expiry,
``expire-sessions`` records the expiries that have passed, ``fork`` starts one from another,
``forget`` erases a user's; and ``demo``."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn

from flowledger.adapters.cli.consoles import cli_console, transient_progress
from flowledger.adapters.cli.errors import reported_errors
from flowledger.adapters.cli.number_arguments import NumberArguments, real_number, whole_number
from flowledger.adapters.cli.rendering import history_table, session_table
from flowledger.domain.bounds import require_count, require_moment
from flowledger.domain.errors import ValidationError
from flowledger.domain.hours import hours_as_duration
from flowledger.domain.session_rules import MAX_SWEEP, require_sweep_limit
from flowledger.infrastructure import Engine
from flowledger.projections.expiry import expire_overdue
from flowledger.projections.registry import projector_for

console = cli_console()


def history(session_id: Annotated[str, typer.Argument(help="The caller's session id.")]) -> None:
    """Print a session's events, oldest first."""
    with reported_errors(), Engine() as engine:
        console.print(history_table(session_id, engine.history(session_id)))


def replay(
    session_id: Annotated[str, typer.Argument(help="The caller's session id.")],
    version: Annotated[
        int | None, typer.Option(help="Replay up to this version.", parser=whole_number)
    ] = None,
    as_of: Annotated[
        str | None, typer.Option("--as-of", help="Replay as it was at this ISO time (with zone).")
    ] = None,
) -> None:
    """Print a session's state as it was at a version or a moment."""
    with reported_errors():
        moment = parse_time(as_of) if as_of is not None else None
        with Engine() as engine:
            console.print(session_table(engine.get_session(session_id, version=version, as_of=moment)))


def extend(
    session_id: Annotated[str, typer.Argument(help="The caller's session id.")],
    hours: Annotated[
        float | None, typer.Option(help="Hours added to the current expiry.", parser=real_number)
    ] = None,
    until: Annotated[
        str | None, typer.Option(help="Set the expiry to this ISO time (with zone) instead.")
    ] = None,
    reopen: Annotated[
        bool, typer.Option("--reopen", help="Reopen an expired session (for --hours from now, or --until).")
    ] = False,
    idempotency_key: Annotated[
        str | None,
        typer.Option(
            help="Run again with the same key (a retry after a timeout), the expiry moves once and"
            " the first run's answer is printed; the same key with other hours or moment is refused."
        ),
    ] = None,
) -> None:
    """Move a session's expiry: add --hours to it (24 h + 2 h is 26 h), or set it --until a moment."""
    with reported_errors():
        by = None if hours is None else hours_as_duration(hours, bounded=False)
        to = None if until is None else parse_time(until, "until")
        with Engine() as engine:
            try:
                change = engine.change_expiry(
                    session_id, by=by, to=to, reopen_expired=reopen, idempotency_key=idempotency_key
                )
            except ValidationError as refused:  # --hours, which the engine calls by
                raise (refused.named("hours") if refused.field == "by" else refused) from None
        after = change.state.expires_at.isoformat(timespec="seconds")
        before = change.previous_expires_at.isoformat(timespec="seconds")
        how = "reopened: it had expired" if change.reopened else f"it was {before}"
        console.print(f"session {session_id!r} now expires at {after} ({how})", highlight=False)


def expire_sessions(
    limit: Annotated[
        int,
        typer.Option(help=f"The most sessions one run looks at (1 to {MAX_SWEEP:,}).", parser=whole_number),
    ] = 1000,
    tenant: Annotated[
        str | None, typer.Option(help="Whose sessions (default: FLOWLEDGER_TENANT or 'default').")
    ] = None,
) -> None:
    """Record Expired for every active session whose expiry has passed (run it from cron: a
    session nobody touches again otherwise stays active in the read models and the funnel)."""
    with reported_errors():
        require_sweep_limit(limit)
        with Engine(tenant=tenant) as engine:
            projector = projector_for(engine)
            columns = (TextColumn("expiring sessions"), BarColumn(), MofNCompleteColumn())
            with transient_progress(console, *columns) as bar:
                task = bar.add_task("expire", total=None)
                sweep = expire_overdue(
                    engine, projector, limit=limit, on_session=lambda _sid, _done: bar.advance(task)
                )
        shown = ", ".join(sweep.expired[:20]) + (", ..." if len(sweep.expired) > 20 else "")
        more = "" if sweep.complete else f"; more may be overdue past --limit {limit}: run it again"
        console.print(
            f"expired {len(sweep.expired)} of {sweep.examined} overdue sessions"
            + (f" ({shown})" if sweep.expired else "")
            + more,
            markup=False,
            highlight=False,
        )


def fork(
    session_id: Annotated[str, typer.Argument(help="The session to fork.")],
    at_version: Annotated[
        int, typer.Argument(help="Its version whose state the fork starts from.", parser=whole_number)
    ],
    new_session_id: Annotated[str, typer.Argument(help="The new session's id (must not exist).")],
    ttl_hours: Annotated[
        float, typer.Option(help="The new session's time to live, in hours.", parser=real_number)
    ] = 24.0,
) -> None:
    """Start a new session from a session's state at a version (to retry a step with another model)."""
    with reported_errors():
        ttl = hours_as_duration(ttl_hours, "ttl_hours")
        with Engine() as engine:
            state = engine.fork_session(session_id, at_version, new_session_id, ttl)
            console.print(session_table(state))


def forget(
    user_id: Annotated[str | None, typer.Argument(help="The user whose personal data to erase.")] = None,
    session: Annotated[
        str | None, typer.Option(help="Erase this one session instead (e.g. one without a user id).")
    ] = None,
) -> None:
    """Erase a user's personal data (destroy their sessions' data keys); tokens, cost and latency stay."""
    with reported_errors():
        if user_id is None and session is None:
            raise ValidationError("user_id", "give a user id, or --session SESSION")
        if user_id is not None and session is not None:
            raise ValidationError("user_id", "give a user id, or --session SESSION, not both")
        with Engine() as engine:
            report = engine.forget(user_id) if user_id is not None else engine.forget_session(str(session))
        erased = ", ".join(report.sessions) or "none"
        if report.already_erased:
            erased += f"; already erased: {', '.join(report.already_erased)}"
        console.print(
            f"erased {len(report.sessions)} sessions ({erased}); {report.keys_destroyed} data keys destroyed",
            markup=False,
        )
        if report.old_key_versions_remain:
            console.print(
                "warning: the destroyed keys' old row versions may remain in the data-key table's file"
                " (a transaction begun before the erasure was still open): run VACUUM FULL on it once"
                " that transaction has ended (docs/erasure.md)",
                markup=False,
            )
        if report.in_the_clear:
            # Not forgotten while any of them stays readable: a non-zero exit, as `--session` of one.
            whose = f"of {user_id!r}" if user_id is not None else f"forked from {session!r}"
            raise ValidationError(
                "user_id" if user_id is not None else "session",
                f"{len(report.in_the_clear)} sessions {whose} were recorded without sealing and stay"
                f" in the clear ({', '.join(report.in_the_clear)}): no key to destroy",
            )


def demo(
    sessions: Annotated[
        int, typer.Option(help="How many scripted sessions to run.", parser=whole_number)
    ] = 300,
) -> None:
    """Run the demo job on the embedded PostgreSQL (or FLOWLEDGER_DATABASE_URL)."""
    from flowledger.adapters.cli.demo import run_demo

    with reported_errors():
        require_count("sessions", sessions, least=1, most=1_000_000)
        run_demo(console, sessions=sessions)


def parse_time(text: str, field: str = "as_of") -> datetime:
    """``text`` as a time with a zone, read as REST reads one (``moments.time_of_text``: RFC 3339),
    or a ValidationError on ``field``. Python's ``fromisoformat`` took ISO 8601's basic form and
    week dates, which REST refuses, and refused a lower-case ``t`` / ``z``, which REST reads. Digits
    alone are no time, as in REST's query strings: ``1796425540`` could be Unix seconds or
    milliseconds, so it is not guessed at. The zone and year-1 rule is the domain's, in its words
    (``require_moment``), as REST answers."""
    if text.strip().isdigit():
        raise ValidationError(
            field, f"{text!r} is a number, not a time: give one with a zone, like 2026-12-05T10:00:00Z"
        )
    from flowledger.adapters.http.moments import time_of_text  # pydantic: not at the CLI's start

    moment = time_of_text(text)
    if moment is None:
        raise ValidationError(field, f"{text!r} is not an RFC 3339 time (like 2026-12-05T10:00:00Z)")
    require_moment(field, moment)
    return moment


def register(app: typer.Typer) -> None:
    """Add these commands to the top-level app."""
    app.command()(history)
    app.command()(replay)
    app.command()(extend)
    app.command("expire-sessions")(expire_sessions)
    app.command(cls=NumberArguments)(fork)
    app.command()(forget)
    app.command()(demo)
