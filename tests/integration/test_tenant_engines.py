"""``Engine.for_tenant``: tenants' engines over one store, each tenant's data its own."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest

from flowledger.domain.errors import SessionNotFound, TaskNotFound, ValidationError
from flowledger.infrastructure import Engine
from tests.support.llm import ScriptedLlm


def test_an_engine_for_another_tenant_shares_the_store_and_keeps_its_sessions_apart(engine: Engine) -> None:
    # Given the engine of another tenant over this engine's store
    globex = engine.for_tenant("globex")
    assert globex.tenant == "globex"
    assert globex.store is engine.store
    # When each tenant starts a session under the same id, and globex one of its own
    engine.start_session("same-id", "flow-of-default")
    globex.start_session("same-id", "flow-of-globex")
    globex.start_session("globex-only", "w")
    # Then each reads its own, and the other's is not found
    assert engine.get_session("same-id").workflow == "flow-of-default"
    assert globex.get_session("same-id").workflow == "flow-of-globex"
    with pytest.raises(SessionNotFound):
        engine.get_session("globex-only")
    assert [entry.version for entry in engine.history("same-id")] == [1]


def test_a_tenants_agents_and_tasks_stay_its_own_on_the_shared_store(engine: Engine) -> None:
    # Given globex's agent and task, assigned
    globex = engine.for_tenant("globex")
    globex.register_agent("a1", "Ann", ["billing"])
    globex.create_task("t1", "refund", ["billing"])
    assignment = globex.assign_task("t1").assignment
    assert assignment is not None
    assert assignment.agent_id == "a1"
    # Then the default tenant sees neither, and its own task finds no agent of globex's
    assert engine.list_agents() == []
    assert engine.open_tasks() == []
    with pytest.raises(TaskNotFound):
        engine.get_task("t1")
    engine.create_task("t2", "refund", ["billing"])
    assert engine.assign_task("t2").status == "escalated"
    assert globex.get_agent("a1").active_tasks == ("t1",)


def test_closing_a_tenant_engine_leaves_the_store_to_the_others(engine: Engine) -> None:
    # Given globex's session, written through a tenant engine that is then closed
    globex = engine.for_tenant("globex")
    globex.start_session("kept", "w")
    listeners = len(engine.store.saved_listeners)
    globex.close()
    # Then the owner's store still writes and reads, the closed engine stopped following saves,
    assert engine.start_session("after", "w").version == 1
    assert len(engine.store.saved_listeners) == listeners - 1
    # and a new engine of globex finds its session where it was left
    assert engine.for_tenant("globex").get_session("kept").workflow == "w"


async def test_a_step_in_flight_on_one_tenant_is_stored_when_another_tenants_engine_closes(
    engine: Engine,
) -> None:
    # Given a model call of acme's held open, on the store it shares with globex
    gate = asyncio.Event()
    engine.llm = model = ScriptedLlm(gate=gate)
    acme, globex = engine.for_tenant("acme"), engine.for_tenant("globex")
    await asyncio.to_thread(acme.start_session, "s", "w")
    step = asyncio.create_task(acme.process_step("s", "classify", {"q": "refund"}))
    while not model.calls:
        await asyncio.sleep(0.01)
    # When globex's engine closes (its services only) and the call then ends
    await asyncio.to_thread(globex.close)
    gate.set()
    # Then acme's step is stored, on the threads globex's engine shared
    assert (await step).step == "classify"
    assert [record.step for record in await asyncio.to_thread(acme.session_steps, "s")] == ["classify"]


def test_tenants_write_at_once_through_one_store(engine: Engine) -> None:
    # Given 20 tenants' engines over one store
    tenants = [engine.for_tenant(f"t{i:02d}") for i in range(20)]
    for tenant in tenants:
        tenant.start_session("s", f"flow-of-{tenant.tenant}")

    def steps(tenant: Engine) -> None:
        for n in range(10):
            tenant.record_step("s", f"step-{n}", output={"tenant": tenant.tenant})

    # When each records 10 steps on its own thread
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(steps, tenants))
    # Then every tenant has its 10 steps, and only its own
    for tenant in tenants:
        recorded = tenant.session_steps("s")
        assert [step.step for step in recorded] == [f"step-{n}" for n in range(10)]
        assert {step.output["tenant"] for step in recorded} == {tenant.tenant}


def test_an_engine_for_its_own_tenant_is_itself_and_a_bad_tenant_name_is_refused(engine: Engine) -> None:
    assert engine.for_tenant(engine.tenant) is engine
    assert engine.for_tenant("globex").for_tenant(engine.tenant).tenant == engine.tenant
    with pytest.raises(ValidationError):
        engine.for_tenant("")
    with pytest.raises(ValidationError):
        engine.for_tenant("bad\nname")


def test_each_tenants_assignments_hold_their_agent_locks_in_a_transaction_of_their_own(
    pg_engine: Engine,
) -> None:
    # Given two tenants' engines over one store, each assigning a task (a first batch takes
    # agent locks), then two batches borrowing agent locks at once
    for tenant in ("acme", "globex"):
        engine = pg_engine.for_tenant(tenant)
        engine.register_agent("a1", "Ann", ["billing"])
        engine.create_task("t1", "refund", ["billing"])
        assert engine.assign_task("t1").status == "assigned"
    lender = pg_engine._agent_lender
    assert lender is not None
    assert lender.made == 1  # the two tenants' batches, one after the other, used one connection
    acme_locks, globex_locks = lender.borrow(), lender.borrow()
    assert acme_locks is not globex_locks
    # When acme's batch takes its agent's lock, and globex's batch then ends (it took none)
    ann = pg_engine.for_tenant("acme").session_uuid("unused")  # any UUID: only the lock key matters
    taken, _ = acme_locks.try_lock([(ann, 0)])
    assert taken == [ann]
    globex_locks.end()
    # Then acme's batch still holds its lock, in its open transaction, for its append to commit
    assert acme_locks.transaction is not None
    assert ann in acme_locks.held
    acme_locks.end()
    lender.give_back(acme_locks)
    lender.give_back(globex_locks)
