"""A closed tab's session is released, Gradio's own record of it included (issue 13 item 11).

Gradio keeps, per session hash, the last value of every component and the components `gr.update` replaced; on its
own it would keep a closed tab's record until 10,000 later sessions had come (`diffgemma_ui.runs.Runner.drop_closed`).
The memory figure for 50 browser visitors is measured by `python -m benchmarks.browser sessions --sessions 50`.
"""

from __future__ import annotations

import json
import os
import time

import pytest

from benchmarks import browser as browser_bench
from diffgemma_ui.runs import DROP_DELAY_S
from pages import open_page, run_raw

pytestmark = pytest.mark.slow


def wait_until(condition, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def final_feed(value) -> bool:
    """Whether `value` is a Playground feed message with a run's final frames (the last the page was sent)."""
    try:
        message = json.loads(value)
    except (TypeError, ValueError):
        return False
    return isinstance(message, dict) and message.get("final") is True and bool(message.get("frames"))


def short_run(page) -> None:
    """One run of one canvas and two forwards, to its final frame."""
    run_raw(page, "And", tokens=64, steps=2)


def test_closing_a_tab_drops_its_gradio_record_and_keeps_the_open_ones(served_app, browser, monkeypatch):
    app, url = served_app
    holder = app.state_holder
    assert app.hub.runs.blocks is app
    before = set(holder.session_data)
    closing, problems = open_page(browser, url)
    short_run(closing)
    closing_hash = set(holder.session_data) - before
    staying, _ = open_page(browser, url)
    short_run(staying)
    staying_hash = set(holder.session_data) - before - closing_hash
    assert len(closing_hash) == 1 and len(staying_hash) == 1, (closing_hash, staying_hash)
    (closing_hash,), (staying_hash,) = closing_hash, staying_hash
    record = holder.session_data[closing_hash]
    assert any(final_feed((c.get("props") or {}).get("value")) for c in record.config_values.values()), \
        "the record of a finished run holds its last views (the feed's final message)"
    runs = app.hub.runs
    drops = []  # (session hash, whether it had a record): other tests' closed tabs may be dropped meanwhile
    original_drop = runs.drop_closed

    def recording_drop(session_hash: str) -> bool:
        had_record = original_drop(session_hash)
        drops.append((session_hash, had_record))
        return had_record

    monkeypatch.setattr(runs, "drop_closed", recording_drop)

    closing.close()
    assert wait_until(lambda: (closing_hash, True) in drops, DROP_DELAY_S + 15), \
        "the app's dropper did not drop the closed tab's record"
    assert closing_hash not in holder.session_data, "Gradio's record of the closed tab was kept"
    assert closing_hash not in app.hub.sessions
    assert staying_hash in holder.session_data  # an open tab keeps its record
    short_run(staying)  # and keeps working
    assert staying_hash in holder.session_data
    assert not problems
    staying.close()


def test_the_browser_sessions_benchmark_drives_tabs_and_reads_the_servers_memory(served_app):
    """`python -m benchmarks.browser sessions` in process, small: every visitor's run finishes and every reading is
    taken (the served app runs in this process, so its memory is this process's)."""
    bench = browser_bench
    rss, anon = bench.read_memory_mib(os.getpid())
    assert 0 < anon < rss
    with pytest.raises(ValueError, match="at least 1"):
        bench.browser_sessions(served_app[1], os.getpid(), sessions=0)
    lines = []
    report = bench.browser_sessions(served_app[1], os.getpid(), sessions=2, concurrent=2, every=1, settle_s=0.5,
                                    log=lines.append)
    assert report.failures == [] and len(report.run_seconds) == 2
    assert [p.sessions for p in report.points] == [0, 0, 1, 2, 2]
    base, final = report.points[1], report.points[-1]
    table = bench.format_sessions(report)
    assert f"{(final.rss_mib - base.rss_mib) / 2:+.2f} MiB RSS" in table and "completed 2, failed 0" in table
    assert len(lines) == len(report.points)
