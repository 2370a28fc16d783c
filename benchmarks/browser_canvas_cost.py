"""The browser's time per live-canvas update at the real canvas size (issue 11): 256 chips per frame at the live rate.

    python benchmarks/browser_canvas_cost.py                       # 256 and 64 positions at the app's rates, 90 each
    python benchmarks/browser_canvas_cost.py --positions 256 --rate 15 --updates 150 --finished-blocks 3

Method: `app.py` is served as a subprocess (the embedded model unless `--model`; the page, its CSS and layout are
the same for every model) and opened in Debian's Chromium (headless, the flags of tests/pages.py). The canvas
updates are real `canvas_view.live_html` output of random frames at the real vocabulary (the stand-in's Gemma
tokenizer, 262,144 ids: special tokens labelled, byte pieces grouped; about 30% of positions accepted, the rest
noise with their draft in the tooltip), built on the server side of this script, not by a decoder forward (one
costs seconds at that vocabulary on a CPU). Above the live block, `--finished-blocks` finished blocks of the same
size sit in the stack, as in the middle of a run. In the page, a loop replaces the live canvas's HTML (the element
Gradio's HTML component writes into) at `--rate` updates per second (default: the app's live rate for that canvas,
`diffgemma_ui.runs.default_live_rate`: 15/s at 64 positions, 7/s at 256), and times each update:

- parse: `innerHTML =` itself (HTML parsing and DOM building, synchronous);
- to paint: from the replacement to the second `requestAnimationFrame` after it, i.e. until the frame that
  contains the update has been produced (includes waiting for the frame boundary, up to 16.7 ms at 60 Hz);
- style, layout, script and task time per update from Chromium's own counters (CDP `Performance.getMetrics`:
  RecalcStyleDuration, LayoutDuration, ScriptDuration, TaskDuration, summed over the updates and divided);
- long tasks (> 50 ms, `longtask` entries) and long animation frames (`long-animation-frame`, > 50 ms);
- input responsiveness while it runs: a key is pressed in the prompt box every 150 ms, and the page records the
  delay until its keydown handler ran and until the next frame was produced.

Prints ms per update p50 / p95 / max for each size. What it leaves out: Gradio's own handling of a streamed message
(JSON parsing, the Svelte update), the meter and text updates that the app sends with each frame, and rasterization
on a real GPU (`--disable-gpu`: software raster, as in the tests).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "benchmarks"))

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
  while (el !== root) { path.unshift(Array.prototype.indexOf.call(el.parentElement.children, el)); el = el.parentElement; }
  let target = document.querySelector('#dg-stack');
  for (const i of path) target = target.children[i];
  target.innerHTML = html;
  return target.querySelectorAll('.dg-chip').length;
}
"""

METRICS = ("RecalcStyleDuration", "LayoutDuration", "ScriptDuration", "TaskDuration")


def percentile(values, q):
    """Nearest-rank percentile `q` (0-100) of `values` (NaN when empty)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q / 100 * len(ordered))) - 1]


def random_frames(token_text, vocabulary: int, positions: int, count: int, seed: int):
    """`count` live frames of `positions` random ids (about 30% accepted), strings and kinds from `token_text`."""
    from engine import Frame

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
    import dataclasses

    from diffgemma_ui.canvas_view import stack_html

    done = []
    for b, frame in enumerate(random_frames(token_text, vocabulary, positions, blocks, seed=99)):
        done.append(dataclasses.replace(frame, block_index=b, block_done=True, step_index=47,
                                        committed_ids=frame.draft_ids * (b + 1), accepted=[True] * positions))
    return stack_html(done)


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
        f"  ms per update                       p50     p95     max",
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--positions", type=int, nargs="+", default=[256, 64], help="canvas sizes (default 256 64)")
    parser.add_argument("--rate", type=float, help="updates per second (default: the app's live rate for each size)")
    parser.add_argument("--updates", type=int, default=90, help="updates per size (default 90)")
    parser.add_argument("--finished-blocks", type=int, default=3, help="finished blocks in the stack (default 3)")
    parser.add_argument("--model", help="model for the served app (default: the embedded one; the page is the same)")
    parser.add_argument("--tokenizer", help="tokenizer folder for the tokens (default: the stand-in's, 262,144 ids)")
    parser.add_argument("--extra-css", help="CSS added to the page before measuring (to try a rendering change)")
    parser.add_argument("--json", action="store_true", help="print the raw results as JSON too")
    args = parser.parse_args()
    if (args.rate is not None and args.rate <= 0) or args.updates < 1 or min(args.positions) < 1:
        raise SystemExit("error: --rate must be positive, --updates and --positions at least 1")

    from playwright.sync_api import sync_playwright
    from transformers import AutoTokenizer

    from diffgemma_ui.canvas_view import live_html
    from diffgemma_ui.runs import default_live_rate
    from engine.tokens import TokenText
    from load_test import launch_app
    from pages import CHROMIUM, CHROMIUM_ARGS

    if args.tokenizer is None:
        from standin import ensure_standin

        args.tokenizer = ensure_standin()
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    token_text = TokenText(tokenizer, eos_token_ids=[1, 106, 50], pad_token_id=0,
                           special_ids=[255999, 258880, 258882])
    vocabulary = len(tokenizer)
    print(f"tokenizer {args.tokenizer} ({vocabulary:,} ids); load average {os.getloadavg()[0]:.2f} at start",
          flush=True)

    import tempfile

    with tempfile.NamedTemporaryFile("w+", suffix=".log") as log:
        process, url = launch_app(args.model, "cpu", timeout_s=300, stderr_file=log)
        try:
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
        finally:
            process.terminate()
            try:
                process.wait(20)
            except Exception:  # noqa: BLE001
                process.kill()
    if args.json:
        print(json.dumps({str(k): v for k, v in raw.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
