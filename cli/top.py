"""fencelog top: a live view of the broker, embedded or served.

Every --interval it takes a snapshot through the client (status, consumer groups,
sessions, ownership, each topic's producer access, open transactions) and shows one
pane of it with rich's Live on the terminal's alternate screen. Keys, read from the
terminal in cbreak mode: 1-6 pick a pane, tab and shift-tab (or the arrows) cycle, q
quits; Ctrl-C and SIGTERM quit as well, all with exit 0.

Rates come from two successive snapshots, over the time between them: a topic's
produce rate from its end offsets, its consume rate from its consumer groups'
committed offsets moving forward (a group's first commit, a rewind, or a topic deleted
and created again counts as no movement). A group's lag on a partition is the end
offset minus its committed offset.

`--once` prints one snapshot and exits: tables, or with --json ONE JSON object on one
line (its fields: `snapshot_dict`). Its rates are measured over --interval (a second
snapshot taken that long after the first); `--interval 0` prints at once, rates null.
`--json` without --once prints one such object per interval until interrupted.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import termios
import time
import tty
from collections.abc import Callable, Iterator, Sequence
from types import FrameType
from typing import TYPE_CHECKING, Annotated, Any, Final, NamedTuple, TextIO

import typer
from msgspec import Struct

from broker.client.client import Client
from broker.errors import BrokerError, ErrorCode
from broker.rows import GroupOffsetRow
from broker.types import AccessInfo, BrokerStatus, OwnershipInfo, SessionInfo, TxnInfo
from cli.context import state
from cli.formats import parse_duration
from cli.options import JsonFlag
from cli.output import Output
from cli.topic import access_dict, topic_dict
from cli.txn import txn_dict

if TYPE_CHECKING:
    from rich.console import RenderableType

INTERVAL_MIN_S: Final = 0.1  # the live view's fastest refresh
INTERVAL_MAX_S: Final = 3600.0
TOPICS_ACCESS_MAX: Final = 200  # topics whose producers a snapshot asks about
ROWS_SHOWN_MAX: Final = 200  # rows of one table on the screen (rich crops to its height)


# snapshots and rates ------------------------------------------------------------------


class Snapshot(Struct, frozen=True):
    taken_s: float  # time.monotonic() when it was taken
    time_ms: int  # the wall clock then
    status: BrokerStatus
    groups: list[GroupOffsetRow]
    sessions: list[SessionInfo]
    owners: list[OwnershipInfo]
    access: dict[str, AccessInfo]
    txns: list[TxnInfo]

    def end_offset(self, topic: str, partition: int) -> int | None:
        for info in self.status.topics:
            if info.name == topic:
                for part in info.partition_details:
                    if part.partition == partition:
                        return part.end_offset
        return None


def take(client: Client) -> Snapshot:
    status = client.status()
    access: dict[str, AccessInfo] = {}
    for info in status.topics[:TOPICS_ACCESS_MAX]:
        with contextlib.suppress(BrokerError):  # deleted since: it is gone from the next one
            access[info.name] = client.topic_access(info.name)
    return Snapshot(
        taken_s=time.monotonic(),
        time_ms=time.time_ns() // 1_000_000,
        status=status,
        groups=client.consumer_groups(),
        sessions=client.sessions(),
        owners=client.ownership(),
        access=access,
        txns=client.txn_list(),
    )


class Rate(NamedTuple):
    produce_per_s: float
    consume_per_s: float


def rates(before: Snapshot | None, now: Snapshot) -> dict[str, Rate] | None:
    """Each topic's records per second between two snapshots; None without a before."""
    if before is None or now.taken_s <= before.taken_s:
        return None
    elapsed_s = now.taken_s - before.taken_s
    earlier = {t.name: t for t in before.status.topics}
    committed = {(r.group, r.topic, r.partition): r.next_offset for r in before.groups}
    consumed: dict[str, int] = {}
    for row in now.groups:
        previous = committed.get((row.group, row.topic, row.partition))
        if previous is not None:
            consumed[row.topic] = consumed.get(row.topic, 0) + max(0, row.next_offset - previous)
    found = {}
    for info in now.status.topics:
        was = earlier.get(info.name)
        same = was is not None and was.created_ms == info.created_ms
        produced = max(0, _ends(info) - _ends(was)) if same and was is not None else 0
        found[info.name] = Rate(produced / elapsed_s, consumed.get(info.name, 0) / elapsed_s)
    return found


