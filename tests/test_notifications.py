"""Notifications for real: the flows emit the pipeline's events on a Prefect API, they are read
back from that API, and the automation of docs/guides/prefect.md, created on the same
server with a ``custom-webhook`` block, posts each one to a receiver on 127.0.0.1.

Also against Prefect's own models: each notification is a valid Prefect event, and the
guide's trigger covers exactly these events."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import yaml

from k3artifacts.errors import Refusal, ReleaseRefused
from k3artifacts.policy.actor import os_account
from k3artifacts.reporting import events
from k3artifacts.stores.file import FileStore
from tests.conftest import REPO_ROOT
from tests.fixtures.moves import promote, use_policy
from tests.flow_helpers import run_answered
from tests.staging_helpers import REPO, small_release
from tests.support.hubfaults import Fault
from tests.support.ports import free_ports
from tests.support.waiting import wait_until

COMMIT = "0123456789abcdef0123456789abcdef01234567"
MARKER = "<!-- k3a:automation"
SHARD = "model-00001-of-00002.safetensors"
FAST = {"attempts": 2, "backoff": 0.01, "task_retries": 1, "task_retry_delay": 0}
#: How long an event may take from the flow to the server's store, and on to the webhook.
DELIVERY_S = 90.0


def all_notifications() -> list[events.Notification]:
    refused = ReleaseRefused([Refusal("w.pkl", "pickle", "pickle-family weights can run code")])
    tuple_id = "k3t-" + "a" * 24
    return [
        events.upstream_revision_found("moonshotai/Kimi-K3", "main", COMMIT),
        events.revision_published(
            "moonshotai/Kimi-K3", COMMIT, manifest_digest="ab" * 32, location="s3://b/k3a/x",
            files=63, total_bytes=1_560_000_000_000, remote_code=["modeling_kimi_k3.py"],
            tuple_id=tuple_id,
        ),
        events.revision_refused("moonshotai/Kimi-K3", COMMIT, refused),
        events.promotion_blocked(tuple_id, "production",
                                 {"evaluation": "pass rate 0.91 < 0.95"}, requested_by="alice"),
        events.channel_promoted("production", tuple_id, previous_tuple_id=None, seq=1,
                                who="alice", why="nightly"),
        events.channel_rolled_back("production", tuple_id, previous_tuple_id="k3t-" + "b" * 24,
                                   seq=2, who="oncall", why="p99"),
        events.readiness_failed(tuple_id, "production", endpoint="http://canary:8000/v1",
                                kind="smoke", failed={"models": "serves k3t-..."},
                                report_sha256="cd" * 32),
    ]


def readme_automation(block_document_id: str | None = None) -> dict:
    text = (REPO_ROOT / "docs" / "guides" / "prefect.md").read_text()
    after = text[text.index(MARKER):]
    start = after.index("```yaml\n") + len("```yaml\n")
    doc = yaml.safe_load(after[start:after.index("```", start)])
    # The placeholder the reader replaces with the id `prefect block inspect` prints.
    doc["actions"][0]["block_document_id"] = block_document_id or str(uuid.uuid4())
    return doc


def received_event(model, name, resource, payload, related=()):
    """An event as Prefect's server holds it once received (what triggers are matched on)."""
    return model(event=name, resource=resource, payload=payload, related=list(related),
                 id=uuid.uuid4(), occurred=datetime.now(UTC)).receive()


def test_every_notification_is_a_prefect_event():
    from prefect.events import Event

    notes = all_notifications()
    assert [n.event for n in notes] == list(events.EVENTS)
    for n in notes:
        event = Event(event=n.event, resource=n.resource, payload=n.payload, related=n.related)
        assert event.resource.id.startswith("k3a.")
        assert all(r.id.startswith("k3a.") and r.role for r in event.related)
    refused = notes[2].payload
    assert refused["rules"] == ["pickle"] and refused["why"][0].startswith("w.pkl: [pickle]")


def test_readme_automation_covers_the_events_and_renders():
    from prefect.events.schemas.automations import AutomationCore
    from prefect.server.events.schemas.automations import EventTrigger as ServerTrigger
    from prefect.server.events.schemas.events import Event as ServerEvent
    from prefect.server.utilities.user_templates import render_user_template_sync

    automation = AutomationCore.model_validate(readme_automation())
    trigger = ServerTrigger.model_validate(automation.trigger.model_dump())
    action = automation.actions[0]
    assert action.type == "send-notification"
    assert set(trigger.expect) == set(events.EVENTS)
    for n in all_notifications():
        received = received_event(ServerEvent, n.event, n.resource, n.payload, n.related)
        assert trigger.covers(received), n.event
        body = render_user_template_sync(action.body, {"event": received})
        assert n.event in body and n.resource["prefect.resource.name"] in body
    other = received_event(ServerEvent, "prefect.flow-run.Completed",
                           {"prefect.resource.id": "prefect.flow-run.x"}, {})
    assert not trigger.covers(other)


