"""Loads the named queries in queries.sql into a read-only mapping, once, at import."""

from __future__ import annotations

import re
from pathlib import Path
from types import MappingProxyType
from typing import Final

_NAME_LINE = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
_PARAMETER = re.compile(r"\?(\d+)")

# Rows per *_run insert. One statement per row costs SQLite a step and sqlite3 a pass of
# executemany's loop for each row; a statement of 64 rows shares both, which doubles
# the insert rate of batches (bench/RESULTS.md, "Profiles of the missed targets").
RUN_ROWS: Final = 64


def _load() -> MappingProxyType[str, str]:
    text = Path(__file__).with_name("queries.sql").read_text(encoding="utf-8")
    parts = _NAME_LINE.split(text)
    # parts: [preamble, name1, body1, name2, body2, ...]
    named = {name: body.strip() for name, body in zip(parts[1::2], parts[2::2], strict=True)}
    return MappingProxyType(
        {name: _run(body) if name.endswith("_run") else body for name, body in named.items()}
    )


def _run(template: str) -> str:
    """The template's one VALUES row RUN_ROWS times, {i}, {value} and {stamp} filled in
    ({stamp}: a per-row parameter numbered after every row's {value})."""
    head, _, row = template.rpartition("VALUES")
    row = row.strip().removesuffix(";")
    first_value = 1 + max(int(number) for number in _PARAMETER.findall(row))
    rows = (
        row.format(i=i, value=f"?{first_value + i}", stamp=f"?{first_value + RUN_ROWS + i}")
        for i in range(RUN_ROWS)
    )
    return f"{head}VALUES {', '.join(rows)};"


Q: Final = _load()
