"""The task router: classification drives skills, priority and deadline; tiers pick the model;
failures and escalations are recoverable; the queue can be run and listed (both backends).

Its decisions are tested with the one LLM double (tests/support/llm.py); an unknown model is
refused by the real client's price table."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from flowledger.adapters.cli.demo.tasks import WORK
from flowledger.adapters.llm import ApiKey, ClientConfig, OpenAICompatibleClient, load_price_table
from flowledger.domain.errors import TaskTransitionRejected, UnknownModelPrice, ValidationError
from flowledger.domain.skills import SkillCatalogue
from flowledger.domain.task_views import Classification, EscalationReason, TaskPriority, TaskStatus
from flowledger.infrastructure import Engine, Settings
from flowledger.infrastructure.router_files import load_model_tiers, load_skill_catalogue
from tests.support.llm import ScriptedLlm

TEAMS = {
    "backend": ["python", "golang", "kubernetes"],
    "frontend": ["react", "vue", "css"],
    "devops": ["terraform", "aws", "docker"],
}


def classifier(category: str = "bug_fix", complexity: str = "medium", hours: float = 2.0) -> ScriptedLlm:
    """The one LLM double, answering a fixed classification."""
    return ScriptedLlm(json.dumps({"category": category, "complexity": complexity, "estimated_hours": hours}))


def register_teams(engine: Engine, capacity: int = 10) -> None:
    for name, skills in TEAMS.items():
        engine.register_agent(name, name.title(), skills, capacity)


async def test_a_task_created_without_skills_goes_to_the_team_its_words_name(engine: Engine) -> None:
    # Given the seed's three teams and a Go bug created without skills
    register_teams(engine)
    engine.llm = classifier("bug_fix", "high", 3)
    engine.create_task("go-race", "Fix the race in the Go worker", [])

    # When it is classified and assigned
    classified = await engine.classify_task("go-race")
    assigned = engine.assign_task("go-race")

    # Then the catalogue derived golang from the description, and Backend got it
    assert classified.required_skills == ("golang",)
    assert assigned.agent_id == "backend"
    history = {e.event_type: e.data for e in engine.task_history("go-race")}
    assert "skills golang from the words 'Go'" in history["Task.Classified"]["derivation"]
    assert history["Task.Assigned"]["required_skills"] == ["golang"]
    assert "covers golang" in history["Task.Assigned"]["reason"]


async def test_complexity_raises_priority_and_the_estimate_sets_a_missing_deadline(engine: Engine) -> None:
    engine.llm = classifier("deployment", "critical", 4)
    engine.create_task("deploy", "Roll out the new Docker image", [], priority="MEDIUM")
    task = await engine.classify_task("deploy")
    assert task.priority is TaskPriority.CRITICAL
    assert task.required_skills == ("docker",)
    assert task.deadline == task.created_at + timedelta(hours=8)  # counted from its creation
    derivation = engine.task_history("deploy")[-1].data["derivation"]
    assert "priority raised from medium to critical by critical complexity" in derivation
    assert "2 x 4 estimated hours" in derivation


async def test_the_creators_skills_priority_and_deadline_stand(engine: Engine) -> None:
    engine.llm = classifier("bug_fix", "critical", 4)
    deadline = engine.clock() + timedelta(days=3)
    engine.create_task("t", "Fix the Go worker", ["python"], priority="critical", deadline=deadline)
    task = await engine.classify_task("t")
    assert (task.required_skills, task.priority, task.deadline) == (
        ("python",),
        TaskPriority.CRITICAL,
        deadline,
    )
    assert engine.task_history("t")[-1].data["derivation"] == ""
    # and creating it again with what the creator said is still the same task
    assert engine.create_task("t", "Fix the Go worker", ["python"], priority="critical").version == 2


@pytest.mark.parametrize(
    ("priority", "model"),
    [
        ("critical", "claude-sonnet-4.5"),
        ("high", "claude-sonnet-4.5"),
        ("medium", "deepseek-v3.2"),
        ("low", "gemini-2.5-flash"),
    ],
)
async def test_each_priority_is_classified_on_its_tier(engine: Engine, priority: str, model: str) -> None:
    llm = classifier()
    engine.llm = llm
    engine.create_task("t", "Fix the API", [], priority=priority)
    await engine.classify_task("t")
    assert [call.model for call in llm.calls] == [model]
    assert engine.task_history("t")[-1].data["route"].startswith(f"{priority} tier [{model}]")


async def test_an_unknown_model_is_refused_before_anything_is_recorded(engine: Engine) -> None:
    # Given the real adapter, whose price table does not know the model
    requests: list[httpx.Request] = []
    config = ClientConfig(base_url="https://llm.test/v1", api_key=ApiKey("sk-test-secret-1"))
    engine.llm = llm = OpenAICompatibleClient(
        config,
        prices=load_price_table(),
        transport=httpx.MockTransport(lambda r: requests.append(r) or httpx.Response(500)),
    )
    engine.create_task("t", "Fix the API", [])
    # When the task is classified on it, Then nothing was sent and nothing recorded
    with pytest.raises(UnknownModelPrice) as raised:
        await engine.classify_task("t", model="gpt-4.2-typo")
    assert raised.value.model == "gpt-4.2-typo"
    assert requests == []
    assert [e.event_type for e in engine.task_history("t")] == ["Task.Created"]
    await llm.aclose()


async def test_an_escalated_task_is_requeued_by_a_person_and_assigned_again(engine: Engine) -> None:
    # Given a task escalated because nobody could take it
    engine.create_task("t", "Write the Terraform module", ["terraform"])
    assert engine.assign_task("t").status is TaskStatus.ESCALATED
    with pytest.raises(ValidationError, match="requested_by: must be a non-empty string"):
        engine.requeue_task("t", "", "why")  # not without who
    engine.register_agent("devops", "DevOps", TEAMS["devops"], 10)

    # When a person requeues it and the queue runs
    requeued = engine.requeue_task("t", "alice@example.com", "DevOps joined")
    assigned = engine.assign_pending()

    # Then it waits again, with who and why recorded, and is assigned
    assert requeued.status is TaskStatus.PENDING
    event = engine.task_history("t")[-1 - 1]
    assert event.event_type == "Task.Requeued"
    assert event.data["requested_by"] == "alice@example.com"
    assert event.data["escalation_reason"] == EscalationReason.NO_CAPABLE_AGENT
    assert [(s.task_id, s.agent_id) for s in assigned] == [("t", "devops")]
    with pytest.raises(TaskTransitionRejected):
        engine.requeue_task("t", "alice", "again")


def test_who_requeues_is_recorded_as_given_or_refused_as_rest_refuses_it(engine: Engine) -> None:
    # Given an escalated task
    engine.create_task("t", "Write the Terraform module", ["terraform"])
    assert engine.assign_task("t").status is TaskStatus.ESCALATED
    before = engine.task_history("t")

    # When a person is named by 201 characters, or with a line break: REST's name rule
    # (it was cut to 200 characters and recorded as another name, the line break kept)
    for who in ("a" * 201, "alice\nbob"):
        with pytest.raises(ValidationError, match="requested_by: must"):
            engine.requeue_task("t", who, "DevOps joined")

    # Then nothing is recorded, and a name of 200 characters is kept as given
    assert engine.task_history("t") == before
    engine.requeue_task("t", "a" * 200, "DevOps joined")
    assert engine.task_history("t")[-1].data["requested_by"] == "a" * 200


def test_a_task_escalated_for_its_passed_deadline_is_requeued_only_with_a_new_one(engine: Engine) -> None:
    # Given a task escalated because its deadline passed, and an agent who could take it
    engine.register_agent("backend", "Backend", TEAMS["backend"], 10)
    engine.create_task("t", "Fix the API", ["python"], deadline=datetime.now(UTC) - timedelta(hours=1))
    assert engine.escalate_overdue()[0].task_id == "t"
    # When a person requeues it without a new deadline
    with pytest.raises(ValidationError, match="deadline_hours") as raised:
        engine.requeue_task("t", "alice@example.com", "try again")
    # Then it is refused, asking for one, and nothing is recorded: it stays escalated
    assert raised.value.field == "deadline"
    assert engine.get_task("t").status is TaskStatus.ESCALATED
    assert [e.event_type for e in engine.task_history("t")][-1] == "Task.Escalated"
    # And with a new deadline it goes back to the queue and is assigned, not escalated again
    requeued = engine.requeue_task("t", "alice@example.com", "try again", timedelta(hours=8))
    assert requeued.deadline is not None
    assert requeued.deadline > datetime.now(UTC)
    assert [s.agent_id for s in engine.assign_pending()] == ["backend"]
    kinds = [e.event_type for e in engine.task_history("t")]
    assert kinds == ["Task.Created", "Task.Escalated", "Task.Requeued", "Task.Assigned"]


def test_tasks_that_waited_for_capacity_are_offered_again_when_an_agent_frees_up(engine: Engine) -> None:
    engine.register_agent("be", "Backend", ["python"], 1)
    for n in range(3):
        engine.create_task(f"t{n}", "Fix the API", ["python"])
    first = engine.assign_pending(escalate_when_full=False)
    assert [s.status for s in first] == [TaskStatus.ASSIGNED, TaskStatus.PENDING, TaskStatus.PENDING]
    engine.complete_task("t0", {"ok": True})
    second = engine.assign_pending(escalate_when_full=False)
    assert [(s.task_id, s.status) for s in second] == [
        ("t1", TaskStatus.ASSIGNED),
        ("t2", TaskStatus.PENDING),
    ]
    assert engine.get_agent("be").load == 1


def test_tasks_are_listed_by_status_priority_agent_and_overdue(engine: Engine) -> None:
    engine.register_agent("be", "Backend", ["python"], 10)
    engine.create_task("a", "A", ["python"], priority="critical")
    engine.create_task("b", "B", ["python"], priority="low", deadline=engine.clock() + timedelta(hours=1))
    engine.create_task("c", "C", ["css"])
    engine.assign_task("a")
    engine.assign_task("c")  # escalated: nobody covers css
    ids = lambda states: [s.task_id for s in states]  # noqa: E731
    assert ids(engine.list_tasks()) == ["a", "b", "c"]
    assert ids(engine.list_tasks(status="PENDING")) == ["b"]
    assert ids(engine.list_tasks(status="escalated")) == ["c"]
    assert ids(engine.list_tasks(priority="Critical")) == ["a"]
    assert ids(engine.list_tasks(agent_id="be")) == ["a"]
    assert ids(engine.list_tasks(overdue=True)) == []
    # overdue looks at open tasks only, either way: false is "open and not overdue"
    assert ids(engine.list_tasks(overdue=False)) == ["a", "b"]
    # ... so with a closed status the pair is refused, not answered with an empty list
    for closed in ("completed", "ESCALATED"):
        for flag in (True, False):
            with pytest.raises(ValidationError, match="overdue: looks at open tasks only"):
                engine.list_tasks(status=closed, overdue=flag)
    assert ids(engine.list_tasks(status="assigned", overdue=False)) == ["a"]
    # ... and so is an agent with a status no agent holds a task in (it answered [] for
    # GET /v1/tasks?agent_id=be&status=pending, as if the agent had nothing queued)
    for unheld in ("pending", "Escalated"):
        with pytest.raises(ValidationError, match="agent_id: names the agent holding a task"):
            engine.list_tasks(status=unheld, agent_id="be")
    with pytest.raises(ValidationError, match="status: must be one of"):
        engine.list_tasks(status="lost")
    with pytest.raises(ValidationError, match="limit"):
        engine.list_tasks(limit=0)
    # A filter value of the wrong type is refused, not read as "matches nothing"
    with pytest.raises(ValidationError, match="overdue: must be true, false or None, got 'yes'"):
        engine.list_tasks(overdue="yes")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="limit"):
        engine.list_tasks(limit="10")  # type: ignore[arg-type]


def test_an_agents_completed_tasks_are_listed_under_its_id(engine: Engine) -> None:
    # Given an agent that completed one task, holds two, and handed one back
    engine.register_agent("be", "Backend", ["python"], 10)
    for task_id in ("a", "b", "c", "d"):
        engine.create_task(task_id, task_id.upper(), ["python"])
        engine.assign_task(task_id)
    engine.complete_task("a", {"pr": 1})
    engine.release_task("d", "blocked")
    ids = lambda states: [s.task_id for s in states]  # noqa: E731
    # When its tasks are listed, with and without a status
    # Then a completed task counts as the agent's that completed it; a released one as nobody's
    # (status=completed&agent_id=be answered [] for any agent: the filter saw open tasks only)
    assert ids(engine.list_tasks(agent_id="be", status="completed")) == ["a"]
    assert ids(engine.list_tasks(agent_id="be", status="assigned")) == ["b", "c"]
    assert ids(engine.list_tasks(agent_id="be")) == ["a", "b", "c"]
    engine.register_agent("fe", "Frontend", ["css"], 10)
    assert ids(engine.list_tasks(agent_id="fe", status="completed")) == []


def test_every_task_listed_under_an_agent_names_that_agent(engine: Engine) -> None:
    # Given an agent that completed one task and holds another
    engine.register_agent("be", "Backend", ["python"], 10)
    for task_id in ("a", "b"):
        engine.create_task(task_id, task_id.upper(), ["python"])
        engine.assign_task(task_id)
    engine.complete_task("a", {"pr": 1})
    # When its tasks are listed by its id
    listed = engine.list_tasks(agent_id="be")
    # Then each one says it is that agent's: the completed one names the agent that completed it
    # (it said agent_id None, listed under "be" while naming nobody)
    assert [(s.task_id, s.status, s.agent_id) for s in listed] == [
        ("a", TaskStatus.COMPLETED, "be"),
        ("b", TaskStatus.ASSIGNED, "be"),
    ]
    assert engine.get_task("a").agent_id == "be"
    # And a task waiting again, or escalated, names nobody: no agent holds it
    engine.release_task("b", "blocked")
    assert engine.get_task("b").agent_id is None
    engine.create_task("c", "C", ["cobol"])
    assert engine.assign_task("c").agent_id is None


def test_a_listing_longer_than_its_limit_is_read_page_by_page_after_the_last_id(engine: Engine) -> None:
    # Given five tasks, two of them done (a status filter skips them on every page)
    engine.register_agent("be", "Backend", ["python"], 10)
    for n in range(5):
        engine.create_task(f"t{n}", "Fix the API", ["python"])
    for done in ("t1", "t3"):
        engine.assign_task(done)
        engine.complete_task(done, {"ok": True})
    ids = lambda states: [s.task_id for s in states]  # noqa: E731
    # When each page starts after the last id of the one before
    assert ids(engine.list_tasks(limit=2)) == ["t0", "t1"]
    assert ids(engine.list_tasks(limit=2, after="t1")) == ["t2", "t3"]
    assert ids(engine.list_tasks(limit=2, after="t3")) == ["t4"]
    assert ids(engine.list_tasks(limit=2, after="t4")) == []
    # Then filters apply within the pages, and the cursor may be a task the filter skips
    assert ids(engine.list_tasks(status="pending", limit=1, after="t1")) == ["t2"]
    assert ids(engine.list_tasks(status="pending", after="t0")) == ["t2", "t4"]
    # And a cursor naming no task is refused, not read as "from the start"
    with pytest.raises(ValidationError, match="after: no task 'nope'"):
        engine.list_tasks(after="nope")
    with pytest.raises(ValidationError, match="after"):
        engine.list_tasks(after=5)  # type: ignore[arg-type]


def test_a_catalogue_file_overrides_the_shipped_one(tmp_path: Path) -> None:
    shipped = load_skill_catalogue()
    data = json.loads((Path(__file__).parents[2] / "infrastructure" / "skills.json").read_text())
    data["version"] = "ours-1"
    data["categories"]["documentation"] = ["markdown"]
    path = tmp_path / "skills.json"
    path.write_text(json.dumps(data))
    ours = load_skill_catalogue(path)
    assert (shipped.version, ours.version) == ("2026-12-07.2", "ours-1")
    assert ours.skills_for("documentation", "Explain the setup")[0] == ("markdown",)
    with Engine.in_memory(settings=Settings(skill_catalogue_file=path)) as engine:
        assert engine.classifier.catalogue.version == "ours-1"


def test_a_malformed_catalogue_or_routing_file_is_refused_with_its_reason(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"version": "x", "categories": {"bug_fix": ["python"]}}))
    with pytest.raises(ValidationError, match=r"missing \['deployment'"):
        load_skill_catalogue(path)
    path.write_text(json.dumps({"version": "x", "tiers": {"critical": ["m"]}}))
    with pytest.raises(ValidationError, match=r"routing\.tiers: must name exactly"):
        load_model_tiers(path)
    with pytest.raises(ValidationError, match="cannot read"):
        load_model_tiers(tmp_path / "missing.json")
    # The variable that names the file, and the path once (the OS error had named it again)
    with pytest.raises(ValidationError) as refused:
        load_skill_catalogue(tmp_path / "missing.json")
    assert str(refused.value).endswith(
        "(named by FLOWLEDGER_SKILL_CATALOGUE_FILE): No such file or directory"
    )
    assert str(refused.value).count("missing.json") == 1


def test_words_of_the_description_decide_the_stack_before_the_category() -> None:
    catalogue = load_skill_catalogue()
    classification = Classification(category="feature", complexity="low", estimated_hours=1)
    assert catalogue.skills_for("feature", "Build the React UI component")[0] == ("react",)
    assert catalogue.skills_for("feature", "Something vague")[0] == ("python",)
    assert isinstance(catalogue, SkillCatalogue)
    derived = catalogue.derive(
        classification,
        description="Terraform the AWS bucket",
        creator_skills=(),
        creator_priority=TaskPriority.HIGH,
        creator_deadline=None,
        now=load_now(),
    )
    assert derived.required_skills == ("aws", "terraform")
    assert derived.priority is None


@pytest.mark.parametrize(
    ("description", "skills"),
    [
        ("The pod crashes on Kubernetes.", ("kubernetes",)),  # a full stop after the word
        ("Deploy with helm, then kubernetes...", ("kubernetes",)),
        ("react-router drops the query", ("react",)),  # a word joined to another
        ("Fix the k8s-helm chart!", ("kubernetes",)),
    ],
)
def test_a_known_word_is_found_beside_punctuation(description: str, skills: tuple[str, ...]) -> None:
    # (The word pattern kept '.' and '-' inside words: "Kubernetes." was no known word, and the
    # task was routed by its category alone.)
    assert load_skill_catalogue().skills_for("bug_fix", description)[0] == skills


@pytest.mark.parametrize(
    ("description", "skills"),
    [
        ("Fix the crash in main.go", ("golang",)),  # a file's extension: Go, not the verb
        ("Fix the crash in cmd/server/main.go.", ("golang",)),
        ("Bump go.mod to the new client", ("golang",)),
        ("Update the bucket policy in main.tf", ("terraform",)),
        ("Fix the settings form in index.tsx", ("react",)),
        ("Fix the import in handler.py", ("python",)),
        ("Let's go.", ("docker",)),  # the verb, a sentence's end: still no stack
        ("Ship it, e.g. tonight", ("docker",)),  # "e.g" ends in no extension the catalogue knows
    ],
)
def test_a_file_named_in_the_description_names_its_stack(description: str, skills: tuple[str, ...]) -> None:
    # (Routed by the category alone before: "Fix the crash in main.go", a deployment, went to docker.)
    assert load_skill_catalogue().skills_for("deployment", description)[0] == skills


def load_now() -> Any:
    from datetime import UTC, datetime

    return datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("description", "category", "skills"),
    [
        ("Fix the race in the Go worker", "bug_fix", ("golang",)),  # Go, the language
        ("Let's go over the Terraform state", "deployment", ("terraform",)),  # go, the verb
        ("Go live with the new S3 bucket", "deployment", ("aws",)),  # a sentence's first word: the verb
        ("Deploy it. Go over the Terraform state", "deployment", ("terraform",)),
        ("Go service crashes on start", "bug_fix", ("golang",)),  # first, but a name: the language
        ("Go over the Go worker's race", "bug_fix", ("golang",)),  # the verb, then the language
        ("go", "bug_fix", ("python",)),  # no known word: the category
        ("Rewrite the goroutine pool", "feature", ("golang",)),
    ],
)
def test_go_names_the_language_only_as_the_language_is_written(
    description: str, category: str, skills: tuple[str, ...]
) -> None:
    # (The catalogue lowercased every word: "Let's go over the Terraform state" derived golang
    # beside terraform, and Backend, covering one of the two as DevOps did, could take it.)
    assert load_skill_catalogue().skills_for(category, description)[0] == skills


@pytest.mark.parametrize(
    ("team", "description", "category"), [(w[0], w[2], w[3]) for w in WORK if w[0] in TEAMS]
)
def test_the_seeds_own_task_descriptions_derive_skills_their_team_covers(
    team: str, description: str, category: str
) -> None:
    # (Created without skills, "Review the settings page" and "Slim the base image" were
    # routed by their category alone, python, to Backend.)
    skills, reason = load_skill_catalogue().skills_for(category, description)
    assert skills
    assert set(skills) <= set(TEAMS[team]), reason


@pytest.mark.parametrize("padded", ["high\x1c", "\x85high", "high\u00a0", "\u2003high"])
def test_a_priority_is_trimmed_of_spaces_tabs_and_line_breaks_only(padded: str) -> None:
    with pytest.raises(ValidationError, match="must be one of"):
        TaskPriority.parse(padded)
    assert TaskPriority.parse(" \tHIGH\r\n") is TaskPriority.HIGH
