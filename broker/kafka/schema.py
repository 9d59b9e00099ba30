"""A Kafka request's body, decoded and held to its API's message spec before any
handler sees it.

kafka-python's decoder is a client's: lenient where a broker must not be. It reads a
null (length -1) wherever a string, bytes or array may stand, whatever the spec says
of that field at that version, and a string or bytes field whose length runs past the
end of the request is cut short instead of refused. Kafka's own broker refuses both
("non-nullable field ... was serialized as null"), and so does fencelog: a request is
decoded here, then every field of the version is checked against the nullability the
spec-built classes carry (`nullableVersions`), down through nested structs and arrays
of structs, and the decoder must not have read past the end. A request that breaks its
spec is a SchemaViolation; the listener refuses it as it refuses bytes it cannot
decode. Bytes after the last field are not refused.

This is the one module that reaches into kafka-python's field tree (each message
class's `_struct`, the StructField its JSON spec was built into); every API of
wire.APIS is decoded through it, so an API added to the table is checked too.
"""

from __future__ import annotations

from typing import Any


class SchemaViolation(ValueError):
    """A decoded request whose fields break its API's message spec."""


def decode(message: Any, version: int, data: memoryview) -> Any:
    """The body of a request of class `message` (a kafka-python request class) at
    version, from data (the body's bytes, after the request header); SchemaViolation
    when it breaks the spec, what kafka-python raises when it cannot be read at all."""
    flexible = bool(message.flexible_version_q(version))
    read = message._struct.compiled_decode_from(
        version, compact=flexible, tagged=flexible, data_class=message[None]
    )
    body, end = read(data, 0)
    if end > len(data):
        raise SchemaViolation(f"a length in the request runs {end - len(data)} bytes past its end")
    fault = null_field(message._struct, body, version)
    if fault is not None:
        raise SchemaViolation(f"{fault} is null, which the API's spec does not allow at v{version}")
    return body


def null_field(struct: Any, value: Any, version: int, path: str = "") -> str | None:
    """The path of the first field of value (a decoded struct) that is null where the
    spec does not allow it at version (None: none is)."""
    for field in _present_fields(struct, value, version):
        item = getattr(value, field.name)
        where = f"{path}{field.name}"
        if item is None:
            # kafka-python decodes the all-zero UUID (Kafka's "no topic id") as None
            if field.nullable_for_version_q(version) or field.type_str == "uuid":
                continue
            return where
        fault = _null_inside(field, item, version, where)
        if fault is not None:
            return fault
    return None


def _null_inside(field: Any, item: Any, version: int, where: str) -> str | None:
    """The first disallowed null inside a non-null field's value."""
    if field.is_struct_array():
        for index, element in enumerate(item):
            fault = null_field(field.array_of, element, version, f"{where}[{index}].")
            if fault is not None:
                return fault
    elif field.is_struct():
        return null_field(field, item, version, f"{where}.")
    elif field.is_array():
        for index, element in enumerate(item):
            if element is None:  # an array's elements are never nullable
                return f"{where}[{index}]"
    return None


def _present_fields(struct: Any, value: Any, version: int) -> list[Any]:
    """The fields value carries at version: every untagged one, and the tagged ones
    the request sent."""
    fields = list(struct.untagged_fields(version))
    sent = getattr(value, "tags", None)
    if sent:
        fields += [
            f
            for f in struct.fields.values()
            if f.name in sent and f.for_version_q(version) and f.tagged_field_q(version)
        ]
    return fields
