"""The offline HTML replay in headless Chromium: no request but the file itself (offline and online), no page error,
plays to the last step, keyboard and slider work, it draws what the playground's views draw (canvas, stack, meter,
figures) for every frame, hostile strings never run and show as text. Screenshots go to artifacts/replay/ (looked
at by hand)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from benchmarks.browser import synthetic_trace
from diffgemma_ui import canvas_view, meter, plots
from diffgemma_ui.text import visible_token
from engine.trace import Trace, load_trace, write_replay
from test_security import HOSTILE as HOSTILE_TOKENS
from test_trace import hostile_trace

pytestmark = pytest.mark.slow
SHOTS = Path(__file__).resolve().parent.parent / "artifacts" / "replay"
# Token strings of every kind a canvas shows: text with whitespace, invisible and right-to-left characters, empty,
# special tokens (pad, end-of-sequence, markers, unknown ids) and byte pieces that form characters or do not
VARIED = [(" the", "text"), ("\n\n", "text"), ("", "text"), ("<pad>", "pad"), ("<eos>", "eos"),
          ("<|turn>", "special"), ("<turn|>", "special"), ("<id:99>", "special"), ("<0xE2>", "byte"),
          ("<0x80>", "byte"), ("<0x94>", "byte"), ("<0xF0>", "byte"), ("\u202e rtl\u200b", "text"),
          ("\x00\x7f\x85", "text"), ("\u00e9\U0001f600 x", "text"), ("a b\tc\r", "text"), ("<0x41>", "byte"),
          ("<start_of_turn>", "special"), ("${x}", "text"), ("\ufdd0", "text")]


def open_offline(browser, path: Path, *, offline: bool = True):
    """The page at `path` in a fresh context (offline unless told); returns (page, requests, problems). Online,
    every request is recorded and refused."""
    context = browser.new_context(offline=offline, viewport={"width": 1280, "height": 900})
    page = context.new_page()
    requests, problems = [], []
    page.on("request", lambda r: requests.append(r.url))
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("dialog", lambda d: (problems.append(f"dialog: {d.message}"), d.dismiss()))
    if not offline:
        page.route("**/*", lambda route: route.continue_() if route.request.url == path.as_uri() else route.abort())
    page.goto(path.as_uri())
    page.wait_for_function("document.body.dataset.ready !== 'false'", timeout=60_000)
    return page, requests, problems


def forward(page) -> int:
    return int(page.evaluate("document.body.dataset.forward"))


def varied_trace(*, stopped: bool = False) -> Trace:
    """3 blocks of a 24-position canvas, 4 steps each, with `VARIED` tokens and their kinds; a byte run at positions
    0-2 that forms one character, a lone lead byte at 3; the last block ends at end-of-sequence after 5 tokens.
    `stopped`: the run is stopped in its last block's third step instead."""
    doc = synthetic_trace(canvas=24, steps=4, blocks=3, vocab=len(VARIED) * 3, seed=5,
                          token_text=lambda i: VARIED[i % len(VARIED)][0]).to_dict()
    doc["kinds"] = {key: VARIED[int(key) % len(VARIED)][1] for key in doc["tokens"]
                    if VARIED[int(key) % len(VARIED)][1] != "text"}
    run = [8, 9, 10, 11]  # E2 80 94 is one character, F0 forms none
    for frame in doc["frames"]:
        frame["draft_ids"][:4] = run
        frame["input_ids"][:4] = run
        # alternatives: the draft, then the noisy input token; 0.625 and 0.125 are exact ties for "{:.0%}"
        frame["alternatives"] = [{"ids": [d, i], "probs": [0.625, 0.125]}
                                 for d, i in zip(frame["draft_ids"], frame["input_ids"])]
    first_block = [f for f in doc["frames"] if f["block"] == 0]
    first_block[1]["accepted"][6], first_block[2]["accepted"][6] = 1, 0  # position 6 re-melts at step 3
    end = doc["frames"][-1]
    end["committed_ids"] = end["committed_ids"][:2 * 24 + 5]
    end["committed_tokens"] = 2 * 24 + 4
    if stopped:
        doc["frames"] = doc["frames"][:-1]
        end = doc["frames"][-1]
        end.update(done=True, stop_reason="cancelled")
    return load_trace(json.dumps(doc))


