"""The offline replay page: one self-contained HTML file that plays a trace back in the browser.

The page is the trace's data as JSON (`replay_data`) plus the static player in `assets/replay/` (JS and CSS, inlined)
and the vendored Plotly bundle (gzip, base64; the browser unpacks it). The player draws the playground's canvas,
meter and plots from that data; it puts every trace string into the page as text, never as markup. The page makes no
network request (its Content-Security-Policy allows none). `docs/trace.md` describes the page's data.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from pathlib import Path

from .trace import SETTING_KEYS, TRACE_VERSION, Trace

ASSETS_DIR = Path(__file__).resolve().parent.parent / "assets"
PLAYER_DIR = ASSETS_DIR / "replay"
PLAYER_SCRIPTS = ("format.js", "tokens.js", "views.js", "player.js")  # in load order: each uses the ones before
STYLESHEETS = (PLAYER_DIR / "theme.css", ASSETS_DIR / "style.css", PLAYER_DIR / "page.css")
PLOTLY_GZ = ASSETS_DIR / "vendor" / "plotly-cartesian-4.1.1.min.js.gz"
PLAY_INTERVAL_MS = 350
PRESENT_INTERVAL_MS = 1400  # narration speed: a caption a teacher can read aloud per forward
_SURROGATE = re.compile("[\ud800-\udfff]")

PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="{csp}">
<title>DiffGemma replay</title>
<style>{css}</style></head>
<body data-ready="false" data-playing="false" data-forward="-1"><main>
<div class="dg-header"><div><h1>DiffGemma replay</h1><p id="dg-replay-settings"></p></div>
<div class="dg-badges" id="dg-replay-badges"></div></div>
<section class="dg-card"><h2>Prompt</h2><pre id="dg-replay-prompt"></pre></section>
<div id="dg-replay-controls">
<button id="dg-replay-prev" type="button" aria-label="previous step">&#9664;</button>
<button id="dg-replay-play" type="button" class="primary" aria-label="play">&#9654;</button>
<button id="dg-replay-next" type="button" aria-label="next step">&#9654;&#10073;</button>
<input id="dg-replay-slider" type="range" min="0" max="0" step="1" value="0" aria-label="step">
<span id="dg-replay-label"></span><button id="dg-replay-present" type="button">Present</button>
<span id="dg-replay-error" role="alert"></span></div>
<p id="dg-replay-caption" role="status" aria-live="polite"></p>
<div id="dg-meter"></div>
<section class="dg-card"><div id="dg-legend"></div><div id="dg-stack"></div><div id="dg-canvas"></div></section>
<section class="dg-card"><div id="dg-heatmap"></div></section>
<div class="dg-plot-row"><section class="dg-card"><div id="dg-order"></div></section>
<section class="dg-card"><div id="dg-entropy"></div></section></div>
<section class="dg-card"><h2>Generated text</h2><pre id="dg-replay-text"></pre></section>
<p class="dg-meter-note">Replayed from a DiffGemma Playground trace (format version <span id="dg-replay-version">\
</span>); timings are the engine clock of the original run. Keys: &#8592; &#8594; step, Home/End, space plays or \
pauses, P presents (B: next block, Esc: leave).</p>
</main>
<script type="application/json" id="dg-replay-data">{data}</script>
<script type="application/octet-stream" id="dg-plotly">{plotly}</script>
<script>{player}</script>
</body></html>
"""


