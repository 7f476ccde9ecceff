"""Bounded input: text PostgreSQL can hold, id lengths, JSON depth and size, durations, counts.

Every refusal is a ValidationError naming the field, and the engine appends nothing.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowledger.domain import LlmUsage, ValidationError
from flowledger.domain.bounds import _plain_json_bound, json_bytes, names_json_bytes
from flowledger.domain.values import (
    MAX_JSON_BYTES,
    MAX_JSON_DEPTH,
    MAX_NAME_LENGTH,
    MAX_TTL,
    duration_of,
    require_json,
    require_name,
    require_text,
    require_ttl,
    require_usage,
    storable,
)
from flowledger.infrastructure import Engine
from tests.conftest import make_settings

NUL = "a\x00b"
STORABLE = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")
SURROGATE = "a\ud800b"


@pytest.fixture
def memory() -> Iterator[Engine]:
    with Engine(settings=make_settings(database_url="memory:")) as engine:
        yield engine


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = {"k": value}
    return value


def storable_in_postgres(text: str) -> bool:
    """What PostgreSQL's text (UTF-8) and jsonb need: no NUL, and strictly encodable as UTF-8."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return "\x00" not in text


INVISIBLE = "\u200b\ufeff\u00ad"
"""Characters drawn as nothing: a zero-width space, a byte-order mark, a soft hyphen."""
TAGS = "\U000e0041\U000e0042\U000e007f"
"""Tag characters (past U+FFFF, which the HTTP schema's patterns cannot name): drawn as nothing."""


@pytest.mark.parametrize(
    "bad",
    [NUL, SURROGATE, "tab\tin", "x" * (MAX_NAME_LENGTH + 1), "", "   ", INVISIBLE, " \u200b ", TAGS, 5, None],
)
def test_names_refuse_nul_surrogates_control_characters_and_overlong_text(bad: Any) -> None:
    with pytest.raises(ValidationError) as raised:
        require_name("session_id", bad)
    assert raised.value.field == "session_id"


def test_a_refused_name_says_why_in_words() -> None:
    with pytest.raises(ValidationError, match="NUL"):
        require_name("workflow", NUL)
    with pytest.raises(ValidationError, match="surrogate"):
        require_name("workflow", SURROGATE)
    with pytest.raises(ValidationError, match="at most 200 characters"):
        require_name("workflow", "w" * 201)
    # (An outside probe: a session id of one zero-width space was taken, and listed as nothing.)
    with pytest.raises(ValidationError, match="must hold a visible character"):
        require_name("workflow", "\u2060\u200d")


def test_names_of_exactly_the_limit_and_any_language_are_accepted() -> None:
    assert require_name("step", "s" * MAX_NAME_LENGTH)
    assert require_name("step", "étape-確認-🙂")
    assert require_name("step", "zero\u200bwidth")  # one drawn among others is the caller's to write


@settings(max_examples=150, deadline=None)
@given(st.text())
def test_arbitrary_text_is_either_refused_or_storable_in_postgres(text: str) -> None:
    for check in (lambda t: require_name("name", t), lambda t: require_text("text", t)):
        try:
            check(text)
        except ValidationError:
            continue
        assert storable_in_postgres(text)


@settings(max_examples=100, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(),
        lambda c: st.lists(c) | st.dictionaries(st.text(), c),
        max_leaves=20,
    )
)
def test_arbitrary_json_is_either_refused_or_all_its_strings_are_storable(value: Any) -> None:
    try:
        require_json("input", value)
    except ValidationError:
        return
    text = json.dumps(value, ensure_ascii=False)
    assert storable_in_postgres(text)
    assert "\\u0000" not in json.dumps(value)


@given(
    st.recursive(
        st.none()
        | st.booleans()
        | st.integers(min_value=-(2**9000), max_value=2**9000)
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(STORABLE),
        lambda c: st.lists(c) | st.tuples(c, c) | st.dictionaries(st.text(STORABLE, max_size=5), c),
        max_leaves=20,
    )
)
def test_the_size_bound_that_spares_an_encoding_is_never_below_the_encoded_size(value: Any) -> None:
    exact = len(json.dumps(value, separators=(",", ":"), allow_nan=False))
    assert _plain_json_bound(value) >= exact


