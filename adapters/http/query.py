"""Query strings: an operation refuses a parameter it does not declare (422), so a typo
(``GET /v1/tasks?stauts=pending``) is told, not answered as if no filter had been given; and
one that takes a single value given twice (``?status=pending&status=assigned``), which was
answered by the last value alone. A header the operation declares (``Idempotency-Key``) given
twice is refused the same way: the first was taken, the other dropped without a word. A
number is written as JSON writes one, in ASCII digits: the framework read ``limit=1_0``,
``limit=+5``, ``limit= 5`` as Python's ``int()`` does (as 10, 5 and 5); another script's
digits, which ``int()`` reads too, are refused alike. A boolean is ``true`` or ``false``, as
the OpenAPI document's ``boolean`` is written in a query: ``yes``, ``on``, ``1``, ``t``, ``True``
were read as the framework's lax booleans read them."""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Sequence

from fastapi import Request
from fastapi.dependencies.models import Dependant
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute


def declared_query(dependant: Dependant) -> list[str]:
    """The query parameters an operation declares, its dependencies' included, as a client
    names them (their aliases), in declaration order. (No operation takes a pydantic model as
    its query; one would be named here by its parameter, not by its fields.)"""
    names = [field.alias for field in dependant.query_params]
    for dependency in dependant.dependencies:
        names += [name for name in declared_query(dependency) if name not in names]
    return names


def takes_many(annotation: object) -> bool:
    """Whether a parameter so annotated takes several values (``by=model&by=step``)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return takes_many(typing.get_args(annotation)[0])
    if origin is typing.Union or origin is types.UnionType:
        return any(takes_many(arg) for arg in typing.get_args(annotation))
    return isinstance(origin, type) and issubclass(origin, Sequence | set | frozenset) and origin is not str


_WRITTEN = {
    int: (re.compile(r"-?[0-9]+"), "Input should be a valid integer in ASCII digits, like 10"),
    float: (
        re.compile(r"-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?"),
        "Input should be a valid number in ASCII digits, like 2 or 0.5",
    ),
    bool: (re.compile(r"true|false"), "must be true or false"),
}
"""How a number in a query string is written (no sign but '-', no space, underscore, fraction of a
whole number or other script's digits), and a boolean (one rule for every boolean parameter,
current and future: the framework read ``exact=yes``, ``overdue=1``, ``exact=on`` as true and
``n``, ``off``, ``0`` as false); and what a value written otherwise is told."""


def written_kind(annotation: object) -> type | None:
    """``int``, ``float`` or ``bool`` when a parameter so annotated takes numbers or booleans
    (``int | None``, ``list[int]``, ``bool | None``), else None."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated or (
        isinstance(origin, type) and issubclass(origin, Sequence | set | frozenset)
    ):
        return written_kind(typing.get_args(annotation)[0])
    if origin is typing.Union or origin is types.UnionType:
        kinds = {written_kind(arg) for arg in typing.get_args(annotation)} - {None}
        return kinds.pop() if len(kinds) == 1 else None
    return annotation if annotation in _WRITTEN else None


def loosely_written(request: Request, dependant: Dependant) -> list[dict[str, object]]:
    """A validation error for each number of the query (or the path) written in a way only
    Python's ``int()`` or ``float()`` reads (``1_0``, ``+5``, `` 5``, another script's digits),
    and each boolean written other than ``true`` or ``false``."""
    problems: list[dict[str, object]] = []
    places = (
        ("query", dependant.query_params, request.query_params.getlist),
        ("path", dependant.path_params, None),
    )
    for place, fields, values_of in places:
        for field in fields:
            kind = written_kind(field.field_info.annotation)
            if kind is None:
                continue
            pattern, said = _WRITTEN[kind]
            given = values_of(field.alias) if values_of else [request.path_params.get(field.alias)]
            for value in given:
                if isinstance(value, str) and not pattern.fullmatch(value):
                    loc = (place, field.alias)
                    problems.append({"type": "number_written", "loc": loc, "msg": said, "input": value})
    for dependency in dependant.dependencies:
        problems += loosely_written(request, dependency)
    return problems


def single_query(dependant: Dependant) -> set[str]:
    """The query parameters of an operation (its dependencies' included) that take one value."""
    names = {field.alias for field in dependant.query_params if not takes_many(field.field_info.annotation)}
    for dependency in dependant.dependencies:
        names |= single_query(dependency)
    return names


async def refuse_unknown_query(request: Request) -> None:
    """A dependency of every route (``create_app``): a RequestValidationError, rendered as any
    other 422, naming the parameters the operation does not declare and those it does, or a
    number of the query or the path not written in ASCII digits or a boolean not written
    ``true`` or ``false`` (``loosely_written``). Async,
    so it runs in the request's task: a plain function would cost every request a thread hop.

    It depends on the route alone, so it answers before the caller's key is looked at, as an
    unknown path (404) or method (405) does; it tells nothing ``/openapi.json`` does not. Pages
    outside the OpenAPI document (``/docs`` and its OAuth2 redirect, which a provider calls
    with its own query) are not operations and are left alone.
    """
    route = request.scope.get("route")
    if isinstance(route, APIRoute) and route.include_in_schema:
        _refuse_repeated_headers(request, route)
    if not request.query_params and not request.path_params:
        return  # most requests (every webhook call) carry neither: nothing to walk
    if not isinstance(route, APIRoute) or not route.include_in_schema:
        return
    if request.query_params:
        _refuse_unknown_or_repeated(request, route)
    if loose := loosely_written(request, route.dependant):
        raise RequestValidationError(loose)


def declared_headers(dependant: Dependant) -> list[str]:
    """The headers an operation (its dependencies included) declares as parameters, each taking
    one value, as a client names them."""
    names = [field.alias for field in dependant.header_params]
    for dependency in dependant.dependencies:
        names += [name for name in declared_headers(dependency) if name not in names]
    return names


_HEADERS = "_flowledger_declared_headers"
"""Where a route keeps its ``declared_headers``, worked out on its first request (routes are
not hashable, so no cache can key on them)."""


def _refuse_repeated_headers(request: Request, route: APIRoute) -> None:
    names: list[str] | None = getattr(route, _HEADERS, None)
    if names is None:
        names = declared_headers(route.dependant)
        setattr(route, _HEADERS, names)
    for name in names:
        given = len(request.headers.getlist(name))
        if given > 1:
            problem = f"given {given} times: it takes one value"
            raise RequestValidationError(
                [{"type": "header_repeated", "loc": ("header", name), "msg": problem}]
            )


def _refuse_unknown_or_repeated(request: Request, route: APIRoute) -> None:
    declared = declared_query(route.dependant)
    unknown = [name for name in request.query_params if name not in declared]
    if not unknown:
        # A parameter that takes one value, given more than once: which one counts would be
        # the framework's guess (the last), the others dropped without a word.
        single = single_query(route.dependant)
        for name in dict.fromkeys(request.query_params):
            given = len(request.query_params.getlist(name))
            if given > 1 and name in single:
                problem = f"{name!r} given {given} times: it takes one value ({request.method} {route.path})"
                raise RequestValidationError([{"type": "query_repeated", "loc": ("query",), "msg": problem}])
        return
    named = ", ".join(repr(name) for name in unknown)
    takes = f"takes {', '.join(declared)}" if declared else "takes no query parameters"
    plural = "s" if len(unknown) > 1 else ""
    problem = f"unknown parameter{plural} {named} ({request.method} {route.path} {takes})"
    raise RequestValidationError([{"type": "query_unknown", "loc": ("query",), "msg": problem}])
