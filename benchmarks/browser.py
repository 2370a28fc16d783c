"""What the playground costs in a browser, and the size of what it hands one: `python -m benchmarks.browser CMD`.

    canvas    the browser's time per live-canvas update at 256 and 64 positions (Chromium, CDP counters);
              --app-run: the live rate and long tasks of a served run of synthetic 256-position frames
              (the canvas drawn by the page's player; the server's CPU per feed message)
    latency   press Generate -> first frame, and tokens/s through the page against bare runs
    sessions  server memory while N browser visitors each run one generation and close their tab
    replay    trace JSON and offline HTML replay size of a run of the real model's size (no model)
    render    server-side CPU ms per canvas frame of 256 positions at the real vocabulary
    live      the Playground's live view: forwards painted of forwards run, time to the first painted forward and
              the longest task for the default prompt, a 512-token run and a synthetic 256 x 48 run at 60/s

Chromium is Debian's /usr/bin/chromium (never downloaded). Each command's --help says what it measures.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import dataclasses
import functools
import json
import math
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import torch
from playwright.async_api import async_playwright
from playwright.sync_api import sync_playwright
from transformers import AutoTokenizer

from benchmarks.bench import free_port, launched_app, run_command
from diffgemma_ui import build_app, canvas_view, playground_tab
from diffgemma_ui.canvas_view import live_html, stack_html
from diffgemma_ui.feed import frames_message
from diffgemma_ui.runs import default_live_rate
from diffgemma_ui.session import SessionState
from engine import DiffusionEngine, load_model
from engine.frames import Frame, TokenText
from engine.loading import DEFAULT_MODEL, set_serving_threads
from engine.settings import SETTING_NAMES, DiffusionSettings
from engine.trace import ModelInfo, Trace, replay_html
from standin import ensure_standin

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]
CANVAS_DOC = (
    "The browser's time per live-canvas update. app.py is served (the page is the same for every model) and opened "
    "in headless Chromium; real canvas_view.live_html output of random frames at the stand-in's 262,144-id "
    "vocabulary (about 30%% accepted) replaces the live canvas at the app's live rate, above --finished-blocks "
    "finished blocks, while a key is pressed in the prompt box every 150 ms. Per update: innerHTML parse, time to "
    "the next painted frame, Chromium's style/layout/script/task counters; long tasks and long animation frames; "
    "key-press delay. Leaves out Gradio's own message handling and GPU raster.")
LATENCY_DOC = (
    "UI latency and overhead in a real headless browser, the playground served in-process: press Generate -> first "
    "canvas frame (beside the engine's own time to first frame), the UI's tokens/s against engine.generate() run "
    "bare in a worker thread, interleaved, and the UI's streaming handler without a browser; CPU seconds of the UI "
    "run over the bare run's. --browser-cpu N pins Chromium to CPU N (a stand-in for the user's own machine). "
    "Targets: first frame < 300 ms, UI/bare tokens/s >= 0.95.")
SESSIONS_DOC = (
    "Server memory under many browser visitors: app.py is launched; after one warm-up tab, N visitors "
    "(--concurrent-tabs at a time, each a fresh browser context, so a fresh Gradio session) run one long generation "
    "(raw 'And', 256 tokens, 8 steps, adaptive stopping off) and close the tab. VmRSS and RssAnon are read at the "
    "baseline, every --every visitors, after the last tab closed and after --settle s; kept per session = "
    "(settled - baseline) / N.")
REPLAY_DOC = (
    "Size of a trace and of its offline HTML replay for a synthetic run of the real model's size (canvas 256, 48 "
    "steps, vocabulary 262,144: random noise ids every step, a draft that settles), without the model.")
RENDER_DOC = (
    "Server-side CPU ms per frame of drawing one 256-position block as HTML (canvas_view.block_html) from random "
    "frames at the stand-in's 262,144-id vocabulary, and of the cached token-string lookups.")
PROMPT = "And"  # the sessions command's run


# Runs in the page: replaces the live canvas `frames.length` times at `rate` per second and times each update.
DRIVER_JS = """
async ({frames, rate}) => {
  const host = document.querySelector('#dg-canvas .dg-canvas').parentElement;
  const longTasks = [], loafs = [], keys = [];
  const po1 = new PerformanceObserver(list => list.getEntries().forEach(e => longTasks.push(e.duration)));
  po1.observe({type: 'longtask'});
  let po2 = null;
  try {
    po2 = new PerformanceObserver(list => list.getEntries().forEach(e => loafs.push({
      duration: e.duration, blocking: e.blockingDuration,
      render: e.renderStart ? e.startTime + e.duration - e.renderStart : null,
      styleLayout: e.styleAndLayoutStart ? e.startTime + e.duration - e.styleAndLayoutStart : null})));
    po2.observe({type: 'long-animation-frame'});
  } catch (error) { po2 = null; }
  const onKey = event => {
    const handled = performance.now();
    requestAnimationFrame(() => requestAnimationFrame(() => keys.push(
      {delay: handled - event.timeStamp, toPaint: performance.now() - event.timeStamp})));
  };
  document.addEventListener('keydown', onKey, true);
  const twoFrames = () => new Promise(resolve => requestAnimationFrame(() => requestAnimationFrame(resolve)));
  const updates = [];
  const interval = 1000 / rate;
  const start = performance.now();
  window.__dgBenchRunning = true;
  for (let i = 0; i < frames.length; i++) {
    const due = start + i * interval;
    const wait = due - performance.now();
    if (wait > 0) await new Promise(resolve => setTimeout(resolve, wait));
    const t0 = performance.now();
    host.innerHTML = frames[i];
    const t1 = performance.now();
    await twoFrames();
    updates.push({parse: t1 - t0, toPaint: performance.now() - t0, late: Math.max(0, t0 - due)});
  }
  const elapsed = performance.now() - start;
  window.__dgBenchRunning = false;
  await new Promise(resolve => setTimeout(resolve, 200));
  document.removeEventListener('keydown', onKey, true);
  po1.disconnect(); if (po2) po2.disconnect();
  return {updates, longTasks, loafs, keys, elapsed, chips: host.querySelectorAll('.dg-chip').length,
          loafSupported: po2 !== null};
}
"""

# Puts `html` into the finished-blocks component: the element at the same place inside #dg-stack as the live
# canvas's host is inside #dg-canvas (both are Gradio HTML components). Returns the chips now in the stack.
STACK_JS = """
html => {
  const root = document.querySelector('#dg-canvas');
  let el = document.querySelector('#dg-canvas .dg-canvas').parentElement;
  const path = [];
  while (el !== root) {
    path.unshift(Array.prototype.indexOf.call(el.parentElement.children, el));
    el = el.parentElement;
  }
  let target = document.querySelector('#dg-stack');
  for (const i of path) target = target.children[i];
  target.innerHTML = html;
  return target.querySelectorAll('.dg-chip').length;
}
"""

METRICS = ("RecalcStyleDuration", "LayoutDuration", "ScriptDuration", "TaskDuration")

# Runs in the page of an --app-run: presses Generate, notes each forward the live canvas shows at an animation
# frame (the DOM the frame paints) and the long tasks, until the meter says done.
APP_RUN_JS = """() => new Promise(resolve => {
  const root = document.querySelector('#dg-canvas'), meter = document.querySelector('#dg-meter');
  const painted = [], longTasks = [];
  const po = new PerformanceObserver(list => list.getEntries().forEach(e => longTasks.push(e.duration)));
  po.observe({type: 'longtask'});
  let last = -1;
  const tick = () => {
    const el = root.querySelector('.dg-canvas');
    const f = el ? Number(el.getAttribute('data-forward')) : -1;
    if (f >= 0 && f !== last) { last = f; painted.push([performance.timeOrigin + performance.now(), f]); }
    const m = meter.querySelector('.dg-meter');
    if (m && m.getAttribute('data-state') === 'done' && painted.length) {
      po.disconnect();
      resolve({painted, longTasks, end: performance.timeOrigin + performance.now(),
               chips: root.querySelectorAll('.dg-chip').length});
      return;
    }
    requestAnimationFrame(tick);
  };
  requestAnimationFrame(tick);
  document.querySelector('#dg-generate').click();
})"""


def percentile(values, q):
    """Nearest-rank percentile `q` (0-100) of `values` (NaN when empty)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q / 100 * len(ordered))) - 1]


