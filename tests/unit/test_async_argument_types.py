"""The model-calling commands check their arguments as the others do: a ValidationError naming
the field, no model called and nothing appended (``process_step``, ``run_step``,
``classify_task``, ``reclassify_task``, ``assign_task_ranked``).

(A library probe found them raising builtins errors: an input that is no object was
"TypeError: 'int' object is not a mapping" from the prompt, a model that is no string
"AttributeError: 'int' object has no attribute 'strip'" from the price table, a task id that
is a list "TypeError: unhashable type" from the single-flight table, and any ``merge_input``
taken for its truth.)
"""

from __future__ import annotations

from typing import Any

import pytest

from flowledger.domain.errors import ValidationError
from flowledger.infrastructure import Engine
from tests.support.llm import ScriptedLlm

NOT_OBJECTS: list[Any] = [5, "text", ["x"], True]
NOT_MODELS: list[Any] = [5, True, b"gpt", ["gpt-4.1"], ""]
NOT_IDS: list[Any] = [["t"], {"t": 1}, 5]


def _ready(engine: Engine) -> ScriptedLlm:
    engine.llm = llm = ScriptedLlm()
    engine.start_session("s", "wf")
    engine.create_task("t", "Fix the Python client", [])
    return llm


@pytest.mark.parametrize("method", ["process_step", "run_step"])
@pytest.mark.parametrize("given", NOT_OBJECTS, ids=repr)
async def test_a_step_input_that_is_no_json_object_is_refused(
    engine: Engine, method: str, given: Any
) -> None:
    llm = _ready(engine)
    before = engine.log.head()
    with pytest.raises(ValidationError) as raised:
        await getattr(engine, method)("s", "answer", input=given)
    assert raised.value.field == "input"
    assert (engine.log.head(), llm.calls) == (before, [])


@pytest.mark.parametrize("method", ["process_step", "run_step"])
@pytest.mark.parametrize("given", NOT_MODELS, ids=repr)
async def test_a_step_model_that_is_no_name_is_refused(engine: Engine, method: str, given: Any) -> None:
    llm = _ready(engine)
    before = engine.log.head()
    with pytest.raises(ValidationError) as raised:
        await getattr(engine, method)("s", "answer", input={"m": 1}, model=given)
    assert raised.value.field == "model"
    assert (engine.log.head(), llm.calls) == (before, [])


@pytest.mark.parametrize("given", ["no", 1, None], ids=repr)
async def test_merge_input_that_is_not_true_or_false_is_refused(engine: Engine, given: Any) -> None:
    llm = _ready(engine)
    before = engine.log.head()
    with pytest.raises(ValidationError) as raised:
        await engine.process_step("s", "answer", input={"m": 1}, merge_input=given)
    assert raised.value.field == "merge_input"
    assert (engine.log.head(), llm.calls) == (before, [])


@pytest.mark.parametrize("method", ["classify_task", "reclassify_task"])
@pytest.mark.parametrize("given", NOT_MODELS, ids=repr)
async def test_a_classification_model_that_is_no_name_is_refused(
    engine: Engine, method: str, given: Any
) -> None:
    llm = _ready(engine)
    before = engine.log.head()
    with pytest.raises(ValidationError) as raised:
        await getattr(engine, method)("t", model=given)
    assert raised.value.field == "model"
    assert (engine.log.head(), llm.calls) == (before, [])


@pytest.mark.parametrize("method", ["classify_task", "reclassify_task", "assign_task_ranked"])
@pytest.mark.parametrize("given", NOT_IDS, ids=repr)
async def test_a_task_id_that_is_no_string_is_refused_by_the_model_calling_task_commands(
    engine: Engine, method: str, given: Any
) -> None:
    llm = _ready(engine)
    before = engine.log.head()
    with pytest.raises(ValidationError) as raised:
        await getattr(engine, method)(given)
    assert raised.value.field == "task_id"
    assert (engine.log.head(), llm.calls) == (before, [])


@pytest.mark.parametrize("given", ["no", 1, None], ids=repr)
async def test_an_escalate_when_full_that_is_not_true_or_false_is_refused_before_any_call(
    engine: Engine, given: Any
) -> None:
    # (It was checked by the assignment, after the routed path had classified the task: a paid
    # call and a Classified recorded, then a ValidationError.)
    llm = _ready(engine)
    before = engine.log.head()
    with pytest.raises(ValidationError) as raised:
        await engine.assign_task_ranked("t", escalate_when_full=given)
    assert raised.value.field == "escalate_when_full"
    assert (engine.log.head(), llm.calls) == (before, [])
