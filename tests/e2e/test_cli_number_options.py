"""Every number a command line takes is written in ASCII digits: click's reading (``int()``,
``float()``) took ``--limit 1_0``, ``--limit +5``, ``--limit ' 5'`` and ``--rate-limited 0_5``;
each is a usage error (exit 2, one line naming the option)."""

from __future__ import annotations

import types
import typing
from collections.abc import Iterator

import pytest
import typer.main

from flowledger.adapters.cli.main import app, main
from flowledger.adapters.cli.number_arguments import real_number, whole_number


def number_parameters() -> Iterator[tuple[str, str, object, object]]:
    """(command, parameter, its type, its parser) for every int or float parameter of the CLI."""

    def walk(command: object, path: list[str]) -> Iterator[tuple[str, str, object, object]]:
        for name, sub in getattr(command, "commands", {}).items():
            yield from walk(sub, [*path, name])
        for param in getattr(command, "params", []) if not hasattr(command, "commands") else []:
            described = getattr(param, "type_descriptor", None)
            if described is None:
                continue
            annotation = described.annotation
            union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
            kinds = set(typing.get_args(annotation) if union else (annotation,)) & {int, float}
            for kind in kinds:
                yield " ".join(path), param.name, kind, described.parameter_info.parser

    yield from walk(typer.main.get_command(app), [])


def test_every_number_option_and_argument_reads_ascii_digits_only() -> None:
    found = list(number_parameters())
    assert len(found) > 20
    loose = [
        (c, p) for c, p, kind, parser in found if parser is not {int: whole_number, float: real_number}[kind]
    ]
    assert loose == []


@pytest.mark.parametrize("written", ["1_0", "+5", " 5", "5 ", "\u0665", "5.0", "0x5"], ids=repr)
@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["tasks", "list", "--limit"], "'--limit'"),
        (["serve", "--port"], "'--port'"),
        (["replay", "s-1", "--version"], "'--version'"),
        (["agents", "capacity", "a-1"], "'capacity'"),
    ],
)
def test_an_integer_not_written_in_ascii_digits_is_a_usage_error_naming_the_option(
    capsys: pytest.CaptureFixture[str], args: list[str], option: str, written: str
) -> None:
    with pytest.raises(SystemExit) as ended:
        main([*args, written])
    err = capsys.readouterr().err
    assert ended.value.code == 2
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"error: Invalid value for {option}: Input should be a valid integer"), err
    assert repr(written) in err


@pytest.mark.parametrize("written", ["1_0", "0_5", "+0.5", " 0.5", "0.5 ", "\u0665"], ids=repr)
def test_a_number_not_written_in_ascii_digits_is_a_usage_error_naming_the_option(
    capsys: pytest.CaptureFixture[str], written: str
) -> None:
    with pytest.raises(SystemExit) as ended:
        main(["simulate-llm", "--rate-limited", written])
    err = capsys.readouterr().err
    assert ended.value.code == 2
    assert err.startswith("error: Invalid value for '--rate-limited': Input should be a valid number"), err


@pytest.mark.parametrize(("text", "read"), [("10", 10), ("010", 10), ("-1", -1)])
def test_integers_in_ascii_digits_are_read(text: str, read: int) -> None:
    assert whole_number(text) == read


@pytest.mark.parametrize(
    ("text", "read"), [("2", 2.0), ("0.5", 0.5), (".5", 0.5), ("1e-3", 0.001), ("-1.5", -1.5)]
)
def test_numbers_in_ascii_digits_are_read(text: str, read: float) -> None:
    assert real_number(text) == read