def random_frames(token_text, vocabulary: int, positions: int, count: int, seed: int):
    """`count` live frames of `positions` random ids (about 30% accepted), strings and kinds from `token_text`."""
    rng = random.Random(seed)
    frames = []
    for index in range(count):
        input_ids = [rng.randrange(vocabulary) for _ in range(positions)]
        draft_ids = [rng.randrange(vocabulary) for _ in range(positions)]
        accepted = [rng.random() < 0.3 for _ in range(positions)]
        frames.append(Frame(
            block_index=3, step_index=index % 48, forward_index=index, canvas_length=positions,
            max_denoising_steps=48, temperature=0.6, input_ids=input_ids, draft_ids=draft_ids, accepted=accepted,
            confidence=[rng.random() for _ in range(positions)],
            entropy=[rng.random() * 5 for _ in range(positions)],
            first_accepted_step=[index % 48 if a else -1 for a in accepted],
            input_tokens=[token_text(i) for i in input_ids], draft_tokens=[token_text(i) for i in draft_ids],
            input_kinds=[token_text.kind(i) for i in input_ids], draft_kinds=[token_text.kind(i) for i in draft_ids],
            block_done=False, block_stopped_early=False, done=False, committed_ids=draft_ids,
            committed_tokens=positions, forwards_per_block=[], elapsed_s=1.0, time_to_first_frame_s=0.1,
            tokens_per_second=1.0, tokens_per_forward=1.0,
        ))
    return frames


def finished_stack(token_text, vocabulary: int, positions: int, blocks: int) -> str:
    """`stack_html` of `blocks` finished blocks of `positions` random tokens ("" for none)."""
    done = []
    for b, frame in enumerate(random_frames(token_text, vocabulary, positions, blocks, seed=99)):
        done.append(dataclasses.replace(frame, block_index=b, block_done=True, step_index=47,
                                        committed_ids=frame.draft_ids * (b + 1), accepted=[True] * positions))
    return stack_html(done)


def synthetic_run(token_text, vocabulary: int, positions: int, steps: int, blocks: int, rate: float, times: list):
    """An engine's `frames` method that ignores its inputs and yields `blocks` blocks of `steps` frames of
    `positions` random ids below `vocabulary` (each position accepted from a random step on, then keeping its
    draft; top-5 alternatives), `rate` frames a second; appends each frame's wall time (epoch s) to `times`."""
    def frames(prompt, settings=None, *, raw=False, seed=None, stop_event=None, thinking=False, prompt_ids=None):
        rng = random.Random(0)
        committed, forward, start = [], 0, time.monotonic()
        times.clear()
        for block in range(blocks):
            draft = [rng.randrange(vocabulary) for _ in range(positions)]
            accept_at = [min(steps - 1, int(rng.random() ** 1.5 * steps)) for _ in range(positions)]
            for step in range(steps):
                if stop_event is not None and stop_event.is_set():
                    return
                time.sleep(max(0.0, start + forward / rate - time.monotonic()))
                accepted = [step >= a for a in accept_at]
                draft = [d if ok else rng.randrange(vocabulary) for d, ok in zip(draft, accepted)]
                inputs = [d if ok else rng.randrange(vocabulary) for d, ok in zip(draft, accepted)]
                tops = [[d] + [rng.randrange(vocabulary) for _ in range(4)] for d in draft]
                done_block = step == steps - 1
                if done_block:
                    committed = committed + draft
                elapsed = time.monotonic() - start
                yield Frame(
                    block_index=block, step_index=step, forward_index=forward, canvas_length=positions,
                    max_denoising_steps=steps, temperature=0.6, input_ids=inputs, draft_ids=draft, accepted=accepted,
                    confidence=[rng.random() for _ in range(positions)],
                    entropy=[rng.random() * 5 for _ in range(positions)],
                    first_accepted_step=[a if ok else -1 for a, ok in zip(accept_at, accepted)],
                    input_tokens=[token_text(i) for i in inputs], draft_tokens=[token_text(i) for i in draft],
                    input_kinds=[token_text.kind(i) for i in inputs], draft_kinds=[token_text.kind(i) for i in draft],
                    top_ids=tops, top_probs=[[0.5, 0.2, 0.1, 0.05, 0.02]] * positions,
                    top_tokens=[[token_text(i) for i in top] for top in tops],
                    block_done=done_block, block_stopped_early=False, done=done_block and block == blocks - 1,
                    stop_reason="max_new_tokens" if done_block and block == blocks - 1 else "",
                    committed_ids=list(committed), committed_tokens=len(committed),
                    forwards_per_block=[steps] * (block + done_block), elapsed_s=elapsed,
                    time_to_first_frame_s=0.05, tokens_per_second=len(committed) / max(elapsed, 1e-3),
                    tokens_per_forward=len(committed) / (forward + 1))
                times.append(time.time())
                forward += 1
    return frames


