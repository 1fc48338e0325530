"""Flow ``refresh-freshness`` (flows/refresh.py): run on its schedule against a live store, it
re-signs the freshness head over every history's head, so a store readers would refuse as
stale (``K3A_NOW`` past its lifetime) is read again."""

from __future__ import annotations

from datetime import timedelta

import pytest

from flows.refresh import refresh_freshness
from k3artifacts.errors import StaleStore
from k3artifacts.policy.freshness import KEY, Freshness
from k3artifacts.policy.record import in_force
from k3artifacts.trust.envelope import parse_record
from tests.fixtures.channel_moves import CHANNEL


@pytest.mark.parametrize("any_store", ["file"], indirect=True)
def test_a_scheduled_refresh_keeps_a_live_store_readable(any_store, served, monkeypatch):
    before = Freshness.model_validate(parse_record(any_store.read(KEY).data, key=KEY).body)
    later = before.expires + timedelta(hours=1)
    monkeypatch.setenv("K3A_NOW", later.isoformat())
    with pytest.raises(StaleStore):
        in_force(any_store)
    until = refresh_freshness(store_url=any_store.url)
    after = Freshness.model_validate(parse_record(any_store.read(KEY).data, key=KEY).body)
    assert after.issued_at == later and until.startswith(f"{after.expires:%Y-%m-%d}")
    assert after.channels[CHANNEL].seq == 3
    assert in_force(any_store).freshness == after
