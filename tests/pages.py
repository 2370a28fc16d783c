"""Driving the playground's page in headless Chromium: shared by the browser, concurrency and security tests.

The browser is Debian's Chromium at `CHROMIUM`, launched by the `browser` fixture in `conftest.py`; Playwright never
downloads one.
"""

from __future__ import annotations

import socket

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]


def open_page(browser, url, width=1280, height=900, **context):
    """A new page on `url` once Generate is shown; returns (page, problems), the console errors, page errors and
    dialogs seen on it. `context`: Playwright context options (`reduced_motion="reduce"`, `has_touch=True`...)."""
    page = browser.new_page(viewport={"width": width, "height": height}, **context)
    problems = []
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("dialog", lambda d: (problems.append(f"dialog: {d.message}"), d.dismiss()))
    page.goto(url)
    page.wait_for_selector("#dg-generate")
    page.wait_for_function("() => window.dgLive && window.dgLive.player()")  # the Playground's player is mounted
    return page, problems


# What the heatmap's plot shows (the player draws it with Plotly into the plain div #dg-heatmap): its title, its
# size, the meter's words and the player's state
HEATMAP_STATE = """() => {
  const plot = document.querySelector('#dg-heatmap'), canvas = document.querySelector('#dg-canvas [data-forward]');
  const state = {plotly: typeof Plotly !== 'undefined',
                 meter: document.querySelector('#dg-meter').innerText.slice(0, 200),
                 forward: canvas && canvas.dataset.forward, playing: canvas && canvas.dataset.playing,
                 run: window.dgLive && window.dgLive.have(), ended: window.dgLive && window.dgLive.done()};
  if (!plot || !plot.layout) return {...state, plot: !!plot};
  const title = plot.layout.title && (plot.layout.title.text || plot.layout.title);
  return {...state, title: String(title), width: plot.clientWidth, height: plot.clientHeight};
}"""

# The player's own controls, drawn by the page (the heatmap has no animation buttons of its own)
PLAYER_BUTTONS = ("#dg-replay-prev", "#dg-replay-play", "#dg-replay-next", "#dg-replay-end")

# True once the page's run (a run key other than `before`) has ended in the engine and its playback has put the
# engine's last forward on screen and stopped there
PLAYED = """(before) => {
  const live = window.dgLive, canvas = document.querySelector('#dg-canvas [data-forward]');
  const meter = document.querySelector('#dg-meter .dg-meter');
  if (!live || !live.have() || live.have().split(':')[0] === before || !live.done() || !canvas) return false;
  return meter && meter.dataset.state === 'done' && canvas.dataset.playing === 'false'
    && Number(canvas.dataset.forward) === live.player().last() && !live.player().playing();
}"""


def wait_for_state(page, condition: str, timeout_ms: int = 30_000) -> None:
    """Wait until the JS expression `condition` holds; AssertionError with the player's state when it does not."""
    try:
        page.wait_for_function(condition, timeout=timeout_ms)
    except Exception as error:
        raise AssertionError(f"not reached: {condition}; the page: {page.evaluate(HEATMAP_STATE)}") from error


def run_key(page) -> str:
    """The key of the run the page's player holds ("" before any)."""
    return page.evaluate("window.dgLive.have().split(':')[0]")


def wait_for_played(page, before: str = "", timeout_ms: int = 60_000) -> None:
    """Wait until a run other than the one keyed `before` (`run_key` before its click) has ended (the meter is done)
    and its playback shows the engine's last forward; AssertionError with the page's state when it does not."""
    try:
        page.wait_for_selector("#dg-meter .dg-meter[data-state='done']", timeout=timeout_ms)
        page.wait_for_function(PLAYED, arg=before, timeout=timeout_ms)
    except Exception as error:
        raise AssertionError(f"the run was not played to its end: {page.evaluate(HEATMAP_STATE)}") from error


def wait_for_plots(page, problems) -> None:
    """Wait until the player has drawn the heatmap, unmasking order and entropy plots (Plotly loads after the page);
    raise AssertionError with what the heatmap held and the page's `problems` when they do not come."""
    try:
        page.wait_for_function("['#dg-heatmap', '#dg-order', '#dg-entropy'].every(s => "
                               "document.querySelector(s + '.js-plotly-plot .main-svg'))")
    except Exception as error:
        state = page.evaluate(HEATMAP_STATE)
        raise AssertionError(f"the player drew no plots: {state}; page problems: {problems}") from error


def set_pace(page, pace: str) -> None:
    """Choose the playback pace: "teach", "default", "fast" or "live" (as it computes)."""
    page.select_option("#dg-replay-pace", pace)


def record_states(page, state: str) -> None:
    """From now on, note in `window.__states` each new value of `state` (a JS arrow function of no arguments,
    its value JSON) after every change to the page: a state that lasts one update is noted, never missed."""
    page.evaluate(f"""() => {{
        const state = {state}, seen = window.__states = [];
        const note = () => {{
            const now = JSON.stringify(state());
            if (seen[seen.length - 1] !== now) seen.push(now);
        }};
        new MutationObserver(note).observe(document.body, {{childList: true, subtree: true, attributes: true,
                                                             characterData: true}});
        note();
    }}""")


def recorded_states(page) -> list:
    """The states `record_states` noted so far, oldest first."""
    return page.evaluate("window.__states.map(JSON.parse)")


def run_raw(page, prompt: str, tokens: int, steps: int, timeout_ms: int = 60_000) -> None:
    """Run the raw `prompt` for `tokens` tokens at up to `steps` steps a block, until the meter is done and the
    playback shows the run's last forward."""
    page.fill("#dg-prompt textarea", prompt)
    page.check("#dg-raw input[type=checkbox]")
    set_number(page, "Max new tokens", tokens)
    set_number(page, "Max denoising steps", steps)
    before = run_key(page)
    page.click("#dg-generate")
    wait_for_played(page, before, timeout_ms)


def set_number(page, label, value):
    """Type `value` into the number box of the slider labelled `label` and press Enter."""
    box = page.locator(f"input[aria-label='number input for {label}']")
    box.fill(str(value))
    box.press("Enter")


def set_up_a_long_run(page):
    """A run of many seconds: a raw prompt, 1024 tokens, 64 steps, adaptive stopping off. The embedded model (v2)
    ends most prompts at EOS within a block or two; "And he said" with seed 0 runs 16 blocks (36 s on a quiet 2-core
    CPU; at 3 steps a canvas, 16 blocks too)."""
    page.fill("#dg-prompt textarea", "And he said")
    page.check("#dg-raw input[type=checkbox]")
    page.get_by_label("Adaptive stopping").uncheck()
    set_number(page, "Max new tokens", 1024)
    set_number(page, "Max denoising steps", 64)


def free_port() -> int:
    """A TCP port that was free a moment ago on 127.0.0.1 (for serving the app in a test)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
