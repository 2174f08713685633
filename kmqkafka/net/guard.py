"""Length guard: refuse a request whose arrays, strings or bytes claim more than its frame holds,
before kio decodes it.

kio's native reader reserves an array's capacity from the count it reads, before reading any
element. A 30-byte Metadata frame claiming 2^32 - 2 topics made it ask for hundreds of GB, and an
allocation failure aborts the process: one client could stop the broker. Every element of every
array takes at least one byte on the wire, so a count larger than the bytes left is malformed.

``check(entity_type, frame, offset)`` walks the schema once over the frame without building
anything: fixed-size fields and payloads are skipped by their length, arrays are checked against
what is left before their elements are walked, tagged fields of flexible versions are walked
inside their stated size, and one request holds at most ``MAX_ELEMENTS`` array elements. It
raises ``MalformedFrame``; the connection then closes, as for any malformed request. Plans are
built once per kio class.

It also refuses what Kafka's generated readers refuse while parsing: a null (length -1) for a
field the schema does not make nullable ("non-nullable field X was serialized as null"), and a
string longer than 32,767 bytes, compact or not. A handler met such a null as ``None`` and
failed; a 40,000-character group id was stored, and every later ListGroups v0-2 response
failed to encode.

Unknown tagged fields are skipped, as KIP-482 asks of a receiver (kio's reader refuses them):
``check`` notes where they lie, and ``without_unknown_tags`` returns the frame without them.
"""
from __future__ import annotations

import struct
from dataclasses import fields
from functools import cache
from typing import Any, Callable

from kio.serial._introspect import (
    EntityField, EntityTupleField, PrimitiveField, PrimitiveTupleField, classify_field,
    get_field_tag, get_schema_field_type, is_optional,
)

__all__ = ["MalformedFrame", "check", "without_unknown_tags"]


class MalformedFrame(ValueError):
    """The frame's lengths do not fit the frame."""


_FIXED = {
    "bool": 1, "int8": 1, "int16": 2, "uint16": 2, "error_code": 2, "int32": 4,
    "timedelta_i32": 4, "int64": 8, "timedelta_i64": 8, "datetime_i64": 8, "float64": 8,
    "uuid": 16,
}
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")

# A step walks one field: step(buf, pos, end) -> the position after it.
Step = Callable[[Any, int, int], int]


MAX_ELEMENTS = 200_000
"""Array elements one request may hold in all. Far above what clients send (a Fetch of every
partition of a large cluster is a few thousand); a 4 MB DescribeProducers naming a million
partitions held the reactor for 8.5 s."""

MAX_STRING = 0x7FFF  # Kafka's readers refuse a longer string, compact ones included

_budget = [MAX_ELEMENTS]  # reactor thread only: reset by every ``check``
# Unknown tagged fields the last ``check`` met, per tagged-field section:
# (start of its count, end of its count, count, [(start, end) of each unknown field]).
_unknown: list[tuple[int, int, int, list[tuple[int, int]]]] = []
_in_tagged = [0]  # depth of known tagged fields being walked


def check(entity_type: type, frame: Any, offset: int = 0) -> int:
    """Walk ``entity_type`` over ``frame`` from ``offset``; return where it ends."""
    _budget[0] = MAX_ELEMENTS
    _unknown.clear()
    _in_tagged[0] = 0
    return _entity_step(entity_type)(frame, offset, len(frame))


def without_unknown_tags(frame: Any) -> Any:
    """``frame`` as the last ``check`` walked it, less the unknown tagged fields it met (each
    section's count lowered to match); ``frame`` itself when there were none."""
    if not _unknown:
        return frame
    out = bytearray()
    prev = 0
    for count_start, count_end, count, spans in sorted(_unknown):
        out += frame[prev:count_start]
        out += _uvarint_bytes(count - len(spans))
        prev = count_end
        for start, end in spans:
            out += frame[prev:start]
            prev = end
    out += frame[prev:]
    _unknown.clear()
    return bytes(out)