@pytest.mark.parametrize("char", ["x", "\u00e9", "\u4f60", "\U0001f600"])
def test_json_of_exactly_the_size_limit_is_accepted_and_one_byte_more_is_refused(char: str) -> None:
    # The size is what is stored: compact JSON in UTF-8 (a CJK character is 3 bytes, not the 6
    # of a \\uXXXX escape: 900 KB of Chinese text under the HTTP body limit must fit)
    width = len(char.encode())
    room = MAX_JSON_BYTES - len('{"s":""}')
    fits = {"s": char * (room // width) + "x" * (room % width)}
    assert len(json.dumps(fits, separators=(",", ":"), ensure_ascii=False).encode()) == MAX_JSON_BYTES
    require_json("input", fits)
    with pytest.raises(ValidationError, match="bytes as JSON"):
        require_json("input", {"s": fits["s"] + "x"})


@pytest.mark.parametrize(
    "payload",
    [
        {"note": NUL},
        {NUL: 1},
        {"list": ["ok", SURROGATE]},
        {SURROGATE: "x"},
        nested(MAX_JSON_DEPTH + 1),
        {"big": "x" * MAX_JSON_BYTES},
        {"nan": float("nan")},
        {"inf": float("inf")},
        [float("-inf")],
        {"huge": 10**5000},
        {1: "int key"},
        {"when": datetime(2026, 1, 1)},
    ],
)
def test_json_payloads_refuse_unstorable_strings_depth_size_and_non_json(payload: Any) -> None:
    with pytest.raises(ValidationError) as raised:
        require_json("input", payload)
    assert raised.value.field == "input"


def test_json_of_the_maximum_depth_is_accepted_and_deeper_fails_before_any_recursion_error() -> None:
    require_json("input", nested(MAX_JSON_DEPTH - 1))
    with pytest.raises(ValidationError, match="nested more than 32"):
        require_json("input", nested(100_000))


def test_a_refused_json_string_names_where_it_is() -> None:
    with pytest.raises(ValidationError, match=r"at a\[1\]\.b"):
        require_json("input", {"a": [1, {"b": NUL}]})


@pytest.mark.parametrize(
    "ttl", [timedelta(0), timedelta(seconds=-1), MAX_TTL + timedelta(seconds=1), timedelta.max, 3600, None]
)
def test_ttls_must_be_positive_and_bounded(ttl: Any) -> None:
    with pytest.raises(ValidationError) as raised:
        require_ttl(ttl)
    assert raised.value.field == "ttl"


@pytest.mark.parametrize("hours", [1e20, float("inf"), float("nan"), -1, 0, True, "5", 10**30])
def test_durations_from_numbers_are_refused_before_a_timedelta_overflows(hours: Any) -> None:
    with pytest.raises(ValidationError) as raised:
        duration_of("expires_hours", hours, timedelta(hours=1), maximum=MAX_TTL)
    assert raised.value.field == "expires_hours"


def test_durations_from_numbers_within_bounds_are_timedeltas() -> None:
    assert duration_of("ttl_seconds", 90, timedelta(seconds=1), maximum=MAX_TTL) == timedelta(seconds=90)


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"input_tokens": 10**13}, "usage.input_tokens"),
        ({"attempts": 10**6}, "usage.attempts"),
        ({"cost_usd": Decimal("1e12")}, "usage.cost_usd"),
        ({"cost_usd": Decimal("1e-60")}, "usage.cost_usd"),
        ({"latency_ms": 1e300}, "usage.latency_ms"),
        ({"provider": NUL}, "usage.provider"),
        ({"request_model": SURROGATE}, "usage.request_model"),
        ({"finish_reasons": ["stop", NUL]}, "usage.finish_reasons"),
        ({"extra": {"k": NUL}}, "usage.extra"),
    ],
)
def test_usage_a_command_takes_is_bounded(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as raised:
        require_usage("usage", LlmUsage(**fields))
    assert raised.value.field == field


def test_text_the_system_writes_is_kept_with_unstorable_characters_replaced() -> None:
    assert storable(f"boom {NUL} {SURROGATE}", 100) == "boom a\ufffdb a\ufffdb"
    assert len(storable("x" * 5000, 2000)) == 2000


# -- through the engine: a refused command appends nothing ---------------------------------

Command = Callable[[Engine], object]
REFUSED: list[tuple[str, Command]] = [
    ("session_id", lambda e: e.start_session(NUL, "cs")),
    ("session_id", lambda e: e.start_session(SURROGATE, "cs")),
    ("session_id", lambda e: e.start_session("s" * 201, "cs")),
    ("session_id", lambda e: e.start_session(INVISIBLE, "cs")),
    ("workflow", lambda e: e.start_session("s2", NUL)),
    ("user_id", lambda e: e.start_session("s2", "cs", user_id=NUL)),
    ("metadata", lambda e: e.start_session("s2", "cs", metadata={"k": NUL})),
    ("ttl", lambda e: e.start_session("s2", "cs", ttl=timedelta(days=10**6))),
    ("step", lambda e: e.record_step("s1", NUL)),
    ("step", lambda e: e.record_step("s1", SURROGATE)),
    ("step", lambda e: e.record_step("s1", "\u200b")),
    ("input", lambda e: e.record_step("s1", "greet", input={"m": NUL})),
    ("output", lambda e: e.record_step("s1", "greet", output=nested(64))),
    ("context_update", lambda e: e.record_step("s1", "greet", context_update={SURROGATE: 1})),
    ("idempotency_key", lambda e: e.record_step("s1", "greet", idempotency_key=NUL)),
    ("usage.input_tokens", lambda e: e.record_step("s1", "greet", usage=LlmUsage(input_tokens=10**15))),
    # A usage may say 0 attempts (a call the open breaker refused), never for an answer
    ("usage.attempts", lambda e: e.record_step("s1", "greet", usage=LlmUsage(attempts=0))),
    # A provider is a name: empty (the field's default is "unknown") or with space around it
    # ("openai " apart from "openai" in the dashboards) was taken from a caller's usage
    ("usage.provider", lambda e: e.record_step("s1", "greet", usage=LlmUsage(provider=""))),
    ("usage.provider", lambda e: e.record_step("s1", "greet", usage=LlmUsage(provider=" openai"))),
    ("usage.provider", lambda e: e.record_step("s1", "greet", usage=LlmUsage(provider="openai "))),
    ("ttl", lambda e: e.extend_session("s1", timedelta.max)),
    ("reason", lambda e: e.abandon_session("s1", NUL)),
    ("task_id", lambda e: e.create_task(NUL, "fix it", ["go"], "low")),
    ("description", lambda e: e.create_task("t1", "x\x00y", ["go"], "low")),
    ("description", lambda e: e.create_task("t1", "x" * 10_001, ["go"], "low")),
    ("required_skills", lambda e: e.create_task("t1", "fix", [NUL], "low")),
    ("required_skills", lambda e: e.create_task("t1", "fix", [f"s{n}" for n in range(101)], "low")),
    ("agent_id", lambda e: e.register_agent(SURROGATE, "A", ["go"], capacity=1)),
    ("task_id", lambda e: e.create_task("\u2060", "fix it", ["go"], "low")),
    ("name", lambda e: e.register_agent("a1", NUL, ["go"], capacity=1)),
    ("capacity", lambda e: e.register_agent("a1", "A", ["go"], capacity=10**9)),
]


@pytest.mark.parametrize(("field", "command"), REFUSED)
def test_a_refused_command_is_a_validation_error_and_appends_nothing(
    memory: Engine, field: str, command: Command
) -> None:
    memory.start_session("s1", "cs")
    head = memory.log.head()
    with pytest.raises(ValidationError) as raised:
        command(memory)
    assert raised.value.field == field
    assert memory.log.head() == head


def test_a_session_with_every_field_at_its_limit_is_accepted(memory: Engine) -> None:
    name = "é" * MAX_NAME_LENGTH
    memory.start_session(name, name, user_id=name, ttl=MAX_TTL, metadata={"k": "🙂" * 1000})
    step = memory.record_step(name, name, input=nested(MAX_JSON_DEPTH - 1), idempotency_key=name)
    assert step.step == name
    assert memory.get_session(name).expires_at > datetime.now(UTC) + MAX_TTL - timedelta(minutes=1)


HUGE = "x" * 2_000_000

HUGE_ARGUMENTS: list[Callable[[Any], object]] = [
    lambda e: e.start_session("s2", "wf", ttl=HUGE),
    lambda e: e.get_session("s", version=HUGE),
    lambda e: e.get_session("s", as_of=HUGE),
    lambda e: e.set_expiry("s", HUGE),
    lambda e: e.set_agent_capacity("a", HUGE),
    lambda e: e.create_task("t2", "d", ["x"], HUGE),
    lambda e: e.record_classification("t", HUGE, "low", 1.0),
    lambda e: e.list_tasks(status=HUGE),
    lambda e: e.escalate_overdue(now=HUGE),
    lambda e: e.fork_session("s", HUGE, "s9"),
]


@pytest.mark.parametrize(
    "call",
    HUGE_ARGUMENTS,
    ids=[
        "ttl",
        "version",
        "as_of",
        "expires_at",
        "capacity",
        "priority",
        "category",
        "status",
        "now",
        "at_version",
    ],
)
def test_a_refusal_of_a_huge_argument_is_one_short_line_not_the_argument_echoed(
    call: Callable[[Any], object],
) -> None:
    # (A 2,000,000-character string given as a ttl, a version or a priority came back as a
    # 2,000,040-character message: "got 'xxxx…" echoed it whole, into logs and the CLI's line.)
    from flowledger.infrastructure import Engine

    engine = Engine.in_memory()
    engine.start_session("s", "wf")
    engine.register_agent("a", "A", ["x"])
    engine.create_task("t", "d", ["x"])
    before = engine.log.head()
    with pytest.raises(ValidationError) as raised:
        call(engine)
    assert len(str(raised.value)) <= 1_000
    assert raised.value.message.endswith("characters in all]")  # says that it was cut, and how much
    assert engine.log.head() == before
    engine.close()


def test_a_short_refusal_keeps_its_whole_message() -> None:
    message = "must be one of " + ", ".join(f"model-{i}" for i in range(60))
    assert len(message) < 1_000
    assert ValidationError("field", message).message == message


def test_an_integer_too_long_to_write_is_refused_in_words_without_python_advice() -> None:
    # Before: "must be JSON-serialisable: Exceeds the limit (4300 digits) for integer string
    # conversion; use sys.set_int_max_str_digits() to increase the limit"
    with pytest.raises(ValidationError) as refused:
        require_json("input", {"n": 10**5000})
    assert str(refused.value) == "input: holds an integer of more than 4,300 digits (at n)"


@pytest.mark.parametrize("number", [float("nan"), float("inf"), -float("inf")])
def test_a_number_json_cannot_hold_is_refused_naming_where_it_is(number: float) -> None:
    # Before: "must be JSON-serialisable: Out of range float values are not JSON compliant"
    with pytest.raises(ValidationError) as refused:
        require_json("output", {"scores": [1.0, number]})
    assert str(refused.value) == (
        f"output: numbers must be finite (JSON has no NaN or Infinity), got {number!r} (at scores[1])"
    )


@settings(max_examples=300, deadline=None)
@given(st.lists(st.none() | st.text(max_size=12) | st.text(st.characters(max_codepoint=127), max_size=12)))
def test_a_tuple_of_names_measures_as_the_encoder_writes_it(names: list[str | None]) -> None:
    # The window's fast path for a usage's names (plain ASCII needs no encoder) must give the
    # encoder's figure exactly: a snapshot's upcast and a fold of the events measure alike.
    assert names_json_bytes(tuple(names)) == json_bytes(tuple(names))