def expected_views(trace: Trace, k: int) -> dict:
    """What the playground's views show at frame `k` (the page's replay as the UI draws it)."""
    frame = trace.frames[k]
    blocks_done = frame.block_index + (1 if frame.block_done else 0)
    finished = [b[-1] for b in trace.blocks[:blocks_done] if b[-1].block_done]
    status = canvas_view.STOP_REASONS.get(frame.stop_reason, frame.stop_reason) if k == len(trace.frames) - 1 else ""
    live = None if frame.block_done else frame
    block = trace.blocks[frame.block_index]
    heatmap = plots.confidence_heatmap(block, animate=False, hover=True)
    order = plots.unmasking_order(frame)
    entropy = plots.entropy_and_acceptance(block)
    return {
        "canvas": canvas_view.live_html(live, newest=frame, status=status),
        "stack": canvas_view.stack_html(finished),
        "meter": meter.meter_html(frame),
        "heatmap": {"z": heatmap["data"][0]["z"], "hovertext": heatmap["data"][0]["hovertext"],
                    "dots": [heatmap["data"][1]["x"], heatmap["data"][1]["y"]],
                    "melts": [heatmap["data"][2]["x"], heatmap["data"][2]["y"]],
                    "title": heatmap["layout"]["title"]["text"], "yrange": heatmap["layout"]["yaxis"]["range"]},
        "order": {"y": order["data"][0]["y"], "hovertext": order["data"][0]["hovertext"],
                  "colours": order["data"][0]["marker"]["color"], "title": order["layout"]["title"]["text"],
                  "yrange": order["layout"]["yaxis"]["range"]},
        "entropy": {"accepted": entropy["data"][0]["y"], "mean": entropy["data"][1]["y"],
                    "title": entropy["layout"]["title"]["text"]},
    }


SHOWN_VIEWS = """(k) => {
    window.dgReplay.show(k);
    const html = (id) => document.getElementById(id).innerHTML;
    const plot = (id) => document.getElementById(id);
    const [heat, dots, melts] = plot('dg-heatmap').data;
    const order = plot('dg-order').data[0], entropy = plot('dg-entropy').data;
    return {
        canvas: html('dg-canvas'), stack: html('dg-stack'), meter: html('dg-meter'),
        heatmap: {z: heat.z, hovertext: heat.hovertext, dots: [dots.x, dots.y], melts: [melts.x, melts.y],
                  title: plot('dg-heatmap').layout.title.text, yrange: plot('dg-heatmap').layout.yaxis.range},
        order: {y: order.y, hovertext: order.hovertext, colours: order.marker.color,
                title: plot('dg-order').layout.title.text, yrange: plot('dg-order').layout.yaxis.range},
        entropy: {accepted: entropy[0].y, mean: entropy[1].y, title: plot('dg-entropy').layout.title.text},
    };
}"""
# The playground's HTML as the browser reads it (serialized again), so both sides compare as DOM
NORMALIZED = "(html) => { const t = document.createElement('template'); t.innerHTML = html; return t.innerHTML; }"
PLAYING = re.compile(r' data-playing="(true|false)"')
TITLE = re.compile(r'title="([^"]*)"')
PERCENTS = re.compile(r"\d+%")
FIRST_STEP = re.compile(r"first accepted: step (\d+)")


