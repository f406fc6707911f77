"""The automations `ragpipe deploy --notify BLOCK` installs: a message through one of the
team's notification blocks (Slack, Teams, e-mail, a webhook, ...) when the index gate holds
a new version and when an eval-compare regression gate fails.

The events are ragpipe's (``flows/events.py``); each automation matches one index (its
resource id) and is named after what it reports, the index and the block; deploying
again replaces it (no duplicates).
"""

from __future__ import annotations

from dataclasses import dataclass

from flows.events import EVAL_GATE_FAILED_EVENT, HELD_EVENT, index_resource
from ragpipe.config import RagpipeConfig
from ragpipe.errors import ConfigError


@dataclass(frozen=True)
class Notice:
    title: str
    event: str
    subject: str
    body: str


# Jinja templates, rendered by the Prefect server with the event that fired.
NOTICES = (
    Notice(
        "ragpipe: index version held",
        HELD_EVENT,
        "ragpipe held index version {{ event.payload.version[:12] }}",
        "{{ event.payload.summary }}\n"
        "Index: {{ event.resource.name }}\n"
        "Readers keep version {{ (event.payload.live_before or 'none')[:12] }}.\n"
        "Why: {{ event.payload.reasons | join('; ') }}\n"
        "Inspect: ragpipe index list; ragpipe search --version "
        "{{ event.payload.version[:12] }} (config {{ event.payload.config_path }})\n"
        "Then: ragpipe index promote {{ event.payload.version[:12] }}, or ragpipe index "
        "discard {{ event.payload.version[:12] }}\n"
        "{% if event.payload.reports_url %}Reports: {{ event.payload.reports_url }}{% endif %}",
    ),
    Notice(
        "ragpipe: eval gate failed",
        EVAL_GATE_FAILED_EVENT,
        "ragpipe eval compare: the regression gate failed",
        "Index: {{ event.resource.name }}\n"
        "{{ event.payload.failures | join('\\n') }}\n"
        "Report: {{ event.payload.report }}",
    ),
)


def install_notifications(config: RagpipeConfig, block: str) -> list[str]:
    """Create (or replace) one automation per notice for ``config``'s index, sending
    through ``block`` ("BLOCK_TYPE_SLUG/NAME", e.g. "slack-webhook/ops"); returns their
    names (which carry the index's resource id, so each index has its own).

    Raises:
        ConfigError: the block is malformed or not on the Prefect server.
    """
    from prefect.client.orchestration import get_client
    from prefect.events.actions import SendNotification
    from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture
    from prefect.events.schemas.events import ResourceSpecification
    from prefect.exceptions import ObjectNotFound

    slug, _, name = block.partition("/")
    if not slug or not name:
        raise ConfigError(
            f"--notify {block!r}: name a notification block as BLOCK_TYPE/NAME, e.g. "
            "slack-webhook/ops (see `prefect block ls`)"
        )
    with get_client(sync_client=True) as client:
        try:
            document = client.read_block_document_by_name(name=name, block_type_slug=slug)
        except ObjectNotFound as exc:
            raise ConfigError(
                f"--notify {block}: no such block on the Prefect server; create it first (UI: "
                "Blocks, or `prefect block create " + slug + "`)"
            ) from exc
    resource = index_resource(config)
    installed = []
    with get_client(sync_client=True) as client:
        for notice in NOTICES:
            title = f"{notice.title} ({resource['prefect.resource.id']}) -> {block}"
            for existing in client.read_automations_by_name(title):
                client.delete_automation(existing.id)
            client.create_automation(AutomationCore(
                name=title,
                description=(f"Installed by `ragpipe deploy --notify {block}`: on {notice.event} "
                             f"for the index {resource['prefect.resource.name']}."),
                trigger=EventTrigger(
                    expect={notice.event},
                    match=ResourceSpecification(
                        {"prefect.resource.id": resource["prefect.resource.id"]}
                    ),
                    posture=Posture.Reactive,
                    threshold=1,
                ),
                actions=[SendNotification(
                    block_document_id=document.id, subject=notice.subject, body=notice.body)],
            ))  # fmt: skip
            installed.append(title)
    return installed
