// The replay player, part 6: the Playground's own player. The run step streams the run's frames as chunks of the
// player's data into a hidden box (diffgemma_ui/feed.py); `dgLive.feed` buffers them and the player (part 4) plays
// every forward at the chosen pace while the engine runs ahead. The meter reads the engine's newest frame.

const PACE_KEY = "dg-pace";
const live = {data: null, key: null, loaded: null, done: true, seq: -1, player: null, listeners: []};
const byId = (id) => document.getElementById(id);

function paceValue() {
  const box = byId("dg-replay-pace");
  return PACES[box ? box.value : "default"] || PACES.default;
}

// The frames of `chunk` from `start` on, their token indices moved past the tokens already held; a frame held
// already is replaced (a run's last frame comes again as its cancelled end)
function appendFrames(chunk) {
  if (live.data.frames.length < chunk.start) return false;  // a gap: some chunk never arrived
  const offset = live.data.tokens.length, move = (row) => row.map((i) => i + offset);
  live.data.tokens.push(...chunk.tokens);
  if (chunk.kinds) {
    live.data.kinds = live.data.kinds || {};
    for (const [i, kind] of Object.entries(chunk.kinds)) live.data.kinds[String(Number(i) + offset)] = kind;
  }
  chunk.frames.forEach((f, i) => {
    live.data.frames[chunk.start + i] = {...f, input: move(f.input), draft: move(f.draft),
      ...(f.alt_ids ? {alt_ids: f.alt_ids.map(move)} : {})};
  });
  return true;
}

function mount() {
  if (live.player || !byId("dg-canvas")) return live.player;
  live.player = mountPlayer(byId, null, byId("dg-player"), {pace: paceValue, engineDone: () => live.done,
    meterFrame: (shown, newest) => newest, active: () => !document.documentElement.classList.contains("dg-presenting")
      && Boolean(byId("dg-player")) && byId("dg-player").offsetParent !== null,
    onPresent: (on) => on && window.dgPresenter && window.dgPresenter.open()});
  return live.player;
}

function setMeter(html) {
  const meter = byId("dg-meter");
  if (meter) meter.innerHTML = html;  // the server's meter for a state with no frame (escaped there)
}

// One message of the feed: a meter for a state without frames, or frames of the page's run
function feed(text) {
  if (!text) return;
  const message = JSON.parse(text);
  if (message.seq <= live.seq) return;
  live.seq = message.seq;
  const player = mount();
  if (!player) return;
  if (message.meter !== undefined) setMeter(message.meter);
  if (message.error !== undefined && byId("dg-run-error")) byId("dg-run-error").textContent = message.error;
  if (!message.frames) return;
  if (message.key !== live.key) {  // a new run (its first chunk may be lost on its way: the gap asks for it)
    live.key = message.key;
    live.data = {...message, tokens: [], kinds: {}, frames: []};
  }
  if (!appendFrames(message)) { ask(); return; }
  const fresh = live.loaded !== live.key;  // the player has not had this run yet
  live.loaded = live.key;
  live.done = Boolean(message.final);
  const end = live.data.frames[live.data.frames.length - 1];
  if (live.done && message.stopped && !end.stop_reason) end.stop_reason = "cancelled";  // stopped between forwards
  player.load(live.data, !fresh);
  const autoplay = !reducedMotion() && message.autoplay !== false;
  if (message.autoplay === false) player.show(player.last());  // a stepped run: each new forward at once
  else if (fresh && autoplay) { player.show(0); player.start(); }
  else if (fresh || (live.done && !autoplay)) player.show(live.done && !autoplay ? player.last() : 0);
  if (live.done) player.ended();
  live.listeners.forEach((listener) => listener(live.data, fresh));
}

function ask() {  // the frames this page lacks, from the session's run (a chunk lost on its way)
  const button = byId("dg-feed-poll");
  if (button) button.click();
}

function loadPlotly() {
  if (typeof Plotly !== "undefined") return;
  const url = byId("dg-player") && byId("dg-player").dataset.plotly;
  if (!url) return;
  fetch(url).then((response) => new Response(response.body.pipeThrough(new DecompressionStream("gzip"))).text())
    .then((code) => { if (typeof Plotly === "undefined") (0, eval)(code); if (live.player) live.player.redraw(); })
    .catch((error) => { const s = byId("dg-replay-status"); if (s) s.textContent = `plots unavailable: ${error}`; });
}

window.dgLive = {feed, ask, mount, have: () => (live.key ? `${live.key}:${live.data.frames.length}` : ""),
  data: () => live.data, done: () => live.done, onData: (listener) => live.listeners.push(listener),
  player: () => live.player, pause: () => live.player && live.player.pause(),
  replay: () => { if (live.player && live.data) { live.player.show(0); live.player.start(); } }};
// Plotly loads while the page is idle after it opens, not in the middle of the first run
// and the pace menu keeps the visitor's last choice
const waitForPlayer = setInterval(() => {
  if (!byId("dg-player")) return;
  clearInterval(waitForPlayer);
  const box = byId("dg-replay-pace");
  box.value = PACES[localStorage.getItem(PACE_KEY)] ? localStorage.getItem(PACE_KEY) : "default";
  box.addEventListener("change", () => {
    localStorage.setItem(PACE_KEY, box.value);
    if (live.player && live.player.playing()) live.player.schedule();
  });
  (window.requestIdleCallback || setTimeout)(loadPlotly);
}, 200);
// The player takes the page as soon as Gradio has drawn it: its pace, keys and plots are ready before a run
const mounting = setInterval(() => { if (mount()) clearInterval(mounting); }, 100);