def alternatives_as_percentages(title: str) -> str:
    """A chip title with its "why this token?" lines as the probabilities they list: the player's labels the
    alternatives' control tokens (the Python view quotes their text) and adds the alternatives at the step where the
    token was first accepted (a line the Python view, which lacks that earlier frame, does not have) before the
    current ones ("now:"). The added line must name the title's first-accepted step."""
    lines, kept = title.split("\n"), []
    first = FIRST_STEP.search(title)
    for line in lines:
        if line.startswith("why this token? at step "):
            assert first and line.startswith(f"why this token? at step {first[1]}, where it was first accepted: ")
            continue
        if line.startswith(("why this token? ", "now: ")):
            line = "alternatives " + " ".join(PERCENTS.findall(line))
        kept.append(line)
    return "\n".join(kept)


def player_only_parts(html: str) -> tuple[str, list, list]:
    """`html` (the player's canvas or stack) without what only the player draws, and those parts: the canvas's
    data-playing, and the positions marked dg-new (first accepted in the forward on screen)."""
    playing = PLAYING.findall(html)
    chips = re.findall(r'<span class="(dg-chip[^"]*)"', html)
    new = [k for k, classes in enumerate(chips) if " dg-new" in classes]
    html = PLAYING.sub("", html).replace(" dg-new", "")
    return TITLE.sub(lambda m: f'title="{alternatives_as_percentages(m[1])}"', html), playing, new


def test_replay_plays_offline_to_the_last_step(browser, tmp_path):
    trace = synthetic_trace(canvas=64, steps=8, blocks=2, vocab=262_144)
    path = write_replay(trace, tmp_path / "replay.html")
    page, requests, problems = open_offline(browser, path)
    try:
        assert page.evaluate("document.body.dataset.ready") == "true", page.inner_text("#dg-replay-error")
        last = len(trace.frames) - 1
        assert forward(page) == last  # opens on the finished run
        page.keyboard.press("Home")
        assert forward(page) == 0
        assert page.locator("#dg-canvas .dg-block-live .dg-chip").count() == 64
        assert page.locator("#dg-stack .dg-block:not([hidden])").count() == 0
        page.keyboard.press("ArrowRight")
        page.keyboard.press("ArrowRight")
        assert forward(page) == 2
        page.keyboard.press("ArrowLeft")
        assert forward(page) == 1
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / "step2.png"), full_page=True)
        page.click("#dg-replay-play")
        assert page.evaluate("document.body.dataset.playing") == "true"
        page.wait_for_function("document.body.dataset.playing === 'false'", timeout=60_000)
        assert forward(page) == last
        assert page.locator("#dg-stack .dg-block:not([hidden])").count() == 2  # both blocks committed
        assert "reached max new tokens" in page.inner_text("#dg-canvas")
        assert page.locator("#dg-heatmap .main-svg").count() > 0 and page.locator("#dg-order .main-svg").count() > 0
        page.locator("#dg-replay-slider").fill("9")
        assert forward(page) == 9
        assert page.inner_text("#dg-replay-label").startswith("forward 10/16 · block 2 · step 2")
        page.screenshot(path=str(SHOTS / "slider.png"), full_page=True)
        page.hover("#dg-heatmap .nsewdrag")
        buttons = page.evaluate("[...document.querySelectorAll('#dg-heatmap .modebar-btn')].map(b => b.dataset.title)")
        assert buttons and not {"Box Select", "Lasso Select"} & set(buttons), buttons
        assert page.locator(".modebar-btn[data-attr='sendDataToCloud'], .modebar-btn[data-val='select'], "
                            ".modebar-btn[data-val='lasso']").count() == 0
        assert problems == []
        assert requests == [path.as_uri()], "the page made a network request"
    finally:
        page.context.close()


