"""Query strings: an operation refuses a parameter it does not declare (422), so a typo
(``GET /v1/tasks?stauts=pending``) is told, not answered as if no filter had been given; and
one that takes a single value given twice (``?status=pending&status=assigned``), which was
answered by the last value alone."""

from __future__ import annotations

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


def single_query(dependant: Dependant) -> set[str]:
    """The query parameters of an operation (its dependencies' included) that take one value."""
    names = {field.alias for field in dependant.query_params if not takes_many(field.field_info.annotation)}
    for dependency in dependant.dependencies:
        names |= single_query(dependency)
    return names


async def refuse_unknown_query(request: Request) -> None:
    """A dependency of every route (``create_app``): a RequestValidationError, rendered as any
    other 422, naming the parameters the operation does not declare and those it does. Async,
    so it runs in the request's task: a plain function would cost every request a thread hop.

    It depends on the route alone, so it answers before the caller's key is looked at, as an
    unknown path (404) or method (405) does; it tells nothing ``/openapi.json`` does not. Pages
    outside the OpenAPI document (``/docs`` and its OAuth2 redirect, which a provider calls
    with its own query) are not operations and are left alone.
    """
    if not request.query_params:
        return  # most requests (every webhook call) carry none: nothing to walk
    route = request.scope.get("route")
    if not isinstance(route, APIRoute) or not route.include_in_schema:
        return
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