def app_run(args) -> int:
    """`canvas --app-run`: the playground served in-process with the embedded engine's frames replaced by
    `synthetic_run`; one run watched in the page (see APP_RUN_JS)."""
    engine = DiffusionEngine(load_model(args.model or DEFAULT_MODEL, "cpu"))
    positions = args.positions[0]
    times: list = []
    engine.frames = synthetic_run(engine.token_text, len(engine.tokenizer), positions, args.steps, args.blocks,
                                  args.source_rate, times)
    engine.canvas_length = positions
    engine.check_budget = lambda *_, **__: None
    budget = {"reader_budget": None} if args.no_reader_budget else {}
    app = build_app(engine, **budget) if args.rate is None else build_app(engine, max_fps=args.rate, **budget)
    rate = app.hub.runs.max_fps
    renders = []  # (CPU seconds) of each serialisation of the run's new frames for the page's player
    render = playground_tab.frames_message

    def timed_render(*a, **k):
        start = time.thread_time()
        try:
            return render(*a, **k)
        finally:
            renders.append(time.thread_time() - start)
    playground_tab.frames_message = timed_render
    _, url, _ = app.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=free_port(), quiet=True)
    print(f"app run: {args.blocks} blocks x {args.steps} steps of {positions} positions, source {args.source_rate:g} "
          f"forwards/s, live rate cap {rate:.1f}/s, reader budget {'off' if args.no_reader_budget else 'on'}",
          flush=True)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            for run in range(args.runs):
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                page.goto(url)
                page.wait_for_selector("#dg-canvas .dg-canvas")
                # the run starts once the page has loaded its plots library: that belongs to the page load
                page.wait_for_function("() => window.dgLive && window.dgLive.player() && typeof Plotly !== 'undefined'",
                                       timeout=60_000)
                load = os.getloadavg()[0]
                renders.clear()
                result = page.evaluate(APP_RUN_JS)
                painted = result["painted"]
                live = [(t, f) for t, f in painted if f < len(times) - 1]
                span_s = (live[-1][0] - live[0][0]) / 1000 if len(live) > 1 else math.nan
                lags = [bisect.bisect_right(times, t / 1000) - 1 - f for t, f in live]
                tasks = result["longTasks"]
                print(f"run {run + 1}: {len(live)} live forwards painted of {len(times)} in {span_s:.1f} s: "
                      f"{(len(live) - 1) / span_s:.1f}/s; canvas behind the source p50/max "
                      f"{percentile(lags, 50)}/{max(lags, default=0)} forwards; final view "
                      f"{result['end'] / 1000 - times[-1]:.2f} s after the last frame; long tasks > 50 ms: "
                      f"{len(tasks)}, longest {max(tasks, default=0):.0f} ms, over 200 ms: "
                      f"{sum(1 for t in tasks if t > 200)}; server feed messages {len(renders)}, CPU "
                      f"p50 {percentile(renders, 50) * 1e3:.1f} ms; load average (1 min) {load:.2f} before, "
                      f"{os.getloadavg()[0]:.2f} after", flush=True)
                page.close()
            browser.close()
    finally:
        app.close()
    return 0


def measure(page, cdp, frames_html: list[str], stack: str, rate: float) -> dict:
    """Run the in-page driver over `frames_html` (with `stack` in the finished-blocks area) while pressing a key in
    the prompt box every 150 ms; returns the driver's results plus Chromium's metric deltas per update (ms)."""
    page.evaluate("([frames, rate]) => { window.__dgFrames = {frames: frames, rate: rate}; }", [frames_html, rate])
    page.evaluate(STACK_JS, stack)
    page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
    page.click("#dg-prompt textarea")
    before = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
    page.evaluate(f"() => {{ window.__dgBenchRunning = true; window.__dgBench = ({DRIVER_JS})(window.__dgFrames); "
                  "return true; }")
    time.sleep(0.3)
    presses = 0
    while page.evaluate("window.__dgBenchRunning === true"):
        page.keyboard.press("x")
        presses += 1
        time.sleep(0.15)
    result = page.evaluate("window.__dgBench")
    after = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
    n = len(result["updates"])
    result["metrics_ms"] = {name: (after[name] - before[name]) * 1000 / n for name in METRICS}
    result["presses"] = presses
    return result


def summarize(positions: int, result: dict, html_bytes: int, rate: float) -> list[str]:
    """Printable lines for one size."""
    def triple(values):
        return f"{percentile(values, 50):7.1f} {percentile(values, 95):7.1f} {max(values, default=math.nan):7.1f}"

    updates = result["updates"]
    to_paint = [u["toPaint"] for u in updates]
    parse = [u["parse"] for u in updates]
    keys = result["keys"]
    m = result["metrics_ms"]
    achieved = len(updates) / (result["elapsed"] / 1000)
    loafs = result["loafs"]
    renders = [f["render"] for f in loafs if f["render"] is not None]
    lines = [
        f"{positions} positions ({result['chips']} chips on the live block, {html_bytes / 1024:.0f} KiB of HTML per "
        f"update), {len(updates)} updates asked at {rate:g}/s, achieved {achieved:.1f}/s:",
        "  ms per update                       p50     p95     max",
        f"  replacement to next frame       {triple(to_paint)}",
        f"  innerHTML (parse + DOM)         {triple(parse)}",
        f"  Chromium counters per update (mean): style {m['RecalcStyleDuration']:.1f} ms, layout "
        f"{m['LayoutDuration']:.1f} ms, script {m['ScriptDuration']:.1f} ms, all main-thread tasks "
        f"{m['TaskDuration']:.1f} ms",
        f"  long tasks > 50 ms: {len(result['longTasks'])} (longest {max(result['longTasks'], default=0):.0f} ms); "
        + (f"long animation frames > 50 ms: {len(loafs)} (longest {max((f['duration'] for f in loafs), default=0):.0f}"
           f" ms; their rendering part, style + layout + paint, p50 {percentile(renders, 50):.0f} ms)"
           if result["loafSupported"] else "long animation frames: not supported"),
        f"  key presses in the prompt box during the updates: {len(keys)} of {result['presses']} timed; "
        f"delay to handler p50/p95/max {triple([k['delay'] for k in keys]).strip()} ms; "
        f"to next frame {triple([k['toPaint'] for k in keys]).strip()} ms",
    ]
    return lines


