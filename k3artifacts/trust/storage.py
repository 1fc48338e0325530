"""What the trust primitives need of a store: small records read, listed, created once and
compared-and-swapped. :class:`k3artifacts.stores.base.Store` is one; so is anything else with
these four methods (the primitives never ask what kind of store it is)."""

from __future__ import annotations

from typing import Protocol


class Found(Protocol):
    data: bytes
    token: str


class RecordReader(Protocol):
    url: str

    def read(self, key: str) -> Found | None: ...

    def list_keys(self, prefix: str) -> list[str]: ...


class RecordStore(RecordReader, Protocol):
    def create(self, key: str, data: bytes) -> None: ...

    def replace(self, key: str, data: bytes, expected: str | None) -> str: ...