def test_replay_plots_keep_only_buttons_that_work_offline_and_count_in_whole_positions(browser, tmp_path):
    trace = synthetic_trace(canvas=64, steps=8, blocks=2, vocab=262_144)
    page, requests, problems = open_offline(browser, write_replay(trace, tmp_path / "replay.html"))
    try:
        for plot in ("#dg-heatmap", "#dg-order", "#dg-entropy"):
            titles = page.locator(f"{plot} .modebar-btn").evaluate_all("bs => bs.map(b => b.dataset.title)")
            assert "Download plot as a PNG" in titles and "Reset axes" in titles, titles
            assert not {"Box Select", "Lasso Select", "Share chart..."} & set(titles), (plot, titles)
        ticks = page.locator("#dg-entropy .y2tick text").all_text_contents()
        assert ticks == ["0", "10", "20", "30", "40", "50", "60"], ticks  # not the left axis's 17.3, 34.6, ...
        assert problems == [] and requests == [page.url]
    finally:
        page.context.close()


@pytest.mark.parametrize("stopped", [False, True], ids=["finished", "stopped"])
def test_page_draws_what_the_playground_views_draw(browser, tmp_path, stopped):
    trace = varied_trace(stopped=stopped)
    path = write_replay(trace, tmp_path / "varied.html")
    page, requests, problems = open_offline(browser, path)
    try:
        assert page.evaluate("document.body.dataset.ready") == "true", page.inner_text("#dg-replay-error")
        last = len(trace.frames) - 1
        for k in range(len(trace.frames)):
            want = expected_views(trace, k)
            for view in ("canvas", "stack", "meter"):
                want[view] = page.evaluate(NORMALIZED, want[view])
            shown = page.evaluate(SHOWN_VIEWS, k)
            for view in ("canvas", "stack"):  # what the player alone draws, checked on its own
                shown[view], playing, new = player_only_parts(shown[view])
                want[view] = player_only_parts(want[view])[0]
                frame = trace.frames[k]
                if view == "canvas":
                    assert playing == ["true" if k < last else "false"], (k, playing)
                    assert new == ([] if frame.block_done else [p for p, step in enumerate(frame.first_accepted_step)
                                                                if step == frame.step_index]), (k, new)
                else:
                    assert playing == [] and new == [], (k, playing, new)
            for view in want:
                assert shown[view] == want[view], (k, view)
        shown = page.evaluate(SHOWN_VIEWS, len(trace.frames) - 1)
        canvas = shown["canvas"] + shown["stack"]
        for marker in ("dg-tok-bytes", "dg-tok-bytecont", "dg-tok-byte\"", "dg-tok-pad", "dg-tok-eos",
                       "dg-tok-special", "dg-sp", "dg-noisy" if stopped else "dg-pad", "why this token?"):
            assert marker in canvas, marker  # every kind of chip was compared
        assert any(f.block_remelts for f in trace.frames)  # re-melt marks and counts were compared too
        assert ("stopped at step 3" if stopped else "kept, end-of-sequence") in canvas + json.dumps(shown)
        page.keyboard.press("Home")
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / f"varied-{'stopped' if stopped else 'finished'}.png"), full_page=True)
        assert problems == [] and requests == [path.as_uri()]
    finally:
        page.context.close()


def test_hostile_trace_replays_without_running_its_strings(browser, tmp_path):
    path = write_replay(hostile_trace(), tmp_path / "hostile.html")
    page, requests, problems = open_offline(browser, path)
    try:
        assert page.evaluate("document.body.dataset.ready") == "true"
        page.keyboard.press("Home")
        page.click("#dg-replay-play")
        page.wait_for_function("document.body.dataset.playing === 'false'", timeout=60_000)
        assert page.evaluate("window.__pwned") is None
        assert page.locator("#dg-canvas img, #dg-stack img, #dg-replay-prompt img").count() == 0
        assert "<script>window.__pwned=1</script>" in page.inner_text("#dg-replay-prompt")
        page.screenshot(path=str(SHOTS / "hostile.png"), full_page=True)
        for k in range(int(page.evaluate("window.dgReplay.frames.length"))):
            shown = page.evaluate(SHOWN_VIEWS, k)
            live = shown["canvas"]
            assert "<script" not in live and "<img" not in live
            names = page.evaluate("[...document.querySelectorAll('#dg-canvas *, #dg-stack *')]"
                                  ".flatMap(e => e.getAttributeNames())")
            assert set(names) <= {"class", "title", "style", "data-forward", "data-playing", "data-block",
                                  "data-blocks"}  # no onerror=
            assert "&lt;script&gt;" in live or 'data-forward' in live and "dg-block" not in live
            hovers = json.dumps(shown["order"])
            assert "<script" not in hovers and "<img" not in hovers and "&lt;script&gt;" in hovers
            assert "<script" not in json.dumps([shown["heatmap"], shown["entropy"]])
        assert problems == [] and requests == [path.as_uri()]
    finally:
        page.context.close()