@pytest.mark.parametrize("name", events.EVENTS)
def test_event_names_are_namespaced(name):
    assert name.startswith("k3a.") and name == name.lower()


# -- emitted by the flows, read back from Prefect's API -------------------------------------


class Receiver:
    """A webhook receiver on 127.0.0.1: keeps every JSON body POSTed to it."""

    def __init__(self) -> None:
        (port,) = free_ports(1)
        self.url = f"http://127.0.0.1:{port}/hook"
        self.bodies: list[dict[str, Any]] = []
        received = self.bodies

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - stdlib's name
                data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                received.append(json.loads(data))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def subjects(self) -> list[str]:
        return [b["subject"] for b in self.bodies]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def store(tmp_path) -> FileStore:
    return FileStore(tmp_path / "store")


def delivered(found: Callable[[], Any], what: str) -> Any:
    """Delivery is asynchronous (the client's events worker, the server's persister, then its
    triggers and actions): wait for ``found``, as long as a loaded machine may need."""
    return wait_until(found, what, timeout=DELIVERY_S, interval=0.25)


def read_events(since: datetime, names: list[str]) -> list[Any]:
    from prefect.client.orchestration import get_client
    from prefect.events.filters import EventFilter, EventNameFilter, EventOccurredFilter

    with get_client(sync_client=True) as client:
        page = client.read_events(filter=EventFilter(
            occurred=EventOccurredFilter(since=since, until=datetime.now(UTC) + timedelta(1)),
            event=EventNameFilter(name=names)), limit=50)
    return page.events


def events_by_name(since: datetime, expected: dict[str, Callable[[Any], bool]]
                   ) -> dict[str, Any]:
    """Each expected event name -> the first event read back from the API that matches."""
    def found() -> dict[str, Any] | None:
        got = {}
        for event in read_events(since, list(expected)):
            if event.event not in got and expected[event.event](event):
                got[event.event] = event
        return got if len(got) == len(expected) else None

    return delivered(found, f"events {sorted(expected)} on the Prefect API")


def related(event, role: str) -> list[str]:
    return [r.id for r in event.related if r.role == role]


@pytest.mark.prefect
def test_stage_flow_emits_published_and_refused(prefect_api, local_hub, tmp_path):
    from flows.stage_release import stage_release

    since = datetime.now(UTC) - timedelta(seconds=1)
    good, bad = FileStore(tmp_path / "good"), FileStore(tmp_path / "bad")
    commit = local_hub.hub.add_commit(REPO, small_release(tmp_path))
    params = {"repo_id": REPO, "revision": commit, "endpoint": local_hub.endpoint} | FAST
    staged = stage_release(**params, store_url=good.url, quarantine=str(tmp_path / "q1"),
                           return_state=True)
    assert staged.is_completed(), staged
    local_hub.hub.faults.add(SHARD, Fault.corrupt(offset=4096))
    refused = stage_release(**params, store_url=bad.url, quarantine=str(tmp_path / "q2"),
                            return_state=True)
    assert refused.is_failed()

    revision = f"k3a.revision.{REPO}@{commit}"
    got = events_by_name(since, {
        events.PUBLISHED: lambda e: e.resource.id == revision
        and e.payload["location"].startswith(good.url),
        events.REFUSED: lambda e: e.resource.id == revision,
    })
    published = got[events.PUBLISHED].payload
    assert published["manifest_digest"] == good.read_manifest(REPO, commit).digest()
    assert published["commit"] == commit and published["files"] == len(
        good.read_manifest(REPO, commit).files)
    assert any(line.startswith(f"{SHARD}: ") for line in got[events.REFUSED].payload["why"])


