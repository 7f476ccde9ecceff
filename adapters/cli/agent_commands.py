"""``flowledger agents register|list|show|capacity``: the agents tasks are routed to.

The same commands as the REST API's (``/v1/agents``), on one tenant (``--tenant``, else the
engine's): the same defaults (capacity 10), the same rules (the domain's), the same refusals.
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from flowledger.adapters.cli.consoles import cli_console
from flowledger.adapters.cli.errors import reported_errors
from flowledger.adapters.cli.number_arguments import NumberArguments, whole_number
from flowledger.adapters.cli.rendering import whole_cells
from flowledger.domain.agent import SEED_CAPACITY
from flowledger.domain.task_views import AgentState
from flowledger.infrastructure import Engine

console = cli_console()
agents_app = typer.Typer(
    help="Agents tasks are routed to: register, list, show, change capacity.", no_args_is_help=True
)
TENANT_HELP = "Whose agents (default: FLOWLEDGER_TENANT or 'default')."
TenantOpt = Annotated[str | None, typer.Option(help=TENANT_HELP)]
AgentArg = Annotated[str, typer.Argument(help="The agent's id.")]


def agent_line(state: AgentState) -> str:
    """One agent in a line: id, name, skills, load over capacity."""
    skills = ", ".join(state.skills)
    return f"agent {state.agent_id!r} ({state.name}): {skills}; load {state.load}/{state.capacity}"


def agents_table(title: str, agents: list[AgentState]) -> Table:
    """One row per agent, with its load."""
    table = Table(title=escape(title))
    for column in ("agent", "name", "skills", "capacity", "load", "completed", "active tasks"):
        table.add_column(column, justify="right" if column in ("capacity", "load", "completed") else "left")
    for agent in agents:
        table.add_row(
            escape(agent.agent_id),
            escape(agent.name),
            escape(", ".join(agent.skills)),
            str(agent.capacity),
            str(agent.load),
            str(agent.completed),
            escape(", ".join(agent.active_tasks)),
        )
    return whole_cells(table)


@agents_app.command("register")
def register_agent(
    agent_id: AgentArg,
    name: Annotated[str, typer.Option(help="A name for people.")],
    skill: Annotated[list[str], typer.Option(help="A skill (repeat: --skill python --skill golang).")],
    capacity: Annotated[
        int, typer.Option(help="The most tasks it holds at once (1 to 10,000).", parser=whole_number)
    ] = SEED_CAPACITY,
    tenant: TenantOpt = None,
) -> None:
    """Register an agent; again with the same fields changes nothing (other fields: exit 4)."""
    with reported_errors(), Engine(tenant=tenant) as engine:
        done = engine.register_or_get_agent(agent_id, name, skill, capacity)
    verb = "registered" if done.created else "already registered"
    console.print(f"{agent_line(done.state)} {verb}", markup=False, highlight=False)


@agents_app.command("list")
def list_agents(tenant: TenantOpt = None) -> None:
    """Every agent with its load, in registration order."""
    with reported_errors(), Engine(tenant=tenant) as engine:
        agents = engine.list_agents()
    console.print(agents_table(f"agents of {engine.tenant}", agents))


@agents_app.command("show")
def show_agent(agent_id: AgentArg, tenant: TenantOpt = None) -> None:
    """An agent: skills, capacity, load, the tasks it holds."""
    with reported_errors(), Engine(tenant=tenant) as engine:
        agent = engine.get_agent(agent_id)
    console.print(agents_table(f"agent {agent_id} at version {agent.version}", [agent]))


@agents_app.command("capacity", cls=NumberArguments)
def set_capacity(
    agent_id: AgentArg,
    capacity: Annotated[
        int, typer.Argument(help="The new capacity (0 pauses it; never below its load).", parser=whole_number)
    ],
    tenant: TenantOpt = None,
) -> None:
    """Change an agent's capacity (exit 4 below the tasks it holds)."""
    with reported_errors(), Engine(tenant=tenant) as engine:
        state = engine.set_agent_capacity(agent_id, capacity)
    console.print(agent_line(state), markup=False, highlight=False)


def register(app: typer.Typer) -> None:
    """Add ``agents`` to the top-level app."""
    app.add_typer(agents_app, name="agents")