def _uvarint_bytes(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _uvarint(buf: Any, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while pos < end and shift <= 28:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
    raise MalformedFrame("truncated or overlong varint")


def _skip(pos: int, n: int, end: int) -> int:
    if n < 0 or pos + n > end:
        raise MalformedFrame(f"a length of {n} runs past the frame")
    return pos + n


def _length_reader(flexible: bool, legacy: struct.Struct) -> Callable[[Any, int, int], tuple[int, int]]:
    """(length or -1 for null, position after it): compact (uvarint + 1) or legacy."""
    if flexible:
        def compact(buf: Any, pos: int, end: int) -> tuple[int, int]:
            n, pos = _uvarint(buf, pos, end)
            return n - 1, pos
        return compact

    size = legacy.size

    def fixed(buf: Any, pos: int, end: int) -> tuple[int, int]:
        if pos + size > end:
            raise MalformedFrame("truncated length")
        return legacy.unpack_from(buf, pos)[0], pos + size
    return fixed


def _primitive_step(kafka_type: str, flexible: bool, legacy_string: bool = False,
                    nullable: bool = True, name: str = "") -> Step:
    fixed = _FIXED.get(kafka_type)
    if fixed is not None:
        return lambda buf, pos, end: _skip(pos, fixed, end)
    longest = None
    if kafka_type == "string":
        read = _length_reader(flexible and not legacy_string, _I16)
        longest = MAX_STRING
    elif kafka_type in ("bytes", "records"):
        read = _length_reader(flexible, _I32)
    else:
        raise MalformedFrame(f"no length rule for kafka type {kafka_type!r}")

    def sized(buf: Any, pos: int, end: int) -> int:
        n, pos = read(buf, pos, end)
        if n == -1:
            if not nullable:
                raise MalformedFrame(f"non-nullable field {name} was serialized as null")
            return pos
        if longest is not None and n > longest:
            raise MalformedFrame(f"string field {name} had invalid length {n}")
        return _skip(pos, n, end)
    return sized


def _array_step(element: Step, flexible: bool, fixed: int | None = None,
                nullable: bool = True, name: str = "") -> Step:
    """``fixed``: the element size when it has one (skipped in one step)."""
    read = _length_reader(flexible, _I32)

    def array(buf: Any, pos: int, end: int) -> int:
        n, pos = read(buf, pos, end)
        if n == -1:
            if not nullable:
                raise MalformedFrame(f"non-nullable field {name} was serialized as null")
            return pos
        if n < 0 or n > end - pos:  # every element takes at least one byte
            raise MalformedFrame(f"an array of {n} elements in {end - pos} bytes")
        _budget[0] -= n
        if _budget[0] < 0:
            raise MalformedFrame(f"more than {MAX_ELEMENTS} array elements in one request")
        if fixed is not None:
            return _skip(pos, n * fixed, end)
        for _ in range(n):
            pos = element(buf, pos, end)
        return pos
    return array


def _field_step(field: Any, flexible: bool, header: bool, tagged: bool) -> Step:
    kind = classify_field(field)
    nullable = is_optional(field)
    if isinstance(kind, PrimitiveField):
        return _primitive_step(get_schema_field_type(field), flexible,
                               legacy_string=header and field.name == "client_id",
                               nullable=nullable, name=field.name)
    if isinstance(kind, PrimitiveTupleField):
        kafka_type = get_schema_field_type(field)
        return _array_step(_primitive_step(kafka_type, flexible, name=field.name), flexible,
                           _FIXED.get(kafka_type), nullable, field.name)
    if isinstance(kind, EntityTupleField):
        return _array_step(_entity_step(kind.type_), flexible, nullable=nullable,
                           name=field.name)
    assert isinstance(kind, EntityField)
    inner = _entity_step(kind.type_)
    if tagged or not is_optional(field):
        return inner

    def nullable(buf: Any, pos: int, end: int) -> int:
        marker_end = _skip(pos, 1, end)
        return marker_end if buf[pos] == 0xFF else inner(buf, marker_end, end)
    return nullable


@cache
def _entity_step(entity_type: type) -> Step:
    flexible = bool(getattr(entity_type, "__flexible__", False))
    header = entity_type.__name__ == "RequestHeader"
    steps: list[Step] = []
    tags: dict[int, Step] = {}
    for f in fields(entity_type):
        tag = get_field_tag(f)
        step = _field_step(f, flexible, header, tag is not None)
        if tag is None:
            steps.append(step)
        else:
            tags[int(tag)] = step

    def entity(buf: Any, pos: int, end: int) -> int:
        for step in steps:
            pos = step(buf, pos, end)
        if not flexible:
            return pos
        count_start = pos
        count, pos = _uvarint(buf, pos, end)
        if count > end - pos:
            raise MalformedFrame(f"{count} tagged fields in {end - pos} bytes")
        count_end = pos
        unknown: list[tuple[int, int]] | None = None
        for _ in range(count):
            field_start = pos
            tag, pos = _uvarint(buf, pos, end)
            size, pos = _uvarint(buf, pos, end)
            stop = _skip(pos, size, end)
            step = tags.get(tag)
            if step is not None:
                _in_tagged[0] += 1
                try:
                    step(buf, pos, stop)
                finally:
                    _in_tagged[0] -= 1
            elif unknown is None:
                unknown = [(field_start, stop)]
            else:
                unknown.append((field_start, stop))
            pos = stop
        if unknown:
            if _in_tagged[0]:  # dropping it would change the enclosing field's size
                raise MalformedFrame("an unknown tagged field inside a tagged field")
            _unknown.append((count_start, count_end, count, unknown))
        return pos
    return entity
