"""Why an address cannot be listened on, as the setting at fault: shared by ``flowledger
serve`` and the LLM simulator, which both refuse it in one line before serving."""

from __future__ import annotations

import errno
import socket

from flowledger.domain.errors import ValidationError

_HOST_FAULTS = frozenset({errno.EADDRNOTAVAIL})
"""Errors of binding that are the host's: not an address of this machine (``192.0.2.1``)."""


def cannot_listen(host: str, port: int, error: OSError) -> ValidationError:
    """The refusal naming ``host`` when it does not resolve or is not this machine's, else
    ``port`` (taken, or not ours to bind). Both were blamed on the port by the simulator, and
    an address of another machine on the port by ``serve``."""
    at_host = isinstance(error, socket.gaierror) or error.errno in _HOST_FAULTS
    return ValidationError(
        "host" if at_host else "port", f"cannot listen on {host}:{port}: {error.strerror or error}"
    )
