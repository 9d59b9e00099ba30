"""consume --format TEMPLATE: one record per template, as kcat -f prints them.

Tokens: %t topic, %p partition, %o offset, %T timestamp (ms since the epoch), %k key,
%s value, %K key length and %S value length in bytes (-1 for a record without a key),
%h headers (name=value, comma-separated; a null value: the name alone), %% a percent
sign. Escapes: \\n newline, \\t tab, \\r carriage return, \\\\ a backslash. Nothing is
added: a template that wants a line per record ends with \\n. Keys, values and header
values are rendered by the encoding (--format text, base64 or hex; text by default), so
a template and an encoding combine: --format base64 --format '%k %s\\n'.

A template is parsed once into parts (text, or a token's field) and rendered per record:
an unknown token fails before anything is read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from broker.types import Record
from cli.formats import Rendering

_ESCAPES: Final = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}
TOKENS: Final = "tpoTksKSh%"

Part = Callable[[Record, Rendering], str]


class TemplateError(ValueError):
    """A template with an unknown token or escape (a usage error)."""


def _text(text: str) -> Part:
    return lambda _record, _rendering: text


def _headers(record: Record, rendering: Rendering) -> str:
    return ",".join(
        name if value is None else f"{name}={rendering.show(value)}"
        for name, value in record.headers
    )


_FIELDS: Final[dict[str, Part]] = {
    "t": lambda r, _: r.topic,
    "p": lambda r, _: str(r.partition),
    "o": lambda r, _: str(r.offset),
    "T": lambda r, _: str(r.timestamp_ms),
    "k": lambda r, rendering: rendering.show(r.key) or "",
    "s": lambda r, rendering: rendering.show(r.value) or "",
    "K": lambda r, _: str(-1 if r.key is None else len(r.key)),
    "S": lambda r, _: str(-1 if r.value is None else len(r.value)),  # -1: null, as kcat
    "h": _headers,
    "%": _text("%"),
}


def is_template(text: str) -> bool:
    return "%" in text or "\\" in text


class Template:
    def __init__(self, text: str) -> None:
        self.parts = _parse(text)

    def render(self, record: Record, rendering: Rendering) -> str:
        return "".join(part(record, rendering) for part in self.parts)


def _parse(text: str) -> list[Part]:
    parts: list[Part] = []
    literal: list[str] = []
    index = 0
    while index < len(text):
        char = text[index]
        if char not in "%\\":
            literal.append(char)
            index += 1
            continue
        following = text[index + 1 : index + 2]
        if char == "\\" and following in _ESCAPES:
            literal.append(_ESCAPES[following])
        elif char == "%" and following in _FIELDS:
            if literal:
                parts.append(_text("".join(literal)))
                literal = []
            parts.append(_FIELDS[following])
        else:
            raise TemplateError(
                f"{char}{following} is not a template token or escape "
                "(%t %p %o %T %k %s %K %S %h %%, \\n \\t \\r \\\\)"
            )
        index += 2
    if literal:
        parts.append(_text("".join(literal)))
    return parts
