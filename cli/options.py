"""Options several commands share, declared once."""

from __future__ import annotations

from typing import Annotated

import typer

from cli.errors import json_option_callback
from cli.formats import Format

JsonFlag = Annotated[
    bool,
    typer.Option(
        "--json",
        help="Print one JSON object per line (errors and warnings too, on stderr).",
        callback=json_option_callback,
        is_eager=True,
    ),
]
FormatOption = Annotated[
    Format,
    typer.Option(
        "--format",
        help="How keys and values are written: text (UTF-8), base64 or hex (binary-safe).",
        case_sensitive=False,
    ),
]
FenceOption = Annotated[
    list[str] | None,
    typer.Option(
        "--fence",
        help="GROUP:RESOURCE:GENERATION that must be current (repeatable). Inside "
        "`fencelog own ... -- CMD` the owner's fences apply by default.",
        metavar="FENCE",
    ),
]
