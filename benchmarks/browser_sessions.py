"""Server memory under many browser visitors (issue 13 item 11): RSS of a served app.py while N Chromium tabs each
run one long generation and close.

    python benchmarks/load_test.py --browser-sessions 50                # launches app.py on a free loopback port
    python benchmarks/load_test.py --browser-sessions 50 --concurrent-tabs 3 --settle 30 --keep-tabs

Method: `app.py` (the embedded model unless `--model`) runs as a subprocess; its resident memory is read from
`/proc/<pid>/status` (VmRSS, and RssAnon: the heap, which is what per-session state grows). One warm-up tab runs
first (not counted). Then N visitors, `--concurrent-tabs` at a time, each in a fresh browser context (so a fresh
Gradio session): open the page, set a long run (raw prompt "And", 256 new tokens, 8 denoising steps, adaptive
stopping off, seed = the visitor's number), press Generate, wait for the meter's `data-state="done"`, and close the
tab (Gradio's heartbeat ends and the app's unload handler releases the session). With `--keep-tabs` every tab stays
open until the last run has finished (the memory of N live sessions), then all close.

Reports RSS at the baseline (after the warm-up tab closed and a short settle), after every `--every` finished
visitors, right after the last tab closed, and after `--settle` seconds of idling, and the MiB kept per session:
(settled - baseline) / N. The server's heap also holds allocator free lists, so a rise that stops growing with N is
allocator high-water, not a leak: compare the figure at 10 and at N visitors.
"""

from __future__ import annotations

import asyncio
import functools
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

PROMPT = "And"
RUN = {"Max new tokens": 256, "Max denoising steps": 8}


@dataclass
class MemoryPoint:
    """One reading of the server's memory: what happened before it, and VmRSS and RssAnon in MiB."""

    label: str
    sessions: int
    rss_mib: float
    anon_mib: float
    load_1m: float


@dataclass
class SessionsReport:
    """The browser-sessions figures (see the module docstring)."""

    sessions: int
    concurrent: int
    keep_tabs: bool
    points: list[MemoryPoint] = field(default_factory=list)
    run_seconds: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    wall_s: float = 0.0


def read_memory_mib(pid: int) -> tuple[float, float]:
    """(VmRSS, RssAnon) of process `pid` in MiB, from /proc/<pid>/status (Linux only).

    Raises:
        FileNotFoundError: the process is gone or /proc is missing.
    """
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "RssAnon"):
            fields[name] = int(value.split()[0]) / 1024  # kB -> MiB
    return fields.get("VmRSS", float("nan")), fields.get("RssAnon", float("nan"))


async def _visit(browser, url: str, seed: int, *, keep_open: bool, timeout_s: float):
    """One visitor: a fresh context (a new Gradio session), one long run to its final frame. Returns
    (seconds from Generate to 'done', the context if `keep_open` else None); the context is closed otherwise."""
    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        page = await context.new_page()
        await page.goto(url)
        await page.wait_for_selector("#dg-generate", timeout=timeout_s * 1000)
        await page.fill("#dg-prompt textarea", PROMPT)
        await page.check("#dg-raw input[type=checkbox]")
        await page.get_by_label("Adaptive stopping").uncheck()
        for label, value in RUN.items():
            box = page.locator(f"input[aria-label='number input for {label}']")
            await box.fill(str(value))
            await box.press("Enter")
        await page.fill("#dg-seed input, #dg-seed textarea", str(seed))
        started = time.perf_counter()
        await page.click("#dg-generate")
        await page.wait_for_selector(".dg-meter[data-state='running'], .dg-meter[data-state='done']",
                                     timeout=timeout_s * 1000)
        await page.wait_for_selector(".dg-meter[data-state='done']", timeout=timeout_s * 1000)
        seconds = time.perf_counter() - started
    except BaseException:
        await context.close()
        raise
    if keep_open:
        return seconds, context
    await context.close()
    return seconds, None


