"""Everyday frontend and infrastructure work reaches the team that does it.

Created without skills, 26 of 60 ordinary tasks for the seed's three teams named no word the
catalogue knew and went by their category alone (python) to Backend: "Fix the navbar alignment
on Safari", "Fix the broken dropdown menu", "Fix the hydration error in Next.js", "Migrate DNS
records to Route53", "Set up the Jenkins build agents", "Write Ansible playbooks for the
bastion". The catalogue (2026-12-07.2) knows the words of that work; words shared by several
teams' work ("bucket": a token bucket; "style": code style; "dns") stay out.
"""

from __future__ import annotations

import pytest

from flowledger.infrastructure.router_files import load_skill_catalogue

TEAMS = {
    "backend": {"python", "golang", "kubernetes"},
    "frontend": {"react", "vue", "css"},
    "devops": {"terraform", "aws", "docker"},
}


@pytest.mark.parametrize(
    ("team", "description"),
    [
        ("frontend", "Fix the navbar alignment on Safari"),
        ("frontend", "Improve accessibility of the login form"),
        ("frontend", "Fix the broken dropdown menu"),
        ("frontend", "Add a loading spinner to the dashboard"),
        ("frontend", "Fix the font rendering in Firefox"),
        ("frontend", "Update the design system colors"),
        ("frontend", "Fix the tooltip position"),
        ("frontend", "Fix the flickering animation"),
        ("frontend", "Add keyboard navigation to the menu"),
        ("frontend", "Implement infinite scroll on the feed"),
        ("frontend", "Add unit tests for the Vuex store"),
        ("frontend", "Fix the hydration error in Next.js"),
        ("frontend", "Fix the broken icons in the sidebar"),
        ("devops", "Set up CloudFront in front of the bucket"),
        ("devops", "Set up the Jenkins build agents"),
        ("devops", "Configure the load balancer health checks"),
        ("devops", "Migrate the records to Route53"),
        ("devops", "Write Ansible playbooks for the bastion"),
        ("devops", "Configure the VPN gateway"),
        ("devops", "Provisioning the staging environment"),
    ],
)
def test_a_teams_everyday_work_derives_skills_that_team_covers(team: str, description: str) -> None:
    skills, reason = load_skill_catalogue().skills_for("feature", description)
    assert "no known word" not in reason
    assert set(skills) <= TEAMS[team], reason


@pytest.mark.parametrize(
    "description",
    [
        "Implement a token bucket rate limiter",
        "Fix the code style violations",
        "Fix the DNS lookups of the Go client",
    ],
)
def test_words_every_team_uses_name_no_other_teams_stack(description: str) -> None:
    skills, reason = load_skill_catalogue().skills_for("feature", description)
    assert set(skills) <= TEAMS["backend"], reason


def test_the_shipped_catalogue_says_its_version() -> None:
    assert load_skill_catalogue().version == "2026-12-07.2"
