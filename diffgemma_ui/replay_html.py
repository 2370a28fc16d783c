"""The offline replay: one self-contained HTML file that plays a trace back with the playground's own views.

Every view is rendered here in Python by the playground's builders (`canvas_view`, `meter`, `plots`), once per
frame or block; the page's script only swaps them in as the step changes. Plotly (the cartesian bundle, vendored in
`assets/vendor/`) and the views are gzip-compressed and base64-inlined, and the browser unpacks them with its
built-in `DecompressionStream`: the file makes no network request at all (tested with networking off) and a
256-position, 48-step run stays under 2 MB (`benchmarks/replay_size.py`).

Controls: play/pause, a step slider, previous/next buttons, and the keyboard (left/right arrows step, Home/End jump,
space plays or pauses). Nothing from the trace reaches the page unescaped: strings are escaped by the builders,
and the unpacked views are only ever assigned as the builders' HTML or passed to Plotly as figure data.
"""

from __future__ import annotations

import base64
import gzip
import json
from pathlib import Path

from engine.trace import TRACE_VERSION, Trace

from .canvas_view import STOP_REASONS, legend_html, live_html, stack_html
from .meter import meter_html
from .plots import confidence_heatmap, entropy_and_acceptance, unmasking_order
from .text import escape_html, plain_text

ASSETS_DIR = Path(__file__).resolve().parent.parent / "assets"
PLOTLY_GZ = ASSETS_DIR / "vendor" / "plotly-cartesian-4.1.1.min.js.gz"
CSS_PATH = ASSETS_DIR / "style.css"
# Light-theme values for the Gradio theme variables that style.css uses (the page has no Gradio)
THEME_VARIABLES = """:root{--body-text-color:#1f2937;--body-text-color-subdued:#6b7280;--border-color-primary:#e5e7eb;
--block-background-fill:#ffffff;--color-accent:#7c3aed;--font-mono:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;}"""
PAGE_CSS = """body{margin:0;background:#f6f7fb;color:var(--body-text-color);font-family:ui-sans-serif,system-ui,
-apple-system,'Segoe UI',Roboto,sans-serif}main{max-width:1360px;margin:0 auto;padding:12px 16px 40px}
.dg-card{border:1px solid var(--border-color-primary);border-radius:12px;padding:10px 12px;margin:10px 0;
background:var(--block-background-fill)}.dg-card h2{font-size:.8rem;text-transform:uppercase;letter-spacing:.03em;
color:var(--body-text-color-subdued);margin:0 0 6px}.dg-card pre{white-space:pre-wrap;word-break:break-word;margin:0;
font-family:var(--font-mono);font-size:.85rem}#dg-replay-controls{display:flex;align-items:center;gap:8px;
flex-wrap:wrap;position:sticky;top:0;z-index:5;background:#f6f7fbee;padding:6px 0}#dg-replay-controls button{
min-width:44px;min-height:36px;font-size:1rem;border-radius:8px;border:1px solid var(--border-color-primary);
background:#fff;cursor:pointer}#dg-replay-controls button.primary{background:#7c3aed;color:#fff;border-color:#7c3aed}
#dg-replay-slider{flex:1;min-width:160px}#dg-replay-label{font-family:var(--font-mono);font-size:.85rem}
.dg-plot-row{display:grid;grid-template-columns:1fr 1fr;gap:10px}@media(max-width:760px){.dg-plot-row{
grid-template-columns:1fr}}#dg-replay-error{color:#b91c1c}"""
# No network at all: only the page's own inline scripts (Plotly compiles some code) and styles, and data: URLs
CSP = ("default-src 'none'; script-src 'unsafe-inline' 'unsafe-eval'; style-src 'unsafe-inline'; img-src data:; "
       "font-src data:")
