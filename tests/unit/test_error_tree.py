"""Errors that reach a user are flowledger's own: bad input is a ValidationError; the tree names them all."""

from __future__ import annotations

import asyncio
import importlib
import inspect
import socket
from queue import Queue
from typing import Any, cast

import pytest

from flowledger.adapters.simulator import FaultRates, Simulator, SimulatorConfig
from flowledger.domain import errors
from flowledger.projections import RebuildInProgress, all_projections
from flowledger.projections.catalog import Names
from flowledger.projections.follow import CONNECTION_ERRORS, _next_batch
from flowledger.projections.processor import Projector


def _projector(batch_size: int = 10) -> Projector:
    # Nothing connects when a Projector is built, so the store's parts are not needed here.
    return Projector(
        database_url="postgresql://unused",
        store_schema="flowledger",
        recorder=cast(Any, None),
        mapper=cast(Any, None),
        projections=all_projections(),
        batch_size=batch_size,
    )


def test_every_error_class_is_drawn_in_the_tree() -> None:
    tree = errors.__doc__ or ""
    classes = [
        c for _, c in inspect.getmembers(errors, inspect.isclass) if issubclass(c, errors.FlowledgerError)
    ]
    assert [c.__name__ for c in classes if c.__name__ not in tree] == []


def test_every_error_class_can_be_imported_from_flowledger_domain() -> None:
    # (BudgetExceeded, CircuitOpen, LlmCallFailed, SessionArchived and eight more were only in
    # flowledger.domain.errors: `from flowledger.domain import BudgetExceeded`, beside the
    # README's `from flowledger.domain import SessionExpired`, was an ImportError.)
    domain = importlib.import_module("flowledger.domain")
    classes = {
        name
        for name, value in vars(errors).items()
        if inspect.isclass(value) and issubclass(value, errors.FlowledgerError)
    }
    assert classes - set(domain.__all__) == set()
    assert all(getattr(domain, name) is getattr(errors, name) for name in classes)


def test_an_unknown_projection_name_is_a_validation_error_that_lists_the_known_ones() -> None:
    with pytest.raises(errors.ValidationError) as raised:
        _projector().select(["cost", "costs"])
    assert raised.value.field == "projection"
    assert "'costs'" in raised.value.message
    assert "funnel" in raised.value.message


def test_a_batch_size_below_one_is_a_validation_error() -> None:
    with pytest.raises(errors.ValidationError) as raised:
        _projector(batch_size=0)
    assert raised.value.field == "batch_size"


def test_a_store_schema_too_long_for_postgresql_is_a_validation_error() -> None:
    with pytest.raises(errors.ValidationError) as raised:
        _ = Names("s" * 60).control
    assert raised.value.field == "store_schema"


def test_a_rebuild_elsewhere_is_a_flowledger_error_still_importable_from_its_old_home() -> None:
    old_home = importlib.import_module("flowledger.projections.rebuild")
    assert old_home.RebuildInProgress is RebuildInProgress is errors.RebuildInProgress
    assert RebuildInProgress("cost").projection == "cost"


def test_a_subscription_that_ends_early_is_an_outage_the_follower_reconnects_after() -> None:
    inbox: Queue[Any] = Queue()
    inbox.put(None)
    with pytest.raises(
        errors.StoreUnavailable,
        match=r"the event store is unavailable \(follow\): the notification subscription ended",
    ):
        _next_batch(inbox, 10)
    assert errors.StoreUnavailable in CONNECTION_ERRORS


def test_impossible_fault_rates_are_a_validation_error() -> None:
    with pytest.raises(errors.ValidationError) as raised:
        FaultRates(rate_limited=0.7, server_error=0.6)
    assert raised.value.field == "faults"


def test_a_simulator_port_already_taken_is_a_validation_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        simulator = Simulator(SimulatorConfig(host="127.0.0.1", port=port))
        with pytest.raises(errors.ValidationError) as raised:
            asyncio.run(simulator.start())
    assert raised.value.field == "port"
