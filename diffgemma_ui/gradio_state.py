"""Dropping Gradio's own record of a closed browser session.

Gradio keeps one record per session hash in `blocks.state_holder.session_data`: a copy of every component's config
with the last value sent to it (the finished-blocks HTML, the plots' JSON), the components that `gr.update` replaced,
and the session's `gr.State` values. When a tab closes it only marks the record closed and deletes the `gr.State`
values an hour later; the record itself stays until 10,000 sessions (`state_session_capacity`) have come after it.
Measured with `python benchmarks/load_test.py --browser-sessions 50` before this module: the server kept about
0.7 MiB of Python objects (1.7 MiB of RSS) per closed session, without bound (benchmarks/README.md).
"""

from __future__ import annotations

import threading

# How long after a tab closed its record is dropped: every unload handler of the app has run by then (each one
# looks the record up, and would make a fresh one if it were already gone).
DROP_DELAY_S = 5.0


class ClosedSessionDropper:
    """Drops the Gradio record of each closed session `delay_s` seconds after its tab closed.

    Args:
        blocks: the served `gr.Blocks` (its `state_holder` is set when it launches; before that there is nothing
            to drop).
        delay_s: seconds to wait after the unload event (see `DROP_DELAY_S`).

    A queued event of a closed session that starts after the drop makes a fresh, empty record (Gradio's default
    configs, about 0.15 MiB); the app stops a closed session's runs on unload, so such events are rare.
    """

    def __init__(self, blocks, delay_s: float = DROP_DELAY_S):
        self.blocks = blocks
        self.delay_s = delay_s

    def closed(self, session_hash: str) -> None:
        """The tab of `session_hash` closed: drop its record after the delay (in a daemon timer thread)."""
        timer = threading.Timer(self.delay_s, self.drop, args=(session_hash,))
        timer.daemon = True
        timer.start()

    def drop(self, session_hash: str) -> bool:
        """Drop the record of `session_hash` now; returns whether there was one."""
        holder = getattr(self.blocks, "state_holder", None)
        if holder is None:
            return False
        with holder.lock:
            record = holder.session_data.pop(session_hash, None)
            holder.time_last_used.pop(session_hash, None)
        return record is not None