@pytest.mark.prefect
def test_channel_flows_emit_their_events_and_the_readme_automation_posts_them(
        prefect_api, store, releases, policies, reviewed, receiver):
    from prefect.blocks.notifications import CustomWebhookNotificationBlock
    from prefect.client.orchestration import get_client
    from prefect.events import emit_event
    from prefect.events.schemas.automations import AutomationCore

    from flows.promote import promote_release
    from flows.rollback import rollback_channel

    block = CustomWebhookNotificationBlock(
        name="k3a test receiver", url=receiver.url, json_data={"subject": "{{subject}}", "body": "{{body}}"})
    block_id = block.save(f"k3a-test-{uuid.uuid4().hex[:8]}", overwrite=True)
    automation = AutomationCore.model_validate(readme_automation(str(block_id)))
    with get_client(sync_client=True) as client:
        automation_id = client.create_automation(automation)
    try:
        # The server's trigger service loads the new automation on its own schedule: wait until
        # it acts on a marker event (one the guide's trigger expects) before the real ones.
        marker = f"marker-{uuid.uuid4().hex[:8]}"

        last_sent = [0.0]

        def marker_posted() -> bool:
            if any(marker in s for s in receiver.subjects()):
                return True
            if time.monotonic() - last_sent[0] > 2.0:  # a marker every 2 s until one is posted
                last_sent[0] = time.monotonic()
                emit_event(event=events.UPSTREAM_FOUND, resource={
                    "prefect.resource.id": f"k3a.test.{marker}", "prefect.resource.name": marker})
            return False

        delivered(marker_posted, "the guide's automation to post a marker event")

        since = datetime.now(UTC) - timedelta(seconds=1)
        # approval_timeout: a run these tests expect to refuse fails soon if it asks instead.
        use_policy(store, policies)
        params = {"store_url": store.url}
        unreviewed = releases.release()  # reviews before it would cover its license and code
        blocked = promote_release(tuple_id=unreviewed.id, channel="staging", requested_by="ci",
                                  approval_timeout=30, return_state=True, **params)
        assert blocked.is_failed() and blocked.name == "Blocked by gate"
        first, second = releases.release(), releases.release()
        for r in (first, second):
            reviewed(r)
        (dead,) = free_ports(1)
        not_ready = promote_release(tuple_id=first.id, channel="staging", requested_by="ci",
                                    endpoint=f"http://127.0.0.1:{dead}", approval_timeout=30,
                                    return_state=True, **params)
        assert not_ready.is_failed() and not_ready.name == "Blocked by gate"
        promote(store, first.id, "staging", actor="ci", policies_dir=policies)
        moved = run_answered(promote_release, {"decision": "approve", "reviewer": "alice"},
                             tuple_id=second.id, channel="staging", requested_by="ci", **params)
        assert moved.is_completed(), moved
        back = rollback_channel(channel="staging", requested_by="oncall", reason="p99 up",
                                **params)
        assert back["tuple_id"] == first.id

        channel = events.channel_resource_id("staging")
        got = events_by_name(since, {
            events.PROMOTION_BLOCKED: lambda e: e.payload["tuple_id"] == unreviewed.id,
            events.READINESS_FAILED: lambda e: e.payload["tuple_id"] == first.id,
            events.PROMOTED: lambda e: e.payload["tuple_id"] == second.id,
            events.ROLLED_BACK: lambda e: e.payload["tuple_id"] == first.id,
        })
        gates = got[events.PROMOTION_BLOCKED]
        assert gates.resource.id == channel
        assert related(gates, "tuple") == [events.tuple_resource_id(unreviewed.id)]
        assert gates.payload["failed_gates"] and all(gates.payload["failed_gates"].values())
        ready = got[events.READINESS_FAILED]
        assert ready.resource.id == events.tuple_resource_id(first.id)
        assert related(ready, "channel") == [channel]
        assert "unreachable" in ready.payload["failed"]["chat"]
        promoted, rolled = got[events.PROMOTED], got[events.ROLLED_BACK]
        assert promoted.resource.id == rolled.resource.id == channel
        assert related(promoted, "tuple") == [events.tuple_resource_id(second.id)]
        # The mover is the flow's own identity (its process's account), not the typed requester.
        assert (promoted.payload["previous_tuple_id"], promoted.payload["who"]) == (
            first.id, os_account())
        assert (rolled.payload["previous_tuple_id"], rolled.payload["why"]) == (
            second.id, "p99 up")

        # The automation posted each of them to the webhook, rendered from the guide's subject.
        names = {
            events.PROMOTION_BLOCKED: "staging", events.READINESS_FAILED: first.id,
            events.PROMOTED: "staging", events.ROLLED_BACK: "staging"}
        delivered(lambda: all(f"{name}: {resource}" in receiver.subjects()
                              for name, resource in names.items()),
                  "the webhook to receive every channel event")
    finally:
        with get_client(sync_client=True) as client:
            client.delete_automation(automation_id)
