"""UI latency and overhead, measured in a real headless browser.

    PYTHONPATH=. python benchmarks/ui_latency.py [--runs 5] [--max-new-tokens N] [--steps N] [--seed 0]
                                                 [--max-fps F] [--browser-cpu N] [--json]

Serves the playground in-process on the embedded model (or --model), with the app's torch threads and the
checkpoint's recommended settings unless told otherwise, and drives it with Playwright + Chromium:

- first frame: time from pressing Generate (a click dispatched in the page, timed with `performance.now()`) to the
  first canvas frame in the DOM (the canvas's `data-forward` becomes >= 0), median over --runs. Reported next to
  the engine's own time to first frame (prompt encoding + first decoder forward, engine clock) of the same run,
  read from the meter; the difference is what the UI adds (queue, worker start, render, transport, DOM update).
- tokens/s: the UI's final reported tokens/s (engine clock, read from the meter) versus `engine.generate()` run
  bare in this process with the same prompt, settings and seed, interleaved run by run; ratio of the medians.
  The bare run happens in a fresh thread, as the UI's worker does (torch's CPU thread pool behaves differently in
  the main thread; `--bare-in-main-thread` measures that instead). A third figure runs the same request through
  the UI's streaming handler in-process with no browser (worker, coalescing and all rendering, no HTTP/DOM), which
  separates the server-side cost from a browser competing for the same CPU.
- CPU cost: CPU seconds of this process (engine + server + rendering) during the UI run over those of the bare run,
  with and without the browser's CPU; unlike tokens/s, these ratios hold up on a machine shared with other work.

Placement: by default the browser, the server and the engine share every CPU, as on a laptop running a local demo;
on a 2-core machine the browser's work then slows the engine through the shared core and memory bandwidth, which
is not what a served playground sees (the browser is on the user's machine). `--browser-cpu N` pins Chromium to
CPU N and this process (server, engine, bare runs) to the rest, a stand-in for that.

Targets: first frame < 300 ms after pressing Generate; UI/bare tokens/s ratio >= 0.95. Chromium must be at
/usr/bin/chromium (never downloaded).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]
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


def stream_in_process(playground, prompt, settings, seed) -> float:
    """Tokens/s of one run through the UI's own streaming handler, in this process, without a browser: the worker
    thread, coalescing and every render (HTML, figures) but no HTTP or DOM. Read from the final meter."""
    from diffgemma_ui.session import SessionState

    last = None
    for outputs in playground.generate_stream(
        SessionState(), prompt, True, settings.max_new_tokens, settings.max_denoising_steps, settings.entropy_bound,
        settings.t_min, settings.t_max, settings.stability_threshold, settings.confidence_threshold,
        settings.adaptive_stopping, seed,
    ):
        last = outputs
    meter = next(o for o in last if isinstance(o, str) and "dg-meter" in o)
    return float(re.search(r'data-tps="([^"]+)"', meter).group(1))


def pin_own_threads(cpus: set[int]) -> None:
    """Pin every thread of this process to `cpus` (Linux); threads started later inherit it from their creator."""
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(int(tid), cpus)


def median(values):
    return statistics.median(values) if values else float("nan")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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

    import torch
    from playwright.sync_api import sync_playwright

    from diffgemma_ui import build_app
    from engine import DiffusionEngine, load_model
    from bench import free_port
    from engine.loading import DEFAULT_MODEL, set_serving_threads

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
                streamed_tps = stream_in_process(app.playground, args.prompt, settings, args.seed)
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


if __name__ == "__main__":
    sys.exit(main())
