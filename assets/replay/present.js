// The replay player, part 5: the Playground's presenter, the player in an overlay over the page that plays the
// page's run (window.dgLive's data, part 6) at narration speed while the engine runs ahead. The Present button or
// ?present=1 opens it; Esc leaves.

const OVERLAY = `<div id="dgp-controls" class="dg-controls">
<button id="dgp-replay-prev" type="button" aria-label="previous step">&#9664;</button>
<button id="dgp-replay-play" type="button" class="primary" aria-label="play">&#9654;</button>
<button id="dgp-replay-next" type="button" aria-label="next step">&#9654;&#10073;</button>
<input id="dgp-replay-slider" type="range" min="0" max="0" step="1" value="0" aria-label="step">
<span id="dgp-replay-label"></span><button id="dgp-generate" type="button" class="primary">Generate</button>
<button id="dgp-leave" type="button">Leave (Esc)</button></div>
<p id="dgp-replay-caption" class="dg-caption" role="status" aria-live="polite">Nothing to present yet: Generate.</p>
<div id="dgp-meter"></div><div id="dgp-board"><div id="dgp-stack"></div><div id="dgp-canvas"></div></div>
<div id="dgp-heatmap"></div>`;
const shown = {overlay: null, player: null};
const part = (id) => shown.overlay.querySelector(`#${id.replace(/^dg-/, "dgp-")}`);

// The page's run (window.dgLive's data), played in the overlay at narration speed from its first forward
function presentRun(data, fresh) {
  if (!isOpen() || !data) return;
  if (!shown.player) {
    shown.player = mountPlayer(part, data, shown.overlay, {presenting: () => true, active: isOpen,
      engineDone: () => window.dgLive.done(), pace: () => data.present_interval_ms, onPresent: (on) => on || close()});
    fresh = true;
  } else {
    shown.player.load(data, !fresh);
  }
  if (fresh) {
    shown.player.show(reducedMotion() && window.dgLive.done() ? shown.player.last() : 0);
    if (!reducedMotion()) shown.player.start();
  }
  if (window.dgLive.done()) shown.player.ended();
  shown.overlay.dataset.buffered = String(data.frames.length);
}

const isOpen = () => Boolean(shown.overlay && !shown.overlay.hidden);

function open() {
  if (!shown.overlay) {
    shown.overlay = el("div", {id: "dgp-overlay", class: "dg-present", role: "dialog", "aria-label": "Presenter view",
      "data-forward": "-1", "data-playing": "false"});
    shown.overlay.innerHTML = OVERLAY;  // static markup: every run string goes in later as text
    (document.querySelector(".gradio-container") || document.body).append(shown.overlay);
    part("dg-leave").addEventListener("click", close);
    part("dg-generate").addEventListener("click", () => document.getElementById("dg-generate").click());
    window.dgLive.onData(presentRun);
  }
  shown.overlay.hidden = false;
  document.documentElement.classList.add("dg-presenting");
  if (window.dgLive.data()) presentRun(window.dgLive.data(), true);
}

function close() {
  if (!shown.overlay) return;
  if (shown.player) shown.player.pause();
  shown.overlay.hidden = true;
  document.documentElement.classList.remove("dg-presenting");
  const url = new URL(location.href);  // a reload after leaving stays on the page
  if (url.searchParams.has("present")) {
    url.searchParams.delete("present");
    history.replaceState(history.state, "", url);
  }
}

window.dgPresenter = {open, close, isOpen};
document.addEventListener("keydown", (event) => { if (event.key === "Escape" && isOpen()) close(); });
if (new URLSearchParams(location.search).get("present") === "1") {
  const wait = setInterval(() => {
    if (document.getElementById("dg-generate") && window.dgLive) { clearInterval(wait); open(); }
  }, 200);
}
