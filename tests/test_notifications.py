"""The notification vocabulary against Prefect's own models: each notification is a valid
Prefect event, and the README's automation (read from README.md) parses as an automation whose
trigger covers exactly these events and whose message template renders."""

from __future__ import annotations

import uuid

import pytest
import yaml

from k3artifacts.errors import Refusal, ReleaseRefused
from k3artifacts.reporting import events
from tests.conftest import REPO_ROOT

COMMIT = "0123456789abcdef0123456789abcdef01234567"
MARKER = "<!-- k3a:automation"


def all_notifications() -> list[events.Notification]:
    refused = ReleaseRefused([Refusal("w.pkl", "pickle", "pickle-family weights can run code")])
    return [
        events.upstream_revision_found("moonshotai/Kimi-K3", "main", COMMIT),
        events.revision_published(
            "moonshotai/Kimi-K3", COMMIT, manifest_digest="ab" * 32, location="s3://b/k3a/x",
            files=63, total_bytes=1_560_000_000_000, remote_code=["modeling_kimi_k3.py"],
        ),
        events.revision_refused("moonshotai/Kimi-K3", COMMIT, refused),
        events.promotion_blocked("k3t-" + "a" * 24, "production",
                                 {"evaluation": "pass rate 0.91 < 0.95"}, requested_by="alice"),
    ]


def readme_automation() -> dict:
    text = (REPO_ROOT / "README.md").read_text()
    after = text[text.index(MARKER):]
    start = after.index("```yaml\n") + len("```yaml\n")
    doc = yaml.safe_load(after[start:after.index("```", start)])
    # The placeholder the reader replaces with the id `prefect block inspect` prints.
    doc["actions"][0]["block_document_id"] = str(uuid.uuid4())
    return doc


def received_event(model, name, resource, payload):
    """An event as Prefect's server holds it once received (what triggers are matched on)."""
    from datetime import UTC, datetime

    return model(event=name, resource=resource, payload=payload, id=uuid.uuid4(),
                 occurred=datetime.now(UTC)).receive()


def test_every_notification_is_a_prefect_event():
    from prefect.events import Event

    notes = all_notifications()
    assert [n.event for n in notes] == list(events.EVENTS)
    for n in notes:
        event = Event(event=n.event, resource=n.resource, payload=n.payload)
        assert event.resource.id.startswith("k3a.")
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
    for n in all_notifications():
        received = received_event(ServerEvent, n.event, n.resource, n.payload)
        assert trigger.covers(received), n.event
        body = render_user_template_sync(action.body, {"event": received})
        assert n.event in body and n.resource["prefect.resource.name"] in body
    other = received_event(ServerEvent, "prefect.flow-run.Completed",
                           {"prefect.resource.id": "prefect.flow-run.x"}, {})
    assert not trigger.covers(other)


@pytest.mark.parametrize("name", events.EVENTS)
def test_event_names_are_namespaced(name):
    assert name.startswith("k3a.") and name == name.lower()
