"""Whether the client of the Gradio job being served is still there, from inside its handler.

Gradio marks a job `alive = False` when its client goes away: the result stream closed (a REST caller dropped
`GET /gradio_api/call/<api>/<event_id>`, a `gradio_client` process died or closed its `/queue/data` stream: the
stream's handler calls `Queue.clean_events` for the session), but it only checks that flag between two outputs of a
generator, so a handler that returns one result at the end (`/generate`) would run on to the end for nobody. A run
that polls `job_alive()` stops within one poll of the flag flipping. Reads Gradio's queue (`LocalContext.event_id`,
`Queue.event_ids_to_events`, `Event.alive`; gradio 6.31); outside a queued job it always answers True.
"""

from __future__ import annotations

from collections.abc import Callable


def job_alive_check() -> Callable[[], bool]:
    """A function answering whether the current Gradio job's client is still there (call it in the handler's own
    context, where Gradio set the job's event id; the returned function may be called from anywhere)."""
    from gradio.context import LocalContext  # noqa: PLC0415 - only where Gradio serves

    blocks = LocalContext.blocks.get(None)
    event_id = LocalContext.event_id.get(None)
    queue = getattr(blocks, "_queue", None)
    if queue is None or event_id is None:
        return lambda: True

    def alive() -> bool:
        event = queue.event_ids_to_events.get(event_id)
        return event is None or bool(getattr(event, "alive", True))

    return alive
