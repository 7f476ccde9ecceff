"""Query strings: an operation refuses a parameter it does not declare (422), so a typo
(``GET /v1/tasks?stauts=pending``) is told, not answered as if no filter had been given."""

from __future__ import annotations

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
        return
    named = ", ".join(repr(name) for name in unknown)
    takes = f"takes {', '.join(declared)}" if declared else "takes no query parameters"
    plural = "s" if len(unknown) > 1 else ""
    problem = f"unknown parameter{plural} {named} ({request.method} {route.path} {takes})"
    raise RequestValidationError([{"type": "query_unknown", "loc": ("query",), "msg": problem}])
