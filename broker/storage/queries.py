"""Loads the named queries in queries.sql into a read-only mapping, once, at import."""

from __future__ import annotations

import re
from pathlib import Path
from types import MappingProxyType
from typing import Final

_NAME_LINE = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def _load() -> MappingProxyType[str, str]:
    text = Path(__file__).with_name("queries.sql").read_text(encoding="utf-8")
    parts = _NAME_LINE.split(text)
    # parts: [preamble, name1, body1, name2, body2, ...]
    named = {name: body.strip() for name, body in zip(parts[1::2], parts[2::2], strict=True)}
    return MappingProxyType(named)


Q: Final = _load()