def _ends(info: Any) -> int:
    return sum(p.end_offset for p in info.partition_details)


def lag_rows(snapshot: Snapshot) -> list[tuple[GroupOffsetRow, int | None, int | None]]:
    """(committed row, end offset, lag) of every group's partition."""
    found = []
    for row in snapshot.groups:
        end = snapshot.end_offset(row.topic, row.partition)
        found.append((row, end, None if end is None else max(0, end - row.next_offset)))
    return found


# JSON --------------------------------------------------------------------------------


def snapshot_dict(
    snapshot: Snapshot, found: dict[str, Rate] | None, interval_s: float | None
) -> dict[str, Any]:
    """The one JSON object of a snapshot (`--once --json`, or a line per interval)."""
    status = snapshot.status
    topics = []
    for info in status.topics:
        rate = None if found is None else found.get(info.name)
        entry = topic_dict(info, partitions=True)
        entry["produce_per_s"] = None if rate is None else round(rate.produce_per_s, 3)
        entry["consume_per_s"] = None if rate is None else round(rate.consume_per_s, 3)
        topics.append(entry)
    return {
        "time_ms": snapshot.time_ms,
        "data_dir": status.data_dir,
        "database_bytes": status.database_bytes,
        "wal_bytes": status.wal_bytes,
        "rate_interval_s": interval_s if found is not None else None,
        "topics": topics,
        "groups": [
            {
                "group": row.group,
                "topic": row.topic,
                "partition": row.partition,
                "committed_offset": row.next_offset,
                "end_offset": end,
                "lag": lag,
                "committed_ms": row.committed_ms,
            }
            for row, end, lag in lag_rows(snapshot)
        ],
        "sessions": [
            {
                "session": s.session_id,
                "kind": s.kind,
                "pid": s.pid,
                "live": s.live,
                "severed": s.severed,
                "started_ms": s.started_ms,
                "heartbeat_ms": s.heartbeat_ms,
            }
            for s in snapshot.sessions
        ],
        "owners": [
            {
                "group": o.group,
                "resource": o.resource,
                "generation": o.generation,
                "holder": o.holder,
                "live": o.holder_live,
                "claimed_ms": o.claimed_ms,
            }
            for o in snapshot.owners
        ],
        "producers": [
            {"topic": topic, **access_dict(access)} for topic, access in snapshot.access.items()
        ],
        "transactions": [txn_dict(info) for info in snapshot.txns],
    }


# panes -------------------------------------------------------------------------------


class Table(NamedTuple):
    title: str
    columns: Sequence[str]
    rows: Sequence[Sequence[Any]]


def _per_s(found: dict[str, Rate] | None, topic: str, *, consume: bool) -> str:
    if found is None or topic not in found:
        return "-"
    rate = found[topic]
    return f"{rate.consume_per_s if consume else rate.produce_per_s:.1f}"


def _ago(now_ms: int, then_ms: int | None) -> str:
    return "" if then_ms is None else f"{max(0, now_ms - then_ms) / 1000:.1f}s"


def topics_pane(snapshot: Snapshot, found: dict[str, Rate] | None) -> list[Table]:
    topics = [
        (
            t.name,
            t.partitions,
            t.records,
            t.bytes,
            _per_s(found, t.name, consume=False),
            _per_s(found, t.name, consume=True),
        )
        for t in snapshot.status.topics
    ]
    partitions = [
        (t.name, p.partition, p.end_offset, p.records, p.bytes)
        for t in snapshot.status.topics
        for p in t.partition_details
    ]
    return [
        Table(
            "topics",
            ["topic", "partitions", "records", "bytes", "produce/s", "consume/s"],
            topics,
        ),
        Table("partitions", ["topic", "partition", "end offset", "records", "bytes"], partitions),
    ]


def groups_pane(snapshot: Snapshot, found: dict[str, Rate] | None) -> list[Table]:
    rows = [
        (row.group, row.topic, row.partition, row.next_offset, end, lag)
        for row, end, lag in lag_rows(snapshot)
    ]
    columns = ["group", "topic", "partition", "committed", "end offset", "lag"]
    return [Table("consumer groups", columns, rows)]


def sessions_pane(snapshot: Snapshot, found: dict[str, Rate] | None) -> list[Table]:
    now_ms = snapshot.time_ms
    rows = [
        (s.session_id, s.kind, s.pid, _yes(s.live), _yes(s.severed), _ago(now_ms, s.heartbeat_ms))
        for s in snapshot.sessions
    ]
    columns = ["session", "kind", "pid", "live", "severed", "last beat"]
    return [Table("sessions", columns, rows)]