def main_canvas(argv: list[str] | None = None) -> int:
    """`canvas`: the browser's time per live-canvas update (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.browser canvas", description=CANVAS_DOC)
    parser.add_argument("--positions", type=int, nargs="+", default=[256, 64], help="canvas sizes (default 256 64)")
    parser.add_argument("--rate", type=float, help="updates per second (default: the app's live rate for each size)")
    parser.add_argument("--updates", type=int, default=90, help="updates per size (default 90)")
    parser.add_argument("--finished-blocks", type=int, default=3, help="finished blocks in the stack (default 3)")
    parser.add_argument("--model", help="model for the served app (default: the embedded one; the page is the same)")
    parser.add_argument("--tokenizer", help="tokenizer folder for the tokens (default: the stand-in's, 262,144 ids)")
    parser.add_argument("--extra-css", help="CSS added to the page before measuring (to try a rendering change)")
    parser.add_argument("--json", action="store_true", help="print the raw results as JSON too")
    parser.add_argument("--app-run", action="store_true",
                        help="instead: serve the playground with a synthetic engine (the first --positions, --blocks "
                        "x --steps frames at --source-rate/s, the embedded model's tokens) and watch --runs runs in "
                        "the page: forwards painted per second, how far the canvas trails the source, long tasks")
    parser.add_argument("--blocks", type=int, default=2, help="--app-run: blocks per run (default 2)")
    parser.add_argument("--steps", type=int, default=48, help="--app-run: steps per block (default 48)")
    parser.add_argument("--source-rate", type=float, default=30.0, help="--app-run: frames per second (default 30)")
    parser.add_argument("--runs", type=int, default=2, help="--app-run: runs (default 2)")
    parser.add_argument("--no-reader-budget", action="store_true",
                        help="--app-run: no reader budget (only the live rate limits the renders: the page's side)")
    args = parser.parse_args(argv)
    if (args.rate is not None and args.rate <= 0) or args.updates < 1 or min(args.positions) < 1:
        raise SystemExit("error: --rate must be positive, --updates and --positions at least 1")
    if args.app_run:
        if min(args.blocks, args.steps, args.runs) < 1 or args.source_rate <= 0:
            raise SystemExit("error: --blocks, --steps and --runs must be at least 1, --source-rate positive")
        return app_run(args)



    if args.tokenizer is None:

        args.tokenizer = ensure_standin()
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    token_text = TokenText(tokenizer, eos_token_ids=[1, 106, 50], pad_token_id=0,
                           special_ids=[255999, 258880, 258882])
    vocabulary = len(tokenizer)
    print(f"tokenizer {args.tokenizer} ({vocabulary:,} ids); load average {os.getloadavg()[0]:.2f} at start",
          flush=True)


    with launched_app(args.model, "cpu", timeout_s=300) as (url, _):
        if True:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
                try:
                    page = browser.new_page(viewport={"width": 1280, "height": 900})
                    page.goto(url)
                    page.wait_for_selector("#dg-canvas .dg-canvas")
                    if args.extra_css:
                        page.add_style_tag(content=args.extra_css)
                    cdp = page.context.new_cdp_session(page)
                    cdp.send("Performance.enable", {"timeDomain": "threadTicks"})
                    raw = {}
                    for positions in args.positions:
                        rate = args.rate or default_live_rate(positions)
                        frames = random_frames(token_text, vocabulary, positions, args.updates, seed=positions)
                        html = [live_html(f) for f in frames]
                        stack = finished_stack(token_text, vocabulary, positions, args.finished_blocks)
                        # one short warm-up pass (first-use costs of the styles and fonts), then the measured one
                        measure(page, cdp, html[:10], stack, rate)
                        load = os.getloadavg()[0]
                        result = measure(page, cdp, html, stack, rate)
                        raw[positions] = result
                        average_bytes = sum(len(h.encode()) for h in html) / len(html)
                        for line in summarize(positions, result, average_bytes, rate):
                            print(line, flush=True)
                        print(f"  load average (1 min) {load:.2f} before, {os.getloadavg()[0]:.2f} after", flush=True)
                        if positions == args.positions[0]:
                            page.screenshot(path=str(Path(tempfile.gettempdir()) / "browser_canvas_cost.png"))
                finally:
                    browser.close()
    if args.json:
        print(json.dumps({str(k): v for k, v in raw.items()}))
    return 0


CLICK_AND_TIME = """() => new Promise((resolve) => {
  const root = document.querySelector('#dg-canvas');
  const meter = document.querySelector('#dg-meter');
  const result = {first_frame_ms: null, canvas_renders: 0};
  let t0 = 0;
  let shown = -1;
  const check = () => {
    const el = root.querySelector('.dg-canvas');
    const f = el ? Number(el.getAttribute('data-forward')) : -1;
    if (result.first_frame_ms === null && f >= 0) result.first_frame_ms = performance.now() - t0;
    if (f >= 0 && f !== shown) { shown = f; result.canvas_renders += 1; }
  };
  const done = () => {
    const m = meter.querySelector('.dg-meter');
    if (m && m.getAttribute('data-state') === 'done' && result.first_frame_ms !== null) {
      result.ui_tps = Number(m.getAttribute('data-tps'));
      result.ui_ttff_ms = Number(m.getAttribute('data-ttff')) * 1000;
      result.total_ms = performance.now() - t0;
      observer.disconnect();
      resolve(result);
    }
  };
  const observer = new MutationObserver(() => { check(); done(); });
  observer.observe(root, {subtree: true, childList: true, attributes: true});
  observer.observe(meter, {subtree: true, childList: true, attributes: true});
  t0 = performance.now();
  document.querySelector('#dg-generate').click();
})"""


def chromium_cpu_s() -> float:
    """CPU seconds used so far by all Chromium processes (Linux /proc; NaN elsewhere)."""
    try:
        tick = os.sysconf("SC_CLK_TCK")
        total = 0
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            if "chrom" in stat[stat.index("(") + 1 : stat.rindex(")")]:
                fields = stat[stat.rindex(")") + 2 :].split()
                total += int(fields[11]) + int(fields[12])
        return total / tick
    except (OSError, ValueError, AttributeError):
        return float("nan")


def generate_in_thread(engine, prompt, settings, seed):
    """`engine.generate()` in a fresh thread, as the UI's worker runs it (torch's CPU threading differs between the
    main thread and other threads: on a busy CPU the main thread can be several times slower)."""
    out = {}

    def run():
        out["result"] = engine.generate(prompt, settings, raw=True, seed=seed)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return out["result"]


def stream_in_process(tab, prompt, settings, seed) -> float:
    """Tokens/s of one run through the Playground tab's own check and run step, in this process, without a browser:
    the worker thread, coalescing and every feed message (the frames as JSON) but no HTTP or DOM. The engine's figure
    of the run's last frame (what the page's meter shows)."""
    session = SessionState()
    inputs = (prompt, True, *(getattr(settings, name) for name in SETTING_NAMES), seed, False)
    ticket, *_ = tab.request_run(session, *inputs)
    for _ in tab.generate_stream(session, ticket):
        pass
    return session.snapshot.latest.tokens_per_second


def pin_own_threads(cpus: set[int]) -> None:
    """Pin every thread of this process to `cpus` (Linux); threads started later inherit it from their creator."""
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(int(tid), cpus)


def median(values):
    return statistics.median(values) if values else float("nan")


def main_latency(argv: list[str] | None = None) -> int:
    """`latency`: first frame and tokens/s through the page against bare runs (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.browser latency", description=LATENCY_DOC)
    parser.add_argument("--model", default=None, help="model folder or hub id (default: embedded diffgemma-tiny)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--prompt", default="In the beginning")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default: the checkpoint's recommended")
    parser.add_argument("--steps", type=int, default=None, help="max denoising steps (default: recommended)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bare-in-main-thread", action="store_true",
                        help="run the bare engine.generate() in the main thread instead of a fresh thread")
    parser.add_argument("--max-fps", type=float, default=None,
                        help="the UI's live renders per second at most (default: the app's)")
    parser.add_argument("--browser-cpu", type=int, default=None, metavar="N",
                        help="pin Chromium to CPU N and this process (server, engine, bare runs) to the other CPUs, "
                             "with that many torch threads: the browser then stands in for a user's own machine")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = parser.parse_args(argv)



    engine = DiffusionEngine(load_model(args.model or DEFAULT_MODEL, args.device))
    set_serving_threads(engine.device)  # as app.py does
    settings = engine.recommended.replace(
        max_new_tokens=args.max_new_tokens or engine.recommended.max_new_tokens,
        max_denoising_steps=args.steps or engine.recommended.max_denoising_steps)
    app = build_app(engine) if args.max_fps is None else build_app(engine, max_fps=args.max_fps)
    _, url, _ = app.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=free_port(), quiet=True)
    generate_in_thread(engine, args.prompt, settings, args.seed)  # warm-up (allocator, caches)

    rows = {"page_load_ms": [], "first_frame_ms": [], "engine_ttff_ms": [], "bare_ttff_ms": [], "ui_tps": [],
            "bare_tps": [], "stream_tps": [], "ui_total_ms": [], "browser_cpu_pct": [], "renders_per_s": [],
            "cpu_ratio_server": [], "cpu_ratio_total": []}
    server_cpus = None
    if args.browser_cpu is not None:
        server_cpus = set(os.sched_getaffinity(0)) - {args.browser_cpu}
        if args.browser_cpu not in os.sched_getaffinity(0) or not server_cpus:
            parser.error(f"--browser-cpu {args.browser_cpu}: needs that CPU and at least one other")
        os.sched_setaffinity(0, {args.browser_cpu})  # this thread only: the driver and Chromium inherit it
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            if server_cpus is not None:
                pin_own_threads(server_cpus)
                torch.set_num_threads(len(server_cpus))
                generate_in_thread(engine, args.prompt, settings, args.seed)
            for run in range(args.runs + 1):  # run 0 warms the browser and the server up, not counted
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                start = time.perf_counter()
                page.goto(url)
                page.wait_for_selector("#dg-generate")
                load_ms = (time.perf_counter() - start) * 1000
                page.fill("#dg-prompt textarea", args.prompt)
                page.check("#dg-raw input[type=checkbox]")
                for selector, value in (
                    ("input[aria-label='number input for Max new tokens']", settings.max_new_tokens),
                    ("input[aria-label='number input for Max denoising steps']", settings.max_denoising_steps),
                    ("#dg-seed input", args.seed),
                ):
                    box = page.locator(selector)
                    box.fill(str(value))
                    box.press("Enter")
                time.sleep(0.3)
                cpu_before, server_before = chromium_cpu_s(), time.process_time()
                measured = page.evaluate(CLICK_AND_TIME)
                browser_cpu = chromium_cpu_s() - cpu_before
                server_cpu = time.process_time() - server_before  # this process: engine + server + rendering
                page.close()
                time.sleep(0.5)
                # right after, under the same load, in a thread like the UI's worker (unless asked otherwise)
                bare_before = time.process_time()
                if args.bare_in_main_thread:
                    bare = engine.generate(args.prompt, settings, raw=True, seed=args.seed)
                else:
                    bare = generate_in_thread(engine, args.prompt, settings, args.seed)
                bare_cpu = time.process_time() - bare_before
                streamed_tps = stream_in_process(app.tabs["playground"], args.prompt, settings, args.seed)
                if run == 0:
                    continue
                rows["page_load_ms"].append(load_ms)
                rows["first_frame_ms"].append(measured["first_frame_ms"])
                rows["ui_total_ms"].append(measured["total_ms"])
                rows["browser_cpu_pct"].append(100 * browser_cpu / (measured["total_ms"] / 1000))
                rows["renders_per_s"].append(measured["canvas_renders"] / (measured["total_ms"] / 1000))
                rows["cpu_ratio_server"].append(server_cpu / bare_cpu)
                rows["cpu_ratio_total"].append((server_cpu + browser_cpu) / bare_cpu)
                rows["ui_tps"].append(measured["ui_tps"])
                rows["bare_tps"].append(bare.tokens_per_second)
                rows["stream_tps"].append(streamed_tps)
                rows["engine_ttff_ms"].append(measured["ui_ttff_ms"])
                rows["bare_ttff_ms"].append(bare.time_to_first_frame_s * 1000)
            browser.close()
    finally:
        with contextlib.redirect_stdout(sys.stderr):  # Gradio says "Closing server..." on stdout; keep it JSON-clean
            app.close()

    placement = (f"shared CPUs: browser, server and engine compete (torch threads: {torch.get_num_threads()})"
                 if server_cpus is None else
                 f"browser on CPU {args.browser_cpu}, server and engine on CPUs {sorted(server_cpus)} "
                 f"(torch threads: {len(server_cpus)})")
    summary = {key: {"median": median(v), "min": min(v), "max": max(v), "runs": v} for key, v in rows.items()}
    ratio = median(rows["ui_tps"]) / median(rows["bare_tps"])
    paired = median([u / b for u, b in zip(rows["ui_tps"], rows["bare_tps"]) if b > 0])
    server_ratio = median(rows["stream_tps"]) / median(rows["bare_tps"])
    overhead = median([f - e for f, e in zip(rows["first_frame_ms"], rows["engine_ttff_ms"])])
    result = {
        "placement": placement,
        "settings": {"prompt": args.prompt, "raw": True, "max_new_tokens": settings.max_new_tokens,
                     "max_denoising_steps": settings.max_denoising_steps, "seed": args.seed, "runs": args.runs,
                     "bare_in": "main thread" if args.bare_in_main_thread else "worker thread",
                     "max_fps": args.max_fps or "app default", "device": str(engine.device)},
        "metrics": summary,
        "ui_overhead_to_first_frame_ms": overhead,
        "tps_ratio_ui_over_bare": ratio,
        "tps_ratio_median_of_pairs": paired,
        "tps_ratio_handler_without_browser": server_ratio,
        "targets": {"first_frame_ms_below": 300, "tps_ratio_at_least": 0.95},
        "first_frame_target_met": summary["first_frame_ms"]["median"] < 300,
        "tps_ratio_target_met": ratio >= 0.95,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"UI latency on {engine.device}: prompt {args.prompt!r}, {settings.max_new_tokens} tokens, "
          f"{settings.max_denoising_steps} steps, "
          f"seed {args.seed}, {args.runs} runs (+1 warm-up); {placement}")
    print(f"{'metric':44} {'median':>9} {'min':>9} {'max':>9}  target")
    labels = [
        ("page_load_ms", "page load (goto -> Generate visible), ms", ""),
        ("first_frame_ms", "press Generate -> first canvas frame, ms", "< 300"),
        ("engine_ttff_ms", "  of which engine time to first frame, ms", ""),
        ("bare_ttff_ms", "engine.generate() time to first frame, ms", ""),
        ("ui_total_ms", "press Generate -> final frame shown, ms", ""),
        ("renders_per_s", "canvas renders per second in the page", "<= 15"),
        ("browser_cpu_pct", "browser CPU during the UI run, % of a core", ""),
        ("cpu_ratio_server", "CPU of UI run / bare run, server process", ""),
        ("cpu_ratio_total", "CPU of UI run / bare run, server + browser", ""),
        ("ui_tps", "UI-reported tokens/s (engine clock)", ""),
        ("bare_tps", "engine.generate() tokens/s", ""),
        ("stream_tps", "UI handler in-process, no browser, tokens/s", ""),
    ]
    for key, label, target in labels:
        s = summary[key]
        f = ".3f" if key.startswith("cpu_ratio") else ".1f"
        print(f"{label:44} {s['median']:9{f}} {s['min']:9{f}} {s['max']:9{f}}  {target}")
    print(f"{'UI overhead to first frame (median diff), ms':44} {overhead:9.1f}")
    print(f"{'tokens/s ratio UI / bare (medians)':44} {ratio:9.3f} {'':9} {'':9}  >= 0.95")
    print(f"{'tokens/s ratio UI / bare (median of pairs)':44} {paired:9.3f}")
    print(f"{'tokens/s ratio handler without browser / bare':44} {server_ratio:9.3f}")
    return 0


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
        f"visitors {report.sessions} ({report.concurrent} at a time, tabs "
        f"{'kept open' if report.keep_tabs else 'closed after each run'}),"
        f" completed {len(runs)}, failed {len(report.failures)}; run median {median:.1f} s, wall {report.wall_s:.0f} s",
        f"kept per session: {(final.rss_mib - base.rss_mib) / report.sessions:+.2f} MiB RSS, "
        f"{(final.anon_mib - base.anon_mib) / report.sessions:+.2f} MiB anonymous "
        f"((settled - baseline) / {report.sessions})",
    ]
    lines += [f"failure: {f}" for f in report.failures[:5]]
    return "\n".join(lines)