def replay_data(trace: Trace) -> dict:
    """What the player needs of `trace`, as a JSON-ready dict (schema: `docs/trace.md`, "The offline replay page").

    Token ids become indices into one `tokens` list (display strings, in order of first use); per frame the canvas
    as `input`/`draft` indices, `accepted` as a string of 0/1, confidence and entropy as integer thousandths (the
    trace's 3 decimals, exactly), and the alternatives, where recorded, as `alt_ids` (index rows) and `alt_milli`. What the player derives itself (first accepted step, re-melts, forwards per block,
    rates, temperature) is left out, and of `committed_ids` only their count is kept. The seed is a string (JavaScript
    numbers hold 53 bits).
    """
    index: dict[int, int] = {}

    def ids(values) -> list[int]:
        return [index.setdefault(i, len(index)) for i in values]

    frames = []
    for frame in trace.frames:
        item = {
            "block": frame.block_index, "step": frame.step_index,
            "input": ids(frame.input_ids), "draft": ids(frame.draft_ids),
            "accepted": "".join("1" if a else "0" for a in frame.accepted),
            "confidence_milli": [round(c * 1000) for c in frame.confidence],
            "entropy_milli": [round(e * 1000) for e in frame.entropy],
            "elapsed_s": frame.elapsed_s, "block_done": frame.block_done,
            "stopped_early": frame.block_stopped_early, "stop_reason": frame.stop_reason,
        }
        if frame.top_ids:
            item["alt_ids"] = [ids(row) for row in frame.top_ids]
            item["alt_milli"] = [[round(p * 1000) for p in row] for row in frame.top_probs]
        if frame.block_done:
            item["committed"] = len(frame.committed_ids)
            item["committed_tokens"] = frame.committed_tokens
        frames.append(item)
    kinds = None
    if trace.kinds is not None:
        kinds = {str(position): trace.kinds[i] for i, position in index.items() if i in trace.kinds}
    return {
        "trace_version": TRACE_VERSION,
        "model": dict(trace.model.__dict__),
        "settings": {key: getattr(trace.settings, key) for key in SETTING_KEYS},
        "seed": str(trace.seed),
        "prompt": trace.prompt, "raw": trace.raw, "prompt_tokens": len(trace.prompt_ids), "text": trace.text,
        "tokens": [trace.tokens[i] for i in index],
        "kinds": kinds,
        "frames": frames,
        "interval_ms": PLAY_INTERVAL_MS,
        "present_interval_ms": PRESENT_INTERVAL_MS,
    }


def _script_json(data: dict) -> str:
    """`data` as JSON text that is inert inside a `<script>` element: no `<` (so no `</script>` or `<!--`) and no
    lone surrogate (not UTF-8), both written as JSON escapes; other non-ASCII text kept as is."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    text = _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
    return text.replace("<", "\\u003c")


def player_script(player_dir: Path = PLAYER_DIR) -> str:
    """The player's JavaScript: the files of `PLAYER_SCRIPTS`, in order, inside one function scope.

    Raises:
        FileNotFoundError: a player file is missing.
    """
    body = "\n".join((player_dir / name).read_text(encoding="utf-8") for name in PLAYER_SCRIPTS)
    return f'\n(() => {{\n"use strict";\n{body}\n}})();\n'


def replay_html(trace: Trace, *, plotly_gz: Path = PLOTLY_GZ) -> str:
    """The self-contained offline replay page of `trace` (HTML text; it loads nothing from anywhere).

    Raises:
        FileNotFoundError: the vendored Plotly bundle or a player file is missing.
    """
    player = player_script()
    digest = base64.b64encode(hashlib.sha256(player.encode("utf-8")).digest()).decode("ascii")
    # Only the player runs (by its hash, so no inline handler would); it evaluates the unpacked Plotly bundle
    csp = (f"default-src 'none'; script-src 'sha256-{digest}' 'unsafe-eval'; style-src 'unsafe-inline'; "
           "img-src data:; font-src data:")
    css = "\n".join(path.read_text(encoding="utf-8") for path in STYLESHEETS)
    plotly = base64.b64encode(plotly_gz.read_bytes()).decode("ascii")
    return PAGE.format(csp=csp, css=css, data=_script_json(replay_data(trace)), plotly=plotly, player=player)


def write_replay(trace: Trace, path) -> Path:
    """Write `replay_html(trace)` to `path` (UTF-8) and return the path.

    Raises:
        OSError: the file cannot be written. FileNotFoundError: as `replay_html`.
    """
    path = Path(path)
    path.write_text(replay_html(trace), encoding="utf-8")
    return path