def owners_pane(snapshot: Snapshot, found: dict[str, Rate] | None) -> list[Table]:
    rows = [
        (o.group, o.resource, o.generation, o.holder or "", _yes(o.holder_live))
        for o in snapshot.owners
    ]
    return [Table("owners", ["group", "resource", "generation", "holder", "live"], rows)]


def producers_pane(snapshot: Snapshot, found: dict[str, Rate] | None) -> list[Table]:
    rows = []
    for topic, access in snapshot.access.items():
        exclusive = access.exclusive
        holder = "" if exclusive is None else f"{exclusive.name} ({exclusive.session_id})"
        waiting = ", ".join(a.name for a in access.waiting)
        rows.append((topic, access.mode, access.epoch, holder, len(access.shared), waiting))
    columns = ["topic", "mode", "epoch", "exclusive", "shared", "waiting"]
    return [Table("producers", columns, rows)]


def txns_pane(snapshot: Snapshot, found: dict[str, Rate] | None) -> list[Table]:
    rows = [
        (t.txn_id, t.group, t.key or "", t.state, f"{t.age_ms / 1000:.1f}s", t.records)
        for t in snapshot.txns
    ]
    columns = ["txn", "group", "key", "state", "age", "records"]
    return [Table("transactions", columns, rows)]


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


Pane = Callable[[Snapshot, "dict[str, Rate] | None"], list[Table]]
PANES: Final[tuple[tuple[str, Pane], ...]] = (
    ("topics", topics_pane),
    ("groups", groups_pane),
    ("sessions", sessions_pane),
    ("owners", owners_pane),
    ("producers", producers_pane),
    ("transactions", txns_pane),
)


# keys --------------------------------------------------------------------------------

QUIT: Final = "quit"
_SEQUENCES: Final = {"\t": 1, "\x1b[C": 1, "\x1b[Z": -1, "\x1b[D": -1}


def next_pane(pane: int, key: str) -> int | str:
    """The pane a key leads to, or QUIT."""
    if key in ("q", "Q"):
        return QUIT
    if len(key) == 1 and key.isdigit() and 1 <= int(key) <= len(PANES):
        return int(key) - 1
    return (pane + _SEQUENCES.get(key, 0)) % len(PANES)


def split_keys(text: str) -> list[str]:
    """Keys in what one read of the terminal gave: escape sequences kept whole."""
    keys = []
    while text:
        known = next((s for s in _SEQUENCES if len(s) > 1 and text.startswith(s)), None)
        size = len(known) if known else 1
        keys.append(text[:size])
        text = text[size:]
    return keys


class _Keys:
    """The terminal's keys, one read at a time, in cbreak mode while the view runs
    (no keys when stdin is no terminal: then only Ctrl-C or SIGTERM stops it)."""

    def __init__(self, stream: TextIO) -> None:
        self.fd = stream.fileno() if stream.isatty() else None
        self._saved: list[Any] | None = None

    def __enter__(self) -> _Keys:
        if self.fd is not None:
            self._saved = termios.tcgetattr(self.fd)
            tty.setcbreak(self.fd)
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.fd is not None and self._saved is not None:
            termios.tcsetattr(self.fd, termios.TCSADRAIN, self._saved)

    def read(self, timeout_s: float) -> list[str]:
        if self.fd is None:
            time.sleep(timeout_s)
            return []
        ready, _, _ = select.select([self.fd], [], [], timeout_s)
        if not ready:
            return []
        data = os.read(self.fd, 64)
        if not data:  # the terminal went away
            return ["q"]
        return split_keys(data.decode("utf-8", "replace"))


# the command --------------------------------------------------------------------------