async def _drive(url: str, pid: int, sessions: int, concurrent: int, every: int, settle_s: float, keep_tabs: bool,
                 timeout_s: float, log) -> SessionsReport:
    from playwright.async_api import async_playwright

    tests = str(Path(__file__).resolve().parent.parent / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)
    from pages import CHROMIUM, CHROMIUM_ARGS

    report = SessionsReport(sessions=sessions, concurrent=concurrent, keep_tabs=keep_tabs)

    def mark(label: str, done: int) -> None:
        rss, anon = read_memory_mib(pid)
        point = MemoryPoint(label, done, rss, anon, os.getloadavg()[0])
        report.points.append(point)
        log(f"  {label:<34} {done:>4}  VmRSS {rss:7.1f} MiB  RssAnon {anon:7.1f} MiB  load {point.load_1m:.2f}")

    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            mark("server started", 0)
            await _visit(browser, url, 0, keep_open=False, timeout_s=timeout_s)
            await asyncio.sleep(5)
            mark("baseline (warm-up tab closed, 5 s)", 0)
            gate = asyncio.Semaphore(concurrent)
            kept, finished = [], 0
            started = time.perf_counter()

            async def one(i: int) -> None:
                nonlocal finished
                async with gate:
                    try:
                        seconds, context = await _visit(browser, url, i + 1, keep_open=keep_tabs,
                                                        timeout_s=timeout_s)
                        report.run_seconds.append(seconds)
                        if context is not None:
                            kept.append(context)
                    except Exception as error:  # noqa: BLE001 - counted and reported
                        report.failures.append(f"visitor {i + 1}: {type(error).__name__}: {str(error)[:200]}")
                    finished += 1
                    if finished % every == 0 and finished < sessions:
                        mark(f"{finished} visitors finished", finished)

            await asyncio.gather(*(one(i) for i in range(sessions)))
            if keep_tabs:
                mark(f"{sessions} tabs open, runs done", sessions)
                for context in kept:
                    await context.close()
            report.wall_s = time.perf_counter() - started
            await asyncio.sleep(1)
            mark("last tab closed (1 s)", sessions)
            await asyncio.sleep(settle_s)
            mark(f"settled ({settle_s:.0f} s idle)", sessions)
        finally:
            await browser.close()
    return report


def browser_sessions(url: str, pid: int, *, sessions: int = 50, concurrent: int = 3, every: int = 10,
                     settle_s: float = 30.0, keep_tabs: bool = False, timeout_s: float = 300.0,
                     log=print) -> SessionsReport:
    """Drive `sessions` browser visitors against the app at `url` (served by process `pid`) and read its memory.

    Args:
        url: the playground (loopback).
        pid: the serving process, whose /proc status is read.
        sessions: visitors, each one tab, one run (256 tokens, 8 steps, adaptive stopping off), then closed.
        concurrent: tabs open at a time.
        every: read the memory after every `every` finished visitors.
        settle_s: idle seconds after the last tab closed before the final reading.
        keep_tabs: close no tab until every run has finished.
        timeout_s: most seconds for one page load or one run.
        log: called with each progress line.

    Returns:
        A `SessionsReport`; visitors that failed are listed in `failures`, not raised.
    """
    if sessions < 1 or concurrent < 1 or every < 1:
        raise ValueError("sessions, concurrent tabs and the reading interval must each be at least 1")
    drive = functools.partial(_drive, url, pid, sessions, concurrent, every, settle_s, keep_tabs, timeout_s, log)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(drive())
    # An event loop already runs in this thread (e.g. Playwright's sync API): run ours in a thread of its own
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(lambda: asyncio.run(drive())).result()


def format_sessions(report: SessionsReport) -> str:
    """The report as a small table plus the per-session figure."""
    base = next(p for p in report.points if p.label.startswith("baseline"))
    final = report.points[-1]
    lines = [f"{'reading':<36} {'visitors':>8} {'VmRSS MiB':>10} {'RssAnon MiB':>12} {'+RSS over base':>15}"]
    for p in report.points:
        lines.append(f"{p.label:<36} {p.sessions:>8} {p.rss_mib:>10.1f} {p.anon_mib:>12.1f} "
                     f"{p.rss_mib - base.rss_mib:>+15.1f}")
    runs = sorted(report.run_seconds)
    median = runs[len(runs) // 2] if runs else float("nan")
    lines += [
        f"visitors {report.sessions} ({report.concurrent} at a time, tabs {'kept open' if report.keep_tabs else 'closed after each run'}),"
        f" completed {len(runs)}, failed {len(report.failures)}; run median {median:.1f} s, wall {report.wall_s:.0f} s",
        f"kept per session: {(final.rss_mib - base.rss_mib) / report.sessions:+.2f} MiB RSS, "
        f"{(final.anon_mib - base.anon_mib) / report.sessions:+.2f} MiB anonymous ((settled - baseline) / {report.sessions})",
    ]
    lines += [f"failure: {f}" for f in report.failures[:5]]
    return "\n".join(lines)
