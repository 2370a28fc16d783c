"""The offline replay page: one self-contained HTML file (no network) that plays a trace back in the browser."""

from __future__ import annotations

import base64
import hashlib
import json
import re
from dataclasses import asdict
from pathlib import Path

from .trace import TRACE_VERSION, Trace

ASSETS_DIR = Path(__file__).resolve().parent.parent / "assets"
PLAYER_DIR = ASSETS_DIR / "replay"
PLAYER_SCRIPTS = ("format.js", "tokens.js", "views.js", "player.js")  # in load order: each uses the ones before
STYLESHEETS = (PLAYER_DIR / "theme.css", ASSETS_DIR / "style.css", PLAYER_DIR / "page.css")
PLOTLY_GZ = ASSETS_DIR / "vendor" / "plotly-cartesian-4.1.1.min.js.gz"
PAGE = PLAYER_DIR / "page.html"  # a `str.format` template: csp, css, data, plotly, player
PLAY_INTERVAL_MS = 350
PRESENT_INTERVAL_MS = 1400  # a caption a teacher can read aloud per forward
_SURROGATE = re.compile("[\ud800-\udfff]")


def replay_data(trace: Trace) -> dict:
    """What the player needs of `trace`, JSON-ready (schema: `docs/trace.md`, "The offline replay page")."""
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
        "trace_version": TRACE_VERSION, "model": dict(trace.model.__dict__),
        "settings": asdict(trace.settings), "seed": str(trace.seed),
        "prompt": trace.prompt, "raw": trace.raw, "prompt_tokens": len(trace.prompt_ids), "text": trace.text,
        "tokens": [trace.tokens[i] for i in index], "kinds": kinds, "frames": frames,
        "interval_ms": PLAY_INTERVAL_MS, "present_interval_ms": PRESENT_INTERVAL_MS,
    }


def script_json(data: dict) -> str:
    """`data` as JSON text inert inside a `<script>` element (`<` and lone surrogates escaped)."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    text = _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
    return text.replace("<", "\\u003c")


def player_script(names: tuple[str, ...] = PLAYER_SCRIPTS) -> str:
    """The player's JavaScript files `names`, in order, in one function scope; `FileNotFoundError`."""
    body = "\n".join((PLAYER_DIR / name).read_text(encoding="utf-8") for name in names)
    return f'\n(() => {{\n"use strict";\n{body}\n}})();\n'


def replay_html(trace: Trace) -> str:
    """The self-contained offline replay page of `trace`; `FileNotFoundError` for a missing asset."""
    player = player_script()
    digest = base64.b64encode(hashlib.sha256(player.encode("utf-8")).digest()).decode("ascii")
    # Only the player runs (by its hash, so no inline handler would); it evaluates the unpacked Plotly bundle
    csp = (f"default-src 'none'; script-src 'sha256-{digest}' 'unsafe-eval'; style-src 'unsafe-inline'; "
           "img-src data:; font-src data:")
    css = "\n".join(path.read_text(encoding="utf-8") for path in STYLESHEETS)
    plotly = base64.b64encode(PLOTLY_GZ.read_bytes()).decode("ascii")
    return PAGE.read_text(encoding="utf-8").format(csp=csp, css=css, data=script_json(replay_data(trace)),
                                                   plotly=plotly, player=player)


def write_replay(trace: Trace, path) -> Path:
    """Write `replay_html(trace)` to `path` and return the path; `OSError`."""
    path = Path(path)
    path.write_text(replay_html(trace), encoding="utf-8")
    return path