def top(
    interval: Annotated[
        str,
        typer.Option(
            "--interval",
            "-n",
            help="How often to take a snapshot (also the time rates are measured over): "
            "e.g. 500ms, 2s. With --once, 0 prints at once without rates.",
            metavar="DURATION",
        ),
    ] = "1s",
    once: Annotated[
        bool,
        typer.Option("--once", help="Print one snapshot and exit (for scripts)."),
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """A live view of the broker on a terminal, or one snapshot (--once).

    Panes: 1 topics with produce and consume rates, and partitions' end offsets and
    sizes; 2 consumer groups and lag per partition; 3 sessions; 4 owners with
    generations; 5 exclusive producers and waiters; 6 open transactions and their age.
    Keys: 1-6 or tab / shift-tab switch panes, q quits (exit 0).

    --once prints one snapshot and exits; with --json it is one JSON object on one
    line. --json alone prints one such line per interval until Ctrl-C.
    """
    interval_s = _interval(interval, once)
    if not once and not as_json and not sys.stdout.isatty():
        raise BrokerError(
            ErrorCode.INVALID_ARGUMENT,
            "the live view needs a terminal on stdout",
            hint="use --once (tables or --json) or --json (a line per interval) in scripts",
        )
    client = state().client()
    with _stopped_by_sigterm():
        try:
            if once:
                _print_once(client, interval_s, as_json)
            elif as_json:
                _print_lines(client, interval_s)
            else:
                _live(client, interval_s)
        except KeyboardInterrupt:
            pass


def _interval(text: str, once: bool) -> float:
    interval_s = parse_duration(text)
    low_s = 0.0 if once else INTERVAL_MIN_S
    if not low_s <= interval_s <= INTERVAL_MAX_S:
        raise BrokerError(
            ErrorCode.INVALID_ARGUMENT,
            f"--interval {text} is outside {low_s:g}s..{INTERVAL_MAX_S:g}s",
            hint="e.g. --interval 1s (0 only with --once: a snapshot without rates)",
        )
    return interval_s


@contextlib.contextmanager
def _stopped_by_sigterm() -> Iterator[None]:
    def interrupt(_signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _print_once(client: Client, interval_s: float, as_json: bool) -> None:
    first = take(client)
    snapshot, found = first, None
    if interval_s > 0:
        time.sleep(interval_s)
        snapshot = take(client)
        found = rates(first, snapshot)
    out = Output(as_json)
    if as_json:
        out.json(snapshot_dict(snapshot, found, interval_s))
        return
    for _name, pane in PANES:
        for table in pane(snapshot, found):
            out.table(table.title, table.columns, table.rows)


def _print_lines(client: Client, interval_s: float) -> None:
    out = Output(True)
    before: Snapshot | None = None
    while True:
        snapshot = take(client)
        out.json(snapshot_dict(snapshot, rates(before, snapshot), interval_s))
        out.flush()
        before = snapshot
        time.sleep(max(0.0, snapshot.taken_s + interval_s - time.monotonic()))


def _live(client: Client, interval_s: float) -> None:
    from rich.console import Console
    from rich.live import Live

    pane = 0
    snapshot = take(client)
    found: dict[str, Rate] | None = None
    due_s = snapshot.taken_s + interval_s
    target = state().broker
    with (
        _Keys(sys.stdin) as keys,
        Live(console=Console(), screen=True, auto_refresh=False) as live,
    ):
        while True:
            live.update(render(target, snapshot, found, pane, interval_s), refresh=True)
            pressed = keys.read(max(0.0, due_s - time.monotonic()))
            for key in pressed:
                chosen = next_pane(pane, key)
                if chosen == QUIT:
                    return
                assert isinstance(chosen, int)
                pane = chosen
            if time.monotonic() >= due_s:
                before, snapshot = snapshot, take(client)
                found = rates(before, snapshot)
                due_s = max(due_s + interval_s, time.monotonic())


def render(
    target: str, snapshot: Snapshot, found: dict[str, Rate] | None, pane: int, interval_s: float
) -> RenderableType:
    """The screen: a header, the pane bar, the pane's tables, the keys."""
    from rich.console import Group
    from rich.table import Table as RichTable
    from rich.text import Text

    clock = time.strftime("%H:%M:%S", time.localtime(snapshot.time_ms / 1000))
    header = Text(f"fencelog top  {target}  {clock}  every {interval_s:g}s", style="bold")
    header.append("   1-6 or tab: switch pane  q: quit", style="dim")
    bar = Text()
    for number, (name, _) in enumerate(PANES, start=1):
        bar.append(f" {number} {name} ", style="reverse" if number - 1 == pane else "")
    parts: list[RenderableType] = [header, bar]
    for table in PANES[pane][1](snapshot, found):
        shown = RichTable(title=table.title, expand=False)
        for column in table.columns:
            shown.add_column(column)
        for row in table.rows[:ROWS_SHOWN_MAX]:
            shown.add_row(*("" if cell is None else str(cell) for cell in row))
        if not table.rows:
            parts.append(Text(f"{table.title}: none"))
            continue
        parts.append(shown)
    return Group(*parts)
