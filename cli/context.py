"""The global options and the one client a command uses, opened on first use."""

from __future__ import annotations

from dataclasses import dataclass, field

import click

from broker.client.client import Client, connect
from broker.types import Durability


@dataclass
class State:
    broker: str
    durability: Durability
    token: str | None = None
    _client: Client | None = field(default=None, repr=False)

    def client(self) -> Client:
        if self._client is None:
            self._client = connect(self.broker, durability=self.durability, token=self.token)
            click.get_current_context().call_on_close(self._client.close)
        return self._client


def state() -> State:
    obj = click.get_current_context().find_object(State)
    assert obj is not None, "the root callback sets State"
    return obj