def hostile_token_trace(tmp_path) -> Path:
    """The replay of a trace whose draft shows test_security's hostile strings in order at every step (the noise:
    the same, reversed); every fifth of them is a special token."""
    n = len(HOSTILE_TOKENS)
    doc = synthetic_trace(canvas=n, steps=3, blocks=2, vocab=n).to_dict()
    doc["tokens"] = {str(i): token for i, token in enumerate(HOSTILE_TOKENS)}
    doc["kinds"] = {str(i): "special" for i in range(n) if i % 5 == 4}
    for frame in doc["frames"]:
        frame["draft_ids"], frame["input_ids"] = list(range(n)), list(reversed(range(n)))
    return write_replay(load_trace(json.dumps(doc)), tmp_path / "tokens.html")


def test_hostile_tokens_stay_text_in_the_replay(browser, tmp_path):
    path = hostile_token_trace(tmp_path)
    page, requests, problems = open_offline(browser, path)
    try:
        page.evaluate("() => { window.__alerts = []; for (const f of ['alert', 'confirm', 'prompt']) "
                      "window[f] = (m) => { window.__alerts.push(String(m)); }; }")
        page.keyboard.press("Home")
        page.keyboard.press("ArrowRight")
        page.hover("#dg-heatmap .nsewdrag")  # a Plotly hover label with a hostile token
        page.wait_for_timeout(300)
        seen = page.evaluate("""() => {
            const elements = [...document.querySelectorAll(
                '#dg-canvas *, #dg-stack *, #dg-meter *, .dg-header *, #dg-replay-prompt *')];
            const labels = [...document.querySelectorAll(
                '.js-plotly-plot .hoverlayer *, .js-plotly-plot .infolayer *')];
            return {tags: [...new Set(elements.map(e => e.tagName))].sort(),
                    attributes: [...new Set(elements.flatMap(e => e.getAttributeNames()))].sort(),
                    plotTags: [...new Set(labels.map(e => e.tagName))].sort(), alerts: window.__alerts};
        }""")
        chips = page.locator("#dg-canvas .dg-chip, #dg-stack .dg-chip")
        titles = " ".join(chips.evaluate_all("els => els.map(e => e.getAttribute('title'))"))
        chips = " ".join(chips.all_inner_texts())
        hover = " ".join(page.locator("#dg-heatmap .hovertext").evaluate_all("els => els.map(e => e.textContent)"))
        assert set(seen["tags"]) <= {"DIV", "H1", "HEADER", "P", "SECTION", "SPAN", "WBR"}, seen  # the views' own
        assert set(seen["attributes"]) <= {"class", "title", "style", "data-forward", "data-playing", "data-block",
                                           "data-blocks", "data-state", "data-tps", "data-ttff", "id", "role"}, seen
        assert not {"script", "img", "iframe", "foreignObject", "a"} & set(seen["plotTags"]), seen
        assert seen["alerts"] == []
        assert "<script>alert(1)</script>" in chips and "\u27e8U+202E\u27e9<img" in chips
        for i, token in enumerate(HOSTILE_TOKENS):  # every draft token is in a tooltip, as text
            assert (f"special token {token}:" if i % 5 == 4 else f"\u201c{visible_token(token)}\u201d") in titles, token
        assert hover and any(visible_token(token) in hover for token in HOSTILE_TOKENS), hover
        assert problems == [] and requests == [path.as_uri()]
    finally:
        page.context.close()


