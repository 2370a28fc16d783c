"""Driving the playground's page in headless Chromium: shared by the browser, concurrency and security tests.

The browser is Debian's Chromium at `CHROMIUM`, launched by the `browser` fixture in `conftest.py`; Playwright never
downloads one.
"""

from __future__ import annotations

import socket

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]


def open_page(browser, url, width=1280, height=900):
    """A new page on `url` once Generate is shown; returns (page, problems), the console errors, page errors and
    dialogs seen on it."""
    page = browser.new_page(viewport={"width": width, "height": height})
    problems = []
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("dialog", lambda d: (problems.append(f"dialog: {d.message}"), d.dismiss()))
    page.goto(url)
    page.wait_for_selector("#dg-generate")
    return page, problems


# What the heatmap's plot shows: its title, whether it has the animation's buttons, its size
HEATMAP_STATE = """() => {
  const plot = document.querySelector('#dg-heatmap .js-plotly-plot');
  if (!plot || !plot.layout) return {plot: !!plot};
  const title = plot.layout.title && (plot.layout.title.text || plot.layout.title);
  return {title: String(title), updatemenus: (plot.layout.updatemenus || []).length,
          buttons: plot.querySelectorAll('.updatemenu-button').length, width: plot.clientWidth,
          height: plot.clientHeight, meter: document.querySelector('#dg-meter').innerText.slice(0, 200)};
}"""


def record_states(page, state: str) -> None:
    """From now on, note in `window.__states` (JSON texts) each new value of `state`, a JS arrow function of no
    arguments, after every change to the page: a state that lasts one update is noted, never missed between polls."""
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


def wait_for_play_buttons(page, problems) -> None:
    """Wait for the final heatmap's play buttons; raise AssertionError with what the heatmap held and the page's
    `problems` when they do not come."""
    try:
        page.wait_for_selector("#dg-heatmap .updatemenu-button")
    except Exception as error:
        state = page.evaluate(HEATMAP_STATE)
        raise AssertionError(f"no play button on the final heatmap: {state}; page problems: {problems}") from error


def run_raw(page, prompt: str, tokens: int, steps: int, timeout_ms: int = 60_000) -> None:
    """Run the raw `prompt` for `tokens` tokens at up to `steps` steps a block, to its final frame."""
    page.fill("#dg-prompt textarea", prompt)
    page.check("#dg-raw input[type=checkbox]")
    set_number(page, "Max new tokens", tokens)
    set_number(page, "Max denoising steps", steps)
    page.click("#dg-generate")
    page.wait_for_selector("#dg-meter .dg-meter[data-state='done']", timeout=timeout_ms)


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
