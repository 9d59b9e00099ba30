"""Ownership of (group, resource) with generations: seeds/single-reader-writer.txt with
the rules of DESIGN.md section 3. Pure: the current holdings and which holders are live
come in, a decision comes out.

Per resource of a claim with generation g by session S:
- g = 0: always granted; any other holder is severed; the generation resets to 1 (an
  audited "reset": it bypasses fencing).
- another live holder whose generation is higher than g: refused
  (OWNED_BY_HIGHER_GENERATION, with the current generation).
- S already holds it and g <= its generation: no change.
- otherwise: any other holder is severed, and S holds it at max(current + 1, g); a
  never-owned resource (current 0) claimed with g = 1 gets 1.
The request is atomic: if any resource is refused, nothing is granted.

A fence (group, resource, generation) on a produce or fetch passes only when that
generation is the current one and its holder is live.

A topic created with an owner group takes a write to partition P only with a fence of
`TOPIC/P` in that group (check_owner_fences; whether that fence is current and live is
check_fence's).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from shlex import quote

from msgspec import Struct

from broker.core.values import check_integer, check_string
from broker.errors import BrokerError, ErrorCode
from broker.types import Fence

NAME_CHARS_MAX = 255
# A claim may ask for at most this generation; stored generations only grow by one per
# claim from there, so they stay far inside SQLite's 64-bit integers.
GENERATION_MAX = 1 << 62


class Event(enum.StrEnum):
    CLAIMED = "claimed"
    UNCHANGED = "unchanged"
    RESET = "reset"
    REFUSED = "refused"
    SEVERED = "severed"
    RELEASED = "released"


class Holding(Struct, frozen=True):
    """What is stored for one (group, resource); generation 0: never owned."""

    generation: int = 0
    holder: str | None = None
    holder_live: bool = False


class Grant(Struct, frozen=True):
    resource: str
    generation: int
    previous_generation: int
    event: Event  # CLAIMED, UNCHANGED or RESET
    severed: str | None  # the other live or dead holder this claim displaced


class Refusal(Struct, frozen=True):
    resource: str
    requested_generation: int
    current_generation: int
    holder: str


def check_name(what: str, name: str) -> None:
    check_string(what, name)
    if not name or len(name) > NAME_CHARS_MAX or not name.isprintable():
        raise BrokerError(
            ErrorCode.INVALID_NAME,
            f"{what} must be 1 to {NAME_CHARS_MAX} printable characters, not {name[:40]!r}",
        )


def check_claims(group: str, claims: Sequence[tuple[str, int]]) -> None:
    check_name("group", group)
    if not claims:
        raise BrokerError(ErrorCode.INVALID_ARGUMENT, "a claim names at least one resource")
    seen: set[str] = set()
    for resource, generation in claims:
        check_name("resource", resource)
        check_integer("generation", generation)
        if not 0 <= generation <= GENERATION_MAX:
            raise BrokerError(
                ErrorCode.INVALID_ARGUMENT,
                f"generation must be 0 to {GENERATION_MAX}, not {generation}",
                resource=resource,
            )
        if resource in seen:
            raise BrokerError(
                ErrorCode.INVALID_ARGUMENT,
                f"resource {resource} is claimed twice",
                resource=resource,
            )
        seen.add(resource)


class Decision(Struct, frozen=True):
    """Either every resource granted, or the refusals and nothing granted."""

    grants: tuple[Grant, ...]
    refusals: tuple[Refusal, ...]


def decide_claims(
    session: str, claims: Sequence[tuple[str, int]], current: Mapping[str, Holding]
) -> Decision:
    grants: list[Grant] = []
    refusals: list[Refusal] = []
    for resource, requested in claims:
        holding = current.get(resource, Holding())
        other = holding.holder if holding.holder not in (None, session) else None
        if requested == 0:
            grants.append(Grant(resource, 1, holding.generation, Event.RESET, other))
        elif other is not None and holding.holder_live and holding.generation > requested:
            refusals.append(Refusal(resource, requested, holding.generation, other))
        elif holding.holder == session and requested <= holding.generation:
            grants.append(
                Grant(resource, holding.generation, holding.generation, Event.UNCHANGED, None)
            )
        else:
            generation = max(holding.generation + 1, requested)
            grants.append(Grant(resource, generation, holding.generation, Event.CLAIMED, other))
    if refusals:
        return Decision((), tuple(refusals))
    return Decision(tuple(grants), ())


def refusal_error(group: str, refusals: Sequence[Refusal]) -> BrokerError:
    first = refusals[0]
    return BrokerError(
        ErrorCode.OWNED_BY_HIGHER_GENERATION,
        f"{group}:{first.resource} is held at generation {first.current_generation}, "
        f"higher than the claimed {first.requested_generation}",
        group=group,
        resource=first.resource,
        generation=first.current_generation,
        requested_generation=first.requested_generation,
        refused=[r.resource for r in refusals],
        hint="claim with a higher generation, or 0 to reset (audited)",
    )


def check_fence(fence: Fence, holding: Holding) -> None:
    """Passes only for the current generation with a live holder; the refusal says which
    of the three it is: never claimed, claimed again since, or its holder gone."""
    if holding.generation == fence.generation and holding.holder_live:
        return
    current = holding.generation
    if current == 0:
        why = f"nobody has ever claimed {fence.group}:{fence.resource}"
        hint = f"claim it first: fencelog own {quote(fence.group)} {quote(fence.resource)} -- CMD"
    elif current != fence.generation:
        why = f"the current generation is {current}"
        hint = (
            "a newer owner took over; stop writing"
            if current > fence.generation
            else f"generation {fence.generation} was never granted; use the one own printed"
        )
    else:
        why = "its holder is gone (released, or its session ended)"
        hint = "claim it again to write; a claim lasts while its holder runs"
    raise BrokerError(
        ErrorCode.FENCED,
        f"fence {fence} is stale: {why}",
        group=fence.group,
        resource=fence.resource,
        generation=current,
        fence_generation=fence.generation,
        hint=hint,
    )


def parse_fence(text: str) -> Fence:
    """GROUP:RESOURCE:GENERATION (the resource may itself contain ':')."""
    group, sep1, rest = text.partition(":")
    resource, sep2, generation = rest.rpartition(":")
    if not (sep1 and sep2 and group and resource and generation.isascii() and generation.isdigit()):
        raise BrokerError(
            ErrorCode.INVALID_FENCE,
            f"fence {text!r} is not GROUP:RESOURCE:GENERATION",
            hint="e.g. --fence samza:journal/0:5",
        )
    check_name("group", group)
    check_name("resource", resource)
    return Fence(group, resource, int(generation))


def partition_resource(topic: str, partition: int) -> str:
    return f"{topic}/{partition}"


def check_owner_fences(
    owner_group: str | None, topic: str, partitions: Iterable[int], fences: Sequence[Fence]
) -> None:
    """A write to these partitions of `topic` (created with `owner_group`, or None) must
    carry, for each partition P, a fence of (owner_group, TOPIC/P); a fence of another
    group or resource does not count. FENCED names the first partition without one."""
    if owner_group is None:
        return
    fenced = {f.resource for f in fences if f.group == owner_group}
    for partition in sorted(partitions):
        resource = partition_resource(topic, partition)
        if resource not in fenced:
            raise BrokerError(
                ErrorCode.FENCED,
                f"writes to {resource} need the fence of {owner_group}:{resource}",
                group=owner_group,
                resource=resource,
                hint=f"claim it (fencelog own {quote(owner_group)} {quote(resource)}) and pass "
                f"--fence {quote(f'{owner_group}:{resource}:GENERATION')}",
            )