BOOT_JS = r"""
(() => {
  const $ = (id) => document.getElementById(id);
  async function unpack(id) {
    const text = $(id).textContent.trim();
    const bytes = Uint8Array.from(atob(text), (c) => c.charCodeAt(0));
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
    return await new Response(stream).text();
  }
  function cover(k, steps) {  // grey out the heatmap's rows after step k (as the playground's heatmap animation)
    return [{type: "rect", xref: "paper", x0: 0, x1: 1, yref: "y", y0: k + 1.5, y1: steps + 0.5,
             fillcolor: "rgba(128,128,128,0.88)", line: {width: 0}, layer: "above", visible: k < steps - 1}];
  }
  async function main() {
    if (typeof DecompressionStream === "undefined") {
      throw new Error("this browser cannot unpack the replay (it needs DecompressionStream: Chrome 80+, " +
                      "Firefox 113+, Safari 16.4+)");
    }
    const plotly = document.createElement("script");
    plotly.textContent = await unpack("dg-plotly");
    document.head.appendChild(plotly);
    const data = JSON.parse(await unpack("dg-views"));
    const frames = data.frames, last = frames.length - 1, config = {displaylogo: false, responsive: true, showSendToCloud: false};
    const slider = $("dg-replay-slider"), play = $("dg-replay-play"), root = document.body;
    const done = Array.from(document.querySelectorAll("#dg-stack .dg-block"));
    let current = -1, shownBlock = -1, timer = null;
    slider.max = String(last);
    function show(k) {
      k = Math.max(0, Math.min(last, k));
      const f = frames[k], block = data.blocks[f.block];
      done.forEach((section, i) => { section.hidden = i >= f.blocks_done; });
      $("dg-canvas").innerHTML = f.live;
      $("dg-meter").innerHTML = f.meter;
      if (f.block !== shownBlock) {
        Plotly.react("dg-heatmap", block.heatmap.data, block.heatmap.layout, config);
        Plotly.react("dg-entropy", block.entropy.data, block.entropy.layout, config);
        shownBlock = f.block;
      }
      Plotly.relayout("dg-heatmap", {shapes: cover(f.step, block.steps)});
      Plotly.react("dg-order", f.order.data, f.order.layout, config);
      $("dg-replay-label").textContent = `forward ${k + 1}/${last + 1} · block ${f.block + 1} · step ${f.step + 1}`;
      slider.value = String(k);
      current = k;
      root.dataset.forward = String(k);
    }
    function pause() {
      if (timer !== null) clearInterval(timer);
      timer = null;
      play.textContent = "\u25b6";
      play.setAttribute("aria-label", "play");
      root.dataset.playing = "false";
    }
    function start() {
      if (current >= last) show(0);
      play.textContent = "\u275a\u275a";
      play.setAttribute("aria-label", "pause");
      root.dataset.playing = "true";
      timer = setInterval(() => { if (current >= last) pause(); else show(current + 1); }, data.interval_ms);
    }
    play.addEventListener("click", () => (timer === null ? start() : pause()));
    $("dg-replay-prev").addEventListener("click", () => { pause(); show(current - 1); });
    $("dg-replay-next").addEventListener("click", () => { pause(); show(current + 1); });
    slider.addEventListener("input", () => { pause(); show(Number(slider.value)); });
    document.addEventListener("keydown", (event) => {
      if (event.target && event.target !== slider && /^(INPUT|TEXTAREA|SELECT)$/.test(event.target.tagName)) return;
      const moves = {ArrowLeft: current - 1, ArrowRight: current + 1, Home: 0, End: last};
      if (event.key in moves) { event.preventDefault(); pause(); show(moves[event.key]); }
      else if (event.key === " ") { event.preventDefault(); timer === null ? start() : pause(); }
    });
    pause();
    show(last);
    root.dataset.ready = "true";
  }
  main().catch((error) => {
    $("dg-replay-error").textContent = String(error && error.message || error);
    document.body.dataset.ready = "error";
    throw error;
  });
})();
"""


def _packed(data: bytes) -> str:
    """gzip then base64 (ASCII only: safe inside a `<script type="application/octet-stream">` element)."""
    return base64.b64encode(gzip.compress(data, compresslevel=9, mtime=0)).decode("ascii")


def replay_views(trace: Trace) -> dict:
    """Every view the page shows, rendered by the playground's builders.

    Returns:
        {"blocks": [per block: {"heatmap": figure, "entropy": figure, "steps": int}],
         "frames": [per frame: {"block", "step", "blocks_done", "live": canvas HTML, "meter": meter HTML,
                                "order": figure}],
         "interval_ms": play speed}
    """
    blocks = trace.blocks
    block_views = [{"heatmap": confidence_heatmap(frames, animate=False, hover=True),
                    "entropy": entropy_and_acceptance(frames), "steps": len(frames)} for frames in blocks]
    frame_views = []
    blocks_done = 0
    last = trace.frames[-1]
    for frame in trace.frames:
        if frame.block_done:
            blocks_done = frame.block_index + 1
        status = ""
        if frame is last:
            status = STOP_REASONS.get(frame.stop_reason, frame.stop_reason)
        live = None if frame.block_done else frame
        frame_views.append({
            "block": frame.block_index, "step": frame.step_index, "blocks_done": blocks_done,
            "live": live_html(live, newest=frame, status=status), "meter": meter_html(frame),
            "order": unmasking_order(frame),
        })
    return {"blocks": block_views, "frames": frame_views, "interval_ms": 350}