def test_replay_requests_nothing_even_online(browser, tmp_path):
    doc = synthetic_trace(canvas=8, steps=2, blocks=1, vocab=40,
                          token_text=lambda i: f'<img src="http://127.0.0.1:9/{i}.png"><link rel=stylesheet '
                                               f'href="http://127.0.0.1:9/{i}.css">').to_dict()
    doc["prompt"]["text"] = "<style>@import url(http://127.0.0.1:9/p.css)</style>"
    path = write_replay(load_trace(json.dumps(doc)), tmp_path / "online.html")
    page, requests, problems = open_offline(browser, path, offline=False)
    try:
        assert page.evaluate("document.body.dataset.ready") == "true"
        page.keyboard.press("Home")
        page.click("#dg-replay-play")
        page.wait_for_function("document.body.dataset.playing === 'false'", timeout=60_000)
        page.hover("#dg-order .nsewdrag")
        page.wait_for_timeout(300)
        assert "http://127.0.0.1:9/" in page.inner_text("#dg-canvas") + page.inner_text("#dg-stack")
        assert requests == [path.as_uri()], requests
        assert problems == []
        csp = page.get_attribute("meta[http-equiv='Content-Security-Policy']", "content")
        assert csp.startswith("default-src 'none'; script-src 'sha256-")
        assert "'unsafe-inline'" not in csp.split(";")[1]  # no inline script but the player (by its hash)
    finally:
        page.context.close()


def test_presenter_view_keys_and_captions(browser, tmp_path):
    trace = varied_trace()
    path = write_replay(trace, tmp_path / "present.html")
    context = browser.new_context(offline=True, viewport={"width": 1280, "height": 720})
    page = context.new_page()
    problems = []
    page.on("pageerror", lambda e: problems.append(str(e)))
    try:
        page.goto(path.as_uri() + "#present")
        page.wait_for_function("document.body.dataset.ready === 'true'")
        assert page.evaluate("document.body.classList.contains('dg-present')")
        assert page.evaluate("document.body.dataset.forward") == "0"  # presenting starts at the first forward
        caption = page.locator("#dg-replay-caption")
        assert caption.is_visible() and "starts as 24 random tokens" in caption.inner_text()
        assert not page.locator("#dg-replay-prompt").is_visible() and not page.locator("#dg-order").is_visible()
        assert page.locator("#dg-canvas").is_visible() and page.locator("#dg-heatmap").is_visible()
        page.keyboard.press("ArrowRight")
        assert page.evaluate("document.body.dataset.forward") == "1"
        assert "positions accepted" in caption.inner_text()
        page.keyboard.press("ArrowLeft")
        assert page.evaluate("document.body.dataset.forward") == "0"
        page.keyboard.press("b")  # next block: its first forward
        first_of_block_2 = next(i for i, f in enumerate(trace.frames) if f.block_index == 1)
        assert page.evaluate("document.body.dataset.forward") == str(first_of_block_2)
        page.keyboard.press("End")
        assert "token budget is spent" in caption.inner_text() and "Block 3 is committed" in caption.inner_text()
        page.keyboard.press("Home")
        page.keyboard.press(" ")
        assert page.evaluate("document.body.dataset.playing") == "true"
        assert page.get_attribute("#dg-replay-play", "aria-label") == "pause"
        page.keyboard.press(" ")  # paused (data-playing stays "true": the last forward is not on screen)
        assert page.get_attribute("#dg-replay-play", "aria-label") == "play"
        assert int(page.evaluate("document.body.dataset.forward")) < len(trace.frames) - 1
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / "present-1280x720.png"))
        page.keyboard.press("Escape")
        assert not page.evaluate("document.body.classList.contains('dg-present')")
        assert page.locator("#dg-replay-prompt").is_visible()
        page.keyboard.press("p")
        assert page.evaluate("document.body.classList.contains('dg-present')")
        assert problems == []
    finally:
        context.close()
