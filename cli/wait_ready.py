"""fencelog wait-ready: wait until a server answers, for CI scripts."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from broker.client.client import connect
from broker.discovery import find_server
from broker.errors import BrokerError, ErrorCode
from cli.context import state
from cli.formats import parse_duration
from cli.options import JsonFlag
from cli.output import Output

_POLL_S = 0.05


def wait_ready(
    timeout: Annotated[
        str,
        typer.Option(
            "--timeout", help="Give up after this long (500ms, 10s, 2m).", metavar="DURATION"
        ),
    ] = "10s",
    as_json: JsonFlag = False,
) -> None:
    """Wait until a server answers at --broker, then exit 0.

    --broker is a server's address (tcp://HOST:PORT, unix://PATH), or a data directory
    that a `fencelog serve` (perhaps still starting) will own. A server answers once it
    has finished recovery and listens. Exit 80 (CONNECTION_FAILED) if none answered
    within --timeout, 82 (AUTH_FAILED) at once if one answered and refused the token.
    """
    current = state()
    limit_s = parse_duration(timeout)
    if limit_s <= 0:
        raise BrokerError(ErrorCode.INVALID_ARGUMENT, "--timeout must be positive")
    deadline = time.monotonic() + limit_s
    address = current.address()
    last: BrokerError | None = None
    while True:
        url = address
        if url is None:
            data_dir = Path(current.broker)
            info = find_server(data_dir) if data_dir.is_dir() else None
            url = info.url() if info is not None else None
        remaining = deadline - time.monotonic()
        if url is not None:
            try:
                with connect(
                    url, token=current.token, create=False, request_timeout_s=max(remaining, 0.1)
                ) as client:
                    client.status()
            except BrokerError as error:
                if error.code is ErrorCode.AUTH_FAILED:
                    raise  # a server answers, and refuses this token: waiting changes nothing
                last = error
            else:
                out = Output(as_json)
                out.json({"ready": True, "url": url}) if as_json else out.line(f"ready: {url}")
                out.flush()
                return
        if remaining <= 0:
            break
        time.sleep(min(_POLL_S, max(remaining, 0)))
    why = f" (last: {last.message})" if last is not None else ""
    raise BrokerError(
        ErrorCode.CONNECTION_FAILED,
        f"no server answered at {address or current.broker} within {timeout}{why}",
        hint="is `fencelog serve` running, on this address or data directory?",
    )