def _settings_line(trace: Trace) -> str:
    s = trace.settings
    return (f"max new tokens {s.max_new_tokens} · max steps {s.max_denoising_steps} · entropy bound "
            f"{s.entropy_bound:g} · t {s.t_max:g}→{s.t_min:g} · adaptive stopping "
            f"{'on' if s.adaptive_stopping else 'off'} (stability {s.stability_threshold}, confidence "
            f"{s.confidence_threshold:g})")


def replay_html(trace: Trace, *, plotly_gz: Path = PLOTLY_GZ) -> str:
    """The self-contained offline replay page of `trace` (HTML text; no external resource of any kind).

    Raises:
        FileNotFoundError: the vendored Plotly bundle is missing.
    """
    views = json.dumps(replay_views(trace), separators=(",", ":"), allow_nan=False, ensure_ascii=False)
    plotly = base64.b64encode(plotly_gz.read_bytes()).decode("ascii")
    finished = [frames[-1] for frames in trace.blocks if frames[-1].block_done]
    m = trace.model
    badges = [f"model: {m.name}" + (f"@{m.revision[:12]}" if m.revision else ""), f"device: {m.device}",
              f"dtype: {m.dtype}", f"canvas: {m.canvas_length} tokens", f"seed: {trace.seed}",
              "raw prompt" if trace.raw else "chat prompt"]
    badge_html = "".join(f'<span class="dg-badge">{escape_html(b)}</span>' for b in badges)
    css = THEME_VARIABLES + CSS_PATH.read_text(encoding="utf-8") + PAGE_CSS
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="{CSP}">
<title>DiffGemma replay · {escape_html(m.name)} · seed {trace.seed}</title>
<style>{css}</style></head>
<body data-ready="false" data-playing="false" data-forward="-1"><main>
<div class="dg-header"><div><h1>DiffGemma replay</h1><p>{escape_html(_settings_line(trace))}</p></div>
<div class="dg-badges">{badge_html}</div></div>
<section class="dg-card"><h2>Prompt</h2>
<pre id="dg-replay-prompt">{escape_html(plain_text(trace.prompt))}</pre></section>
<div id="dg-replay-controls">
<button id="dg-replay-prev" type="button" aria-label="previous step">&#9664;</button>
<button id="dg-replay-play" type="button" class="primary" aria-label="play">&#9654;</button>
<button id="dg-replay-next" type="button" aria-label="next step">&#9654;&#10073;</button>
<input id="dg-replay-slider" type="range" min="0" max="0" step="1" value="0" aria-label="step">
<span id="dg-replay-label"></span><span id="dg-replay-error" role="alert"></span></div>
<div id="dg-meter"></div>
<section class="dg-card">{legend_html()}<div id="dg-stack">{stack_html(finished)}</div>
<div id="dg-canvas"></div></section>
<section class="dg-card"><div id="dg-heatmap"></div></section>
<div class="dg-plot-row"><section class="dg-card"><div id="dg-order"></div></section>
<section class="dg-card"><div id="dg-entropy"></div></section></div>
<section class="dg-card"><h2>Generated text</h2>
<pre id="dg-replay-text">{escape_html(plain_text(trace.text))}</pre></section>
<p class="dg-meter-note">Replayed from a DiffGemma Playground trace (format version {TRACE_VERSION}); \
timings are the engine clock of the original run. Keys: &#8592; &#8594; step, Home/End, space plays or pauses.</p>
</main>
<script type="application/octet-stream" id="dg-plotly">{plotly}</script>
<script type="application/octet-stream" id="dg-views">{_packed(views.encode("utf-8"))}</script>
<script>{BOOT_JS}</script>
</body></html>
"""


def write_replay(trace: Trace, path) -> Path:
    """Write `replay_html(trace)` to `path` (UTF-8) and return the path."""
    path = Path(path)
    path.write_text(replay_html(trace), encoding="utf-8")
    return path
