"""The Debian-package helper of the tests: nothing is installed outside CI."""

from __future__ import annotations

import subprocess

import pytest

from tests.support import debian


def test_a_present_package_is_not_installed_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("apt-get was run"))
    assert debian.install_in_ci(["pgbouncer"], lambda: True) is True


def test_outside_ci_a_missing_package_is_reported_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "false")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("apt-get was run"))
    assert debian.install_in_ci(["pgbouncer"], lambda: False) is False