def synthetic_trace(canvas: int = 256, steps: int = 48, blocks: int = 1, vocab: int = 262_144, seed: int = 0,
                    token_text=None, adaptive_stopping: bool = False, alternatives: bool = False) -> Trace:
    """A `Trace` of a synthetic run: `blocks` canvases of `canvas` positions, `steps` forwards each, random ids in
    `[0, vocab)`; `token_text(id)` gives the strings (default: a pseudo-word per id); `alternatives`: each position
    with five alternatives (its draft and four random ids), as a real run records them."""
    rng = random.Random(seed)
    token_text = token_text or (lambda i: f" w{i % 9973}" if i % 7 else f"<{i}>")
    settings = DiffusionSettings(max_new_tokens=blocks * canvas, max_denoising_steps=steps,
                                 adaptive_stopping=adaptive_stopping)
    frames, committed, forwards_per_block, elapsed = [], [], [], 0.0
    for block in range(blocks):
        draft = [rng.randrange(vocab) for _ in range(canvas)]
        first = [-1] * canvas
        order = list(range(canvas))
        rng.shuffle(order)
        for step in range(steps):
            accepted_now = set(order[: (step + 1) * canvas // steps])
            for pos in range(canvas):
                if pos not in accepted_now and rng.random() < 0.5:
                    draft[pos] = rng.randrange(vocab)
                if pos in accepted_now and first[pos] < 0:
                    first[pos] = step
            accepted = [pos in accepted_now for pos in range(canvas)]
            noise = [draft[p] if accepted[p] else rng.randrange(vocab) for p in range(canvas)]
            elapsed += 0.05
            block_done = step == steps - 1
            if block_done:
                committed = committed + list(draft)
                forwards_per_block = forwards_per_block + [steps]
            done = block_done and block == blocks - 1
            tops = [[d] + [rng.randrange(vocab) for _ in range(4)] for d in draft] if alternatives else []
            frames.append(Frame(
                block_index=block, step_index=step, forward_index=len(frames), canvas_length=canvas,
                max_denoising_steps=steps, temperature=0.8, input_ids=noise, draft_ids=list(draft),
                accepted=accepted, confidence=[rng.random() for _ in range(canvas)],
                entropy=[rng.random() * 3 for _ in range(canvas)], first_accepted_step=list(first),
                input_tokens=[], draft_tokens=[], block_done=block_done, block_stopped_early=False, done=done,
                committed_ids=list(committed), committed_tokens=len(committed),
                forwards_per_block=list(forwards_per_block), elapsed_s=elapsed, time_to_first_frame_s=0.05,
                tokens_per_second=0.0, tokens_per_forward=0.0, prompt_tokens=4, seed=seed,
                stop_reason="max_new_tokens" if done else "", top_ids=tops,
                top_probs=[[0.6, 0.2, 0.1, 0.05, 0.05]] * len(tops),
            ))
    model = ModelInfo(name="synthetic", revision="", device="cpu", dtype="float32", canvas_length=canvas)
    return Trace.from_frames(frames, model=model, settings=settings, prompt="In the beginning", raw=True,
                             prompt_ids=[2, 10, 11, 12], token_text=token_text,
                             text="".join(token_text(i) for i in committed))


def main_replay(argv: list[str] | None = None) -> int:
    """`replay`: trace and offline replay size of a synthetic run of the real model's size."""

    parser = argparse.ArgumentParser(prog="python -m benchmarks.browser replay", description=REPLAY_DOC)
    parser.add_argument("--canvas", type=int, default=256)
    parser.add_argument("--steps", type=int, default=48)
    parser.add_argument("--blocks", type=int, default=1)
    parser.add_argument("--vocab", type=int, default=262_144)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    trace = synthetic_trace(args.canvas, args.steps, args.blocks, args.vocab)
    start = time.perf_counter()
    page = replay_html(trace)
    seconds = time.perf_counter() - start
    text = trace.to_json()
    print(f"run: {args.blocks} block(s) x {args.canvas} positions x {args.steps} steps, vocabulary {args.vocab:,}, "
          f"{len(trace.tokens):,} distinct token ids")
    print(f"trace JSON: {len(text.encode()):,} bytes ({len(text.encode()) / 2**20:.2f} MiB)")
    print(f"HTML replay: {len(page.encode()):,} bytes ({len(page.encode()) / 2**20:.2f} MiB), built in {seconds:.2f} s")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        trace.save(args.out / "trace.json")
        (args.out / "replay.html").write_text(page, encoding="utf-8")
        print(f"wrote {args.out / 'trace.json'} and {args.out / 'replay.html'}")
    return 0
def main_render(argv: list[str] | None = None) -> int:
    """`render`: server-side CPU milliseconds per canvas frame at the real vocabulary."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.browser render", description=RENDER_DOC)
    parser.add_argument("--tokenizer", help="a tokenizer folder (default: the stand-in, built if needed)")
    parser.add_argument("--frames", type=int, default=60)
    args = parser.parse_args(argv)



    if args.tokenizer is None:

        args.tokenizer = ensure_standin()
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    token_text = TokenText(tokenizer, eos_token_ids=[1, 106, 50], pad_token_id=0,
                           special_ids=[255999, 258880, 258882])
    rng = random.Random(0)
    n, frames, lookups = 256, [], 0.0
    for index in range(args.frames):
        input_ids = [rng.randrange(len(tokenizer)) for _ in range(n)]
        draft_ids = [rng.randrange(len(tokenizer)) for _ in range(n)]
        for ids in (input_ids, draft_ids):  # fill the cache as a run does (its cost is paid once per id)
            for token_id in ids:
                token_text.describe(token_id)
        start = time.process_time()
        strings = ([token_text(i) for i in input_ids], [token_text(i) for i in draft_ids],
                   [token_text.kind(i) for i in input_ids], [token_text.kind(i) for i in draft_ids])
        lookups += time.process_time() - start
        accepted = [rng.random() < 0.3 for _ in range(n)]
        frames.append(Frame(
            block_index=0, step_index=index, forward_index=index, canvas_length=n, max_denoising_steps=48,
            temperature=0.6, input_ids=input_ids, draft_ids=draft_ids, accepted=accepted,
            confidence=[rng.random() for _ in range(n)], entropy=[rng.random() * 5 for _ in range(n)],
            first_accepted_step=[0 if a else -1 for a in accepted], input_tokens=strings[0], draft_tokens=strings[1],
            input_kinds=strings[2], draft_kinds=strings[3], block_done=False, block_stopped_early=False, done=False,
            committed_ids=draft_ids, committed_tokens=n, forwards_per_block=[], elapsed_s=1.0,
            time_to_first_frame_s=0.1, tokens_per_second=1.0, tokens_per_forward=1.0,
        ))
    print(f"token strings and kinds (cached lookups, 4 x {n}): {lookups / len(frames) * 1e3:.2f} ms CPU per frame")
    for live in (True, False):
        canvas_view.block_html(frames[0], live=live)
        start = time.process_time()
        for frame in frames:
            canvas_view.block_html(frame, live=live)
        label = "live block (draft + noise)" if live else "finished block"
        print(f"block_html, {label}, {n} positions: {(time.process_time() - start) / len(frames) * 1e3:.2f} ms CPU "
              "per frame")
    return 0

def main_sessions(argv: list[str] | None = None) -> int:
    """`sessions`: launch app.py, drive N browser visitors, print its memory readings; 0 if every visitor's run
    finished."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.browser sessions", description=SESSIONS_DOC)
    parser.add_argument("--sessions", type=int, default=50, help="visitors (default 50)")
    parser.add_argument("--model", help="model for the launched app (default: the embedded diffgemma-tiny)")
    parser.add_argument("--device", default="auto", help="device for the launched app (default: auto)")
    parser.add_argument("--concurrent-tabs", type=int, default=3, help="tabs open at a time (default 3)")
    parser.add_argument("--every", type=int, default=10, help="read RSS every N finished visitors (default 10)")
    parser.add_argument("--settle", type=float, default=30.0,
                        help="idle seconds after the last tab closed before the final reading (default 30)")
    parser.add_argument("--keep-tabs", action="store_true", help="close no tab until every run has finished")
    args = parser.parse_args(argv)
    with launched_app(args.model, args.device) as (url, process):
        print(f"app.py pid {process.pid} at {url}; {args.sessions} visitors, {args.concurrent_tabs} at a time",
              flush=True)
        report = browser_sessions(url, process.pid, sessions=args.sessions, concurrent=args.concurrent_tabs,
                                  every=args.every, settle_s=args.settle, keep_tabs=args.keep_tabs,
                                  log=lambda line: print(line, flush=True))
    print(format_sessions(report))
    return 0 if not report.failures else 1


LIVE_DOC = (
    "The Playground's live view in a real browser. app.py is served (the embedded model unless --model) and opened "
    "in headless Chromium at 1280x900; the page is loaded and its plots library ready before each run. From the "
    "Generate click until the engine's run has ended and the player shows its last forward, a sampler at every "
    "animation frame notes the forward on the canvas (#dg-canvas's data-forward: what that frame paints) and a "
    "PerformanceObserver the long tasks (over 50 ms). Runs: (a) the default prompt and settings; (b) raw "
    "--long-prompt for --long-tokens tokens, adaptive stopping off; each at every --paces pace (default, and 'live': "
    "as it computes); (c) a synthetic run of --synthetic-positions x --synthetic-steps (five alternatives a position, "
    "random ids over 262,144) fed to the page's window.dgLive.feed as the run step sends it, one message a forward at "
    "--synthetic-rate a second (no model, no server: a GPU's rate). Figures: forwards painted / forwards run; the "
    "click (c: the first message) to the first painted forward; the longest task; how long the playback took; the "
    "engine's own time.")

# Runs in the page before a run: a sampler at each animation frame notes the forward on the canvas (the DOM that
# frame paints), a PerformanceObserver the long tasks; `window.__live.stop()` ends both.
LIVE_WATCH_JS = """() => {
  const live = window.__live = {painted: [], tasks: [], start: null, running: true};
  const observer = new PerformanceObserver((list) => list.getEntries().forEach((e) => live.tasks.push(e.duration)));
  observer.observe({type: 'longtask'});
  const sample = () => {
    if (!live.running) return;
    const canvas = document.querySelector('#dg-canvas [data-forward]');
    const forward = canvas ? Number(canvas.dataset.forward) : -1, last = live.painted[live.painted.length - 1];
    if (live.start !== null && forward >= 0 && (!last || last[0] !== forward)) {
      live.painted.push([forward, performance.now() - live.start]);
    }
    requestAnimationFrame(sample);
  };
  requestAnimationFrame(sample);
  live.stop = () => { live.running = false; observer.disconnect(); return live; };
}"""
LIVE_CLICK_JS = "() => { window.__live.start = performance.now(); document.querySelector('#dg-generate').click(); }"
# True once the page's run (a key other than `before`) has ended and its last forward is on screen
LIVE_PLAYED_JS = """(before) => {
  const live = window.dgLive, canvas = document.querySelector('#dg-canvas [data-forward]');
  const meter = document.querySelector('#dg-meter .dg-meter');
  return Boolean(live.have() && live.have().split(':')[0] !== before && live.done() && meter
    && meter.dataset.state === 'done' && canvas.dataset.playing === 'false'
    && Number(canvas.dataset.forward) === live.player().last());
}"""
# Feeds the messages in `window.__messages` to the player, message k at k / rate s after the first
LIVE_FEED_JS = """(rate) => new Promise((resolve) => {
  const messages = window.__messages, late = [];
  window.__live.start = performance.now();
  const next = (k) => {
    if (k === messages.length) { resolve(late); return; }
    const due = window.__live.start + k * 1000 / rate;
    const wait = due - performance.now();
    if (wait > 0) { setTimeout(() => next(k), wait); return; }
    late.push(-wait);
    window.dgLive.feed(messages[k]);
    next(k + 1);
  };
  next(0);
})"""


def set_run_number(page, label: str, value) -> None:
    """Type `value` into the number box of the slider labelled `label` and press Enter."""
    box = page.locator(f"input[aria-label='number input for {label}']")
    box.fill(str(value))
    box.press("Enter")


def live_page(browser, url: str, pace: str):
    """A fresh page on `url` with the player mounted, the plots library loaded and the pace set."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(url)
    page.wait_for_function("() => window.dgLive && window.dgLive.player() && typeof Plotly !== 'undefined'",
                           timeout=120_000)
    page.select_option("#dg-replay-pace", pace)
    return page


def live_figures(live: dict, run: int, extra: str = "") -> str:
    """One line of figures from the page's notes `live` of a run of `run` forwards."""
    painted = sorted({forward for forward, _ in live["painted"]})
    first = live["painted"][0][1] if live["painted"] else math.nan
    span = (live["painted"][-1][1] - first) / 1000 if live["painted"] else math.nan
    tasks = live["tasks"]
    return (f"{len(painted)}/{run} forwards painted; first painted forward {first:.0f} ms after the "
            f"{'first message' if extra.startswith('fed') else 'click'}; longest task {max(tasks, default=0):.0f} ms "
            f"({len(tasks)} over 50 ms, {sum(1 for t in tasks if t > 100)} over 100 ms); playback {span:.2f} s"
            f"{'; ' + extra if extra else ''}")


def live_run(browser, url: str, pace: str, setup) -> str:
    """A run of the served app in a fresh page at `pace` after `setup(page)`: its figures."""
    page = live_page(browser, url, pace)
    try:
        setup(page)
        page.evaluate(LIVE_WATCH_JS)
        page.evaluate(LIVE_CLICK_JS)
        page.wait_for_function(LIVE_PLAYED_JS, arg="", timeout=600_000, polling=100)
        live = page.evaluate("window.__live.stop()")
        run, end = page.evaluate("""() => { const d = window.dgLive.data(), f = d.frames[d.frames.length - 1];
            return [d.frames.length, [d.frames[0].elapsed_s, f.elapsed_s]]; }""")
        return live_figures(live, run, f"engine: first frame {end[0] * 1000:.0f} ms, run {end[1]:.2f} s")
    finally:
        page.close()


def synthetic_feed(positions: int, steps: int) -> list[str]:
    """Feed messages of a synthetic run of one `positions`-position canvas in `steps` forwards, one a forward."""
    trace = synthetic_trace(canvas=positions, steps=steps, blocks=1, alternatives=True)
    frames = list(trace.frames)
    return [frames_message(None, None, frames[:k + 1], k, final=k == len(frames) - 1, trace=trace)
            for k in range(len(frames))]


def main_live(argv: list[str] | None = None) -> int:
    """`live`: the Playground's live view in a real browser (see LIVE_DOC)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.browser live", description=LIVE_DOC)
    parser.add_argument("--model", help="model for the served app (default: the embedded diffgemma-tiny)")
    parser.add_argument("--paces", nargs="+", default=["default", "live"], choices=["teach", "default", "fast", "live"],
                        help="playback paces (default: default live)")
    parser.add_argument("--long-prompt", default="And he said", help="(b)'s raw prompt (default 'And he said')")
    parser.add_argument("--long-tokens", type=int, default=512, help="(b)'s max new tokens (default 512)")
    parser.add_argument("--long-steps", type=int, help="(b)'s max denoising steps (default: the recommended)")
    parser.add_argument("--synthetic-positions", type=int, default=256, help="(c)'s canvas (default 256)")
    parser.add_argument("--synthetic-steps", type=int, default=48, help="(c)'s forwards (default 48)")
    parser.add_argument("--synthetic-rate", type=float, default=60.0, help="(c)'s forwards a second (default 60)")
    parser.add_argument("--only", nargs="+", choices=["a", "b", "c"], default=["a", "b", "c"], help="runs to measure")
    args = parser.parse_args(argv)
    if min(args.long_tokens, args.synthetic_positions, args.synthetic_steps) < 1 or args.synthetic_rate <= 0:
        raise SystemExit("error: token, position and step counts must be at least 1, the rate positive")

    def long_run(page):
        page.fill("#dg-prompt textarea", args.long_prompt)
        page.check("#dg-raw input[type=checkbox]")
        page.get_by_label("Adaptive stopping").uncheck()
        set_run_number(page, "Max new tokens", args.long_tokens)
        if args.long_steps:
            set_run_number(page, "Max denoising steps", args.long_steps)

    runs = {"a": ("(a) default prompt", lambda page: None),
            "b": (f"(b) raw {args.long_prompt!r}, {args.long_tokens} tokens, adaptive stopping off", long_run)}
    print(f"load average (1 min) {os.getloadavg()[0]:.2f} at start", flush=True)
    with launched_app(args.model, "cpu", timeout_s=300) as (url, _):
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            try:
                warm = live_page(browser, url, "live")  # the engine's first run pays its warm-up: not measured
                warm.evaluate(LIVE_WATCH_JS)
                warm.evaluate(LIVE_CLICK_JS)
                warm.wait_for_function(LIVE_PLAYED_JS, arg="", timeout=600_000)
                warm.close()
                for name in (n for n in ("a", "b") if n in args.only):
                    title, setup = runs[name]
                    for pace in args.paces:
                        load = os.getloadavg()[0]
                        figures = live_run(browser, url, pace, setup)
                        print(f"{title}, pace {pace}: {figures}; load {load:.2f}", flush=True)
                if "c" in args.only:
                    messages = synthetic_feed(args.synthetic_positions, args.synthetic_steps)
                    size = sum(len(m.encode()) for m in messages) / len(messages)
                    for pace in args.paces:
                        page = live_page(browser, url, pace)
                        try:
                            page.evaluate("(m) => { window.__messages = m; }", messages)
                            page.evaluate(LIVE_WATCH_JS)
                            load = os.getloadavg()[0]
                            late = page.evaluate(LIVE_FEED_JS, args.synthetic_rate)
                            page.wait_for_function("() => window.dgLive.done() && document.querySelector("
                                                   "'#dg-canvas [data-forward]').dataset.playing === 'false'",
                                                   timeout=600_000, polling=100)
                            live = page.evaluate("window.__live.stop()")
                        finally:
                            page.close()
                        print(f"(c) synthetic {args.synthetic_positions} x {args.synthetic_steps} at "
                              f"{args.synthetic_rate:g}/s, pace {pace}: "
                              + live_figures(live, len(messages), f"fed {len(messages)} messages of {size / 1024:.0f} "
                                             f"KiB on average, the feeder up to {max(late, default=0):.0f} ms late")
                              + f"; load {load:.2f}", flush=True)
            finally:
                browser.close()
    return 0


COMMANDS = {"canvas": main_canvas, "latency": main_latency, "sessions": main_sessions, "replay": main_replay,
            "render": main_render, "live": main_live}


def main(argv: list[str] | None = None) -> int:
    """Run one command (`COMMANDS`) with the rest of `argv` (`bench.run_command`)."""
    return run_command(COMMANDS, "python -m benchmarks.browser", __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
