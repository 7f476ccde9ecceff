"""The step events' orjson encoding decodes exactly as the library's own (infrastructure/fast_json.py)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any
from uuid import uuid4

from hypothesis import given
from hypothesis import strategies as st

from flowledger.domain import LlmUsage, ValidationError
from flowledger.domain.bounds import require_json
from flowledger.domain.session import Session
from flowledger.infrastructure import Engine
from flowledger.infrastructure.fast_json import FAST_EVENTS, StepEventMapper

TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12)
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | TEXT,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(TEXT, children, max_size=4),
    max_leaves=12,
)


def _mappers() -> tuple[Any, StepEventMapper]:
    engine = Engine.in_memory()
    fast = engine.store.app.mapper
    assert isinstance(fast, StepEventMapper)
    library = super(StepEventMapper, fast)  # the library's to_stored_event on the same transcoder
    return library, fast


@given(JSON, JSON, st.sampled_from([None, "k-1", "ключ-é"]), st.booleans())
def test_a_step_event_decodes_the_same_from_both_encodings(
    given_input: Any, given_output: Any, key: str | None, with_usage: bool
) -> None:
    payload_in, payload_out = {"value": given_input}, {"value": given_output}
    try:
        require_json("input", payload_in)
        require_json("output", payload_out)
    except ValidationError:
        return  # the domain refuses it before any encoding
    usage = (
        LlmUsage(
            provider="deepseek",
            request_model="deepseek-v3.2",
            input_tokens=12,
            output_tokens=3,
            cost_usd=Decimal("0.000197"),
            latency_ms=812.5,
            finish_reasons=("stop",),
        )
        if with_usage
        else None
    )
    event = Session.StepProcessed(  # type: ignore[call-arg]
        originator_id=uuid4(),
        originator_version=7,
        timestamp=datetime(2026, 11, 30, 18, 0, tzinfo=UTC),
        step="answer",
        input=payload_in,
        output=payload_out,
        next_step=None,
        context_update={"é": [1, 2.5, None]},
        usage=usage,
        idempotency_key=key,
        model="deepseek-v3.2" if with_usage else None,
    )
    object.__setattr__(event, "command_id", "cmd-1")
    library, fast = _mappers()
    slow_stored, fast_stored = library.to_stored_event(event), fast.to_stored_event(event)
    assert fast_stored.topic == slow_stored.topic
    assert fast_stored.originator_id == slow_stored.originator_id
    assert json.loads(fast_stored.state) == json.loads(slow_stored.state)
    assert vars(fast.to_domain_event(fast_stored)) == vars(fast.to_domain_event(slow_stored))


SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | TEXT
)


@given(st.none() | st.dictionaries(TEXT.filter(str.strip), SCALARS, max_size=6))
def test_a_step_failure_and_its_error_fields_decode_the_same_from_both_encodings(
    detail: dict[str, Any] | None,
) -> None:
    event = Session.StepFailed(  # type: ignore[call-arg]
        originator_id=uuid4(),
        originator_version=4,
        timestamp=datetime(2026, 11, 30, 18, 0, tzinfo=UTC),
        step="answer",
        error_type="budget_exceeded",
        error_message="budget session:s1 per month would be exceeded",
        usage=None,
        idempotency_key="k-1",
        error_detail=detail,
    )
    library, fast = _mappers()
    slow_stored, fast_stored = library.to_stored_event(event), fast.to_stored_event(event)
    assert json.loads(fast_stored.state) == json.loads(slow_stored.state)
    assert vars(fast.to_domain_event(fast_stored)) == vars(fast.to_domain_event(slow_stored))
    assert fast.to_domain_event(fast_stored).error_detail == detail


def test_without_floats_the_bytes_are_the_librarys() -> None:
    library, fast = _mappers()
    event = Session.ContextUpdated(  # type: ignore[call-arg]
        originator_id=uuid4(),
        originator_version=2,
        timestamp=datetime(2026, 11, 30, 18, 0, tzinfo=UTC),
        update={"order": "#12345", "note": 'délai "court"\n\t\x7f\u2028', "n": [1, -2, 2**63 - 1]},
    )
    assert fast.to_stored_event(event).state == library.to_stored_event(event).state


def test_what_orjson_refuses_takes_the_librarys_encoder() -> None:
    library, fast = _mappers()
    event = Session.ContextUpdated(  # type: ignore[call-arg]
        originator_id=uuid4(),
        originator_version=2,
        timestamp=datetime(2026, 11, 30, 18, 0, tzinfo=UTC),
        update={"big": 2**200},
    )
    stored = fast.to_stored_event(event)
    assert stored.state == library.to_stored_event(event).state
    assert fast.to_domain_event(stored).update == {"big": 2**200}  # type: ignore[attr-defined]


def test_snapshots_and_other_events_keep_the_librarys_encoder() -> None:
    engine = Engine.in_memory()
    engine.start_session("s", "customer_service")
    aggregate = engine.store.load(engine.session_uuid("s"))
    snapshot = Session.Snapshot.take(aggregate)
    assert type(snapshot) not in FAST_EVENTS
    fast = engine.store.app.mapper
    restored = fast.to_domain_event(fast.to_stored_event(snapshot))
    assert restored.state == snapshot.state
    assert restored.originator_id == aggregate.id


def test_a_recorded_step_reads_back_through_the_engine() -> None:
    engine = Engine.in_memory()
    engine.start_session("s", "customer_service")
    engine.record_step("s", "answer", input={"q": "où ?", "x": 1.5}, output={"a": [None, True]})
    (step,) = engine.session_steps("s")
    assert step.input == {"q": "où ?", "x": 1.5}
    assert step.output == {"a": [None, True]}
