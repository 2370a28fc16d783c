// The live playground's presenter: the replay player (parts 1-4) in an overlay over the page, fed the session's run
// as chunks of the player's data (diffgemma_ui/presenter.py) that a hidden button fetches each second, so a live run
// plays at narration speed while the engine runs ahead. The Present button or ?present=1 opens it; Esc leaves.

const OVERLAY = `<div id="dgp-controls" class="dg-controls">
<button id="dgp-replay-prev" type="button" aria-label="previous step">&#9664;</button>
<button id="dgp-replay-play" type="button" class="primary" aria-label="play">&#9654;</button>
<button id="dgp-replay-next" type="button" aria-label="next step">&#9654;&#10073;</button>
<input id="dgp-replay-slider" type="range" min="0" max="0" step="1" value="0" aria-label="step">
<span id="dgp-replay-label"></span><button id="dgp-generate" type="button" class="primary">Generate</button>
<button id="dgp-leave" type="button">Leave (Esc)</button></div>
<p id="dgp-replay-caption" class="dg-caption" role="status" aria-live="polite">Nothing to present yet: Generate.</p>
<div id="dgp-meter"></div><div id="dgp-stack"></div><div id="dgp-canvas"></div><div id="dgp-heatmap"></div>`;
const live = {overlay: null, player: null, data: null, key: null, asked: 0, timer: null};
const part = (id) => live.overlay.querySelector(`#${id.replace(/^dg-/, "dgp-")}`);

// A chunk's frames appended to the buffered run: its token indices moved past the tokens already held
function append(chunk) {
  const offset = live.data.tokens.length, move = (row) => row.map((i) => i + offset);
  live.data.tokens.push(...chunk.tokens);
  if (chunk.kinds && live.data.kinds) {
    for (const [i, kind] of Object.entries(chunk.kinds)) live.data.kinds[String(Number(i) + offset)] = kind;
  }
  for (const f of chunk.frames) {
    live.data.frames.push({...f, input: move(f.input), draft: move(f.draft),
      ...(f.alt_ids ? {alt_ids: f.alt_ids.map(move)} : {})});
  }
}

function feed(text) {
  live.asked = 0;
  const chunk = text ? JSON.parse(text) : {key: null};
  const fresh = chunk.key !== live.key;
  if (!chunk.key || (!fresh && !chunk.frames.length)) return;
  if (fresh) { live.key = chunk.key; live.data = chunk; } else append(chunk);
  if (live.player) live.player.load(live.data, !fresh);
  else live.player = mountPlayer(part, live.data, live.overlay, {presenting: () => true, active: isOpen,
    onPresent: (on) => on || close()});
  if (fresh) { live.player.show(0); live.player.start(); }
  live.overlay.dataset.buffered = String(live.data.frames.length);
}

const isOpen = () => Boolean(live.overlay && !live.overlay.hidden);
function poll() {  // a chunk asked for and not answered within 5 s is asked for again
  const button = document.getElementById("dg-present-poll");
  if (!isOpen() || !button || typeof Plotly === "undefined" || Date.now() - live.asked < 5000) return;
  live.asked = Date.now();
  button.click();
}

function open() {
  if (!live.overlay) {
    live.overlay = el("div", {id: "dgp-overlay", class: "dg-present", role: "dialog", "aria-label": "Presenter view",
      "data-forward": "-1", "data-playing": "false"});
    live.overlay.innerHTML = OVERLAY;  // static markup: every run string goes in later as text
    (document.querySelector(".gradio-container") || document.body).append(live.overlay);
    part("dg-leave").addEventListener("click", close);
    part("dg-generate").addEventListener("click", () => document.getElementById("dg-generate").click());
  }
  live.overlay.hidden = false;
  document.documentElement.classList.add("dg-presenting");
  live.timer = live.timer || setInterval(poll, 1000);
}

function close() {
  if (!live.overlay) return;
  if (live.player) live.player.pause();
  live.overlay.hidden = true;
  document.documentElement.classList.remove("dg-presenting");
  clearInterval(live.timer);
  live.timer = null;
  const url = new URL(location.href);  // a reload after leaving stays on the page
  if (url.searchParams.has("present")) {
    url.searchParams.delete("present");
    history.replaceState(history.state, "", url);
  }
}

window.dgPresenter = {open, close, feed, have: () => (live.key ? `${live.key}:${live.data.frames.length}` : "")};
document.addEventListener("keydown", (event) => { if (event.key === "Escape" && isOpen()) close(); });
if (new URLSearchParams(location.search).get("present") === "1") {
  const wait = setInterval(() => {
    if (document.getElementById("dg-generate")) { clearInterval(wait); open(); }
  }, 200);
}
