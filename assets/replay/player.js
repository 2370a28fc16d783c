// The replay player, part 4: frame models of the data (engine/trace.py's `replay_data`, holding what
// engine/trace.py derives on load), the player over them (`mountPlayer`, also the live presenter's) and the page.

const $ = (id) => document.getElementById(id);

// A property computed on first use, then kept
function lazy(object, name, compute) {
  Object.defineProperty(object, name, {configurable: true, enumerable: true, get() {
    const value = compute();
    Object.defineProperty(object, name, {value, enumerable: true});
    return value;
  }});
}

// One model per frame of `data.frames`, as the engine's Frame reads (camelCase)
function frameModels(data) {
  const n = data.model.canvas_length, s = data.settings, maxSteps = s.max_denoising_steps;
  const kindOf = data.kinds ? (i) => data.kinds[i] || TEXT : null;
  const firstFrame = data.frames[0].elapsed_s;
  let first = [], forwardsPerBlock = [], committed = 0, committedTokens = 0, blockRemelts = 0;
  return data.frames.map((raw, index) => {
    if (raw.block_done) {
      committed = raw.committed;
      committedTokens = raw.committed_tokens;
      forwardsPerBlock = forwardsPerBlock.concat([raw.step + 1]);
    }
    const accepted = Array.from(raw.accepted, (c) => c === "1");
    if (raw.step === 0) { first = new Array(n).fill(-1); blockRemelts = 0; }
    const remelted = first.map((step, p) => step >= 0 && !accepted[p]);  // accepted before, renoised now
    blockRemelts += remelted.filter(Boolean).length;
    first = first.map((step, p) => (accepted[p] && step < 0 ? raw.step : step));
    const f = {
      forward: index, block: raw.block, step: raw.step, maxSteps, canvasLength: n,
      temperature: s.t_min + (s.t_max - s.t_min) * (maxSteps - raw.step) / maxSteps,
      accepted, first, remelted, blockRemelts, blockDone: raw.block_done, stoppedEarly: raw.stopped_early,
      done: Boolean(raw.stop_reason), stopReason: raw.stop_reason, committed, committedTokens,
      forwardsPerBlock, elapsed: raw.elapsed_s, firstFrame,
      tokensPerSecond: raw.elapsed_s > 0 ? committedTokens / raw.elapsed_s : 0,
      tokensPerForward: committedTokens / (index + 1),
      promptTokens: data.prompt_tokens, seed: data.seed,
    };
    lazy(f, "confidence", () => raw.confidence_milli.map((v) => v / 1000));
    lazy(f, "entropy", () => raw.entropy_milli.map((v) => v / 1000));
    lazy(f, "inputTokens", () => raw.input.map((i) => data.tokens[i]));
    lazy(f, "draftTokens", () => raw.draft.map((i) => data.tokens[i]));
    lazy(f, "inputKinds", () => (kindOf ? raw.input.map(kindOf) : null));
    lazy(f, "draftKinds", () => (kindOf ? raw.draft.map(kindOf) : null));
    lazy(f, "labels", () => draftLabels(f.draftTokens, f.draftKinds));
    lazy(f, "alternatives", () => (raw.alt_ids ? raw.alt_ids.map((row, p) => row.map((i, k) =>
      [data.tokens[i], raw.alt_milli[p][k] / 1000, kindOf ? kindOf(i) : TEXT])) : null));
    f.draftLabels = () => f.labels;
    return f;
  });
}

// Each position of frame `f` as the canvas shows it: a live block (accepted draft tokens and the noise around them)
// or, when `live` is false, the finished block (committed tokens, pads after end-of-sequence)
function positions(f, live) {
  const n = f.canvasLength, flags = f.accepted;
  const then = (pos) => {  // the alternatives at the forward where the token was first accepted, if not this one
    const at = f.blockFrames && f.first[pos] >= 0 && f.first[pos] !== f.step ? f.blockFrames[f.first[pos]] : null;
    return at && at.alternatives ? at.alternatives[pos] : null;
  };
  const common = (pos) => ({pos, confidence: f.confidence[pos], entropy: f.entropy[pos], first: f.first[pos],
    remelted: false, alternatives: f.alternatives ? f.alternatives[pos] : [], firstAlternatives: then(pos)});
  if (live) {
    const shown = flags.map((a, p) => (a ? f.draftTokens[p] : f.inputTokens[p]));
    const kinds = f.draftKinds && f.inputKinds ? flags.map((a, p) => (a ? f.draftKinds[p] : f.inputKinds[p])) : null;
    const cells = tokenCells(shown, kinds, flags), drafts = tokenCells(f.draftTokens, f.draftKinds);
    return flags.map((a, pos) => ({...common(pos), kind: a ? "accepted" : "noisy", cell: cells[pos],
      guess: a ? null : drafts[pos], remelted: f.remelted[pos], fresh: a && f.first[pos] === f.step}));
  }
  const kept = Math.max(0, Math.min(n, f.committed - f.block * n));
  const cells = tokenCells(f.draftTokens, f.draftKinds, flags.map((_, pos) => pos < kept));
  return flags.map((_, pos) => ({...common(pos), kind: pos < kept ? "committed" : "pad", cell: cells[pos],
    guess: null}));
}

// A block of frame `f` for `blockView`: its header line's parts and its positions
function blockModel(f, live) {
  const n = f.canvasLength;
  const header = [`Block ${f.block + 1}`];
  if (live) {
    header.push(`step ${f.step + 1}/${f.maxSteps}`, `T=${fixed(f.temperature, 2)}`,
      `${f.accepted.filter(Boolean).length}/${n} accepted`);
    if (f.blockRemelts) header.push(`${f.blockRemelts} re-melted`);
    if (f.stopReason === "cancelled") header.push("stopped");
  } else {
    const kept = Math.max(0, Math.min(n, f.committed - f.block * n));
    const pads = (f.draftKinds || []).slice(0, kept).filter((k) => k === PAD).length;
    header.push(plural(f.step + 1, "forward"), f.stoppedEarly ? "stopped early (stable)" : "all steps");
    if (f.blockRemelts) header.push(`${f.blockRemelts} re-melted`);
    if (kept < n) header.push(`${plural(kept - pads, "token")} kept, end-of-sequence`);
    if (pads) header.push(`${plural(pads, "pad")} (not counted)`);
  }
  return {index: f.block, live, header, positions: positions(f, live)};
}

function settingsLine(s) {
  return `max new tokens ${s.max_new_tokens}${DOT}max steps ${s.max_denoising_steps}${DOT}entropy bound ` +
    `${general(s.entropy_bound)}${DOT}t ${general(s.t_max)}\u2192${general(s.t_min)}${DOT}adaptive stopping ` +
    `${s.adaptive_stopping ? "on" : "off"} (stability ${s.stability_threshold}, confidence ` +
    `${general(s.confidence_threshold)})`;
}

function fillPage(data) {
  const m = data.model;
  const revision = m.revision ? `@${Array.from(m.revision).slice(0, 12).join("")}` : "";
  const badges = [`model: ${m.name}${revision}`, `device: ${m.device}`, `dtype: ${m.dtype}`,
    `canvas: ${m.canvas_length} tokens`, `seed: ${data.seed}`, data.raw ? "raw prompt" : "chat prompt"];
  document.title = `DiffGemma replay${DOT}${m.name}${DOT}seed ${data.seed}`;
  $("dg-replay-settings").textContent = settingsLine(data.settings);
  $("dg-replay-badges").replaceChildren(...badges.map((b) => el("span", {class: "dg-badge"}, b)));
  $("dg-replay-prompt").textContent = plainText(data.prompt);
  $("dg-replay-text").textContent = plainText(data.text);
  $("dg-replay-version").textContent = String(data.trace_version);
  $("dg-legend").replaceChildren(legendView());
}

async function unpack(id) {  // a gzip file inlined as base64, as text
  const bytes = Uint8Array.from(atob($(id).textContent.trim()), (c) => c.charCodeAt(0));
  const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
  return await new Response(stream).text();
}

// How fast a player walks through the forwards: ms each stays on screen, or LIVE (each as it computes)
const LIVE = "live";
const PACES = {teach: 800, default: 150, fast: 50, [LIVE]: LIVE};
const PACE_LABELS = {teach: "slow (teaching)", default: "default", fast: "fast", [LIVE]: "as it computes"};
const ANNOUNCE_MS = 2000;  // the live region speaks at most this often
const reducedMotion = () => matchMedia("(prefers-reduced-motion: reduce)").matches;

// The player of `data` in the elements `find(id)` gives (one that is missing is not drawn), its state on `root`'s
// dataset and on the canvas element (data-forward, data-playing). Options: `pace()` (a PACES value), `engineDone()`
// (false while a live run may bring more frames), `meterFrame(shown, newest)` (the frame the meter reads: the
// engine's clock), `presenting()`, `onPresent(on)`, `active()` (whether the page's keys are the player's).
// `load(data, same)` plays another run, or more frames of this one; `ended()` says the engine has finished.
function mountPlayer(find, data, root, {presenting = () => false, onPresent = () => {}, active = () => true,
  pace = () => (presenting() ? data.present_interval_ms : data.interval_ms), engineDone = () => true,
  meterFrame = (shown) => shown} = {}) {
  const config = {displaylogo: false, responsive: true, showSendToCloud: false,
    modeBarButtonsToRemove: ["select2d", "lasso2d", "sendDataToCloud"]};
  const slider = find("dg-replay-slider"), play = find("dg-replay-play"), canvasHost = find("dg-canvas");
  const board = find("dg-board") || canvasHost;  // the Tab stop: the finished blocks and the live one
  const chipsShown = () => board.querySelectorAll(".dg-chip");
  let frames = [], blocks = [], last = -1, finished = new Map(), current = -1, shown = "", timer = null;
  let cursor = -1, spoken = 0, waiting = false, running = false, metered = null, meteredEnded = false;

  function load(next, same = false) {
    data = next;
    frames = frameModels(data);
    last = frames.length - 1;
    blocks = [];
    frames.forEach((f) => { (blocks[f.block] = blocks[f.block] || []).push(f); });
    frames.forEach((f) => { f.blockFrames = blocks[f.block]; });
    if (!same) { finished = new Map(); shown = ""; current = -1; cursor = -1; }
    if (slider) { slider.max = String(Math.max(0, last)); slider.disabled = last < 0; }
    if (waiting && current < last) { waiting = false; schedule(); }
    if (current >= 0) drawMeter(meterFrame(frames[current], frames[last]));
    report();
  }
  function stackSections(f) {
    const sections = [];
    for (let b = 0; b < (f.blockDone ? f.block + 1 : f.block); b++) {
      const end = blocks[b][blocks[b].length - 1];
      if (!end.blockDone) continue;
      if (!finished.has(b)) finished.set(b, blockView(blockModel(end, false)));
      sections.push(finished.get(b));
    }
    return sections;
  }
  // The meter of frame model `f`, drawn again only when it reads another frame (a meter the page set stays)
  function plot(id, figure) {
    if (find(id) && typeof Plotly !== "undefined") Plotly.react(find(id), figure.data, figure.layout, config);
  }
  const playing = () => !(engineDone() && current >= last);
  // The meter of frame `f`, the engine's clock ("done" once the engine's run ended, a failed one included), drawn
  // again only when it reads another frame or the run has ended since (a meter the page set stays till then)
  function drawMeter(f) {
    const host = find("dg-meter"), ended = engineDone();
    if (!host || !f || (f === metered && ended === meteredEnded)) return;
    const view = meterView(f);
    if (ended && f === frames[last] && view.dataset.state === "running") view.dataset.state = "done";
    host.replaceChildren(view);
    metered = f;
    meteredEnded = ended;
  }
  // The words beside the view that keep the engine's pace and the playback's apart
  function report() {
    const status = find("dg-replay-status");
    if (!status || last < 0) return;
    const newest = frames[last];
    let text = "";
    if (current < last) {
      const where = `${running ? "playing" : "paused at"} forward ${current + 1}`;
      text = engineDone() ? `the engine finished in ${formatNumber(newest.elapsed, 2, " s")} (engine clock); ` +
        `${where} of ${last + 1}` : `the engine is at forward ${last + 1}; ${where}`;
    }
    if (status.textContent !== text) status.textContent = text;
  }
  function announce(f, force = false) {
    const region = find("dg-replay-announce");
    if (!region || (!force && Date.now() - spoken < ANNOUNCE_MS)) return;
    spoken = Date.now();
    const n = f.canvasLength, accepted = f.accepted.filter(Boolean).length;
    region.textContent = f.done && current >= last
      ? `Done: ${STOP_REASONS[f.stopReason] || f.stopReason}; ${plural(f.committedTokens, "token")} committed.`
      : `Block ${f.block + 1}, forward ${f.forward + 1}: ${accepted} of ${n} positions accepted.`;
  }
  function markCursor() {
    if (!board) return;
    const chips = chipsShown();
    if (cursor >= chips.length) cursor = chips.length - 1;
    chips.forEach((chip, pos) => {
      chip.classList.toggle("dg-cursor", pos === cursor);
      if (pos === cursor) chip.id = `${board.id}-cursor`; else if (chip.id) chip.removeAttribute("id");
    });
    if (cursor >= 0) board.setAttribute("aria-activedescendant", `${board.id}-cursor`);
    else board.removeAttribute("aria-activedescendant");
  }
  function show(k) {
    if (last < 0) return;
    k = Math.max(0, Math.min(last, k));
    const f = frames[k], block = blocks[f.block];
    const stack = stackView(stackSections(f));
    if (find("dg-stack")) {
      find("dg-stack").replaceChildren(...(stack ? [stack] : []));
      if (stack && stack.lastElementChild) {  // the end of the stack, or the newest block's header when taller
        const newestTop = stack.lastElementChild.getBoundingClientRect().top - stack.getBoundingClientRect().top;
        stack.scrollTop = Math.min(newestTop, stack.scrollHeight - stack.clientHeight);
      }
    }
    current = k;
    const status = k === last && f.done ? (f.stopReason in STOP_REASONS ? STOP_REASONS[f.stopReason] : f.stopReason)
      : "";
    const view = liveView(f.forward, f.blockDone ? null : blockModel(f, true), status);
    view.dataset.playing = String(playing());
    canvasHost.replaceChildren(view);
    drawMeter(meterFrame(f, frames[last]));
    if (`${f.block}:${block.length}` !== shown) {
      plot("dg-heatmap", heatmapFigure(block));
      plot("dg-entropy", entropyFigure(block));
      shown = `${f.block}:${block.length}`;
    }
    if (find("dg-heatmap") && find("dg-heatmap").data) {
      Plotly.relayout(find("dg-heatmap"), {shapes: heatmapCover(f.step, block.length)});
    }
    plot("dg-order", orderFigure(f));
    const label = find("dg-replay-label");
    if (label) label.textContent = `forward ${k + 1}/${last + 1}${DOT}block ${f.block + 1}${DOT}step ${f.step + 1}`;
    const line = find("dg-replay-caption");
    if (line) line.textContent = caption(f, f.step > 0 ? frames[k - 1] : null);
    if (slider) slider.value = String(k);
    root.dataset.forward = String(k);
    root.dataset.playing = String(playing());
    markCursor();
    report();
    announce(f, f.done && k === last);
  }
  function setButton(on) {
    if (!play) return;
    play.textContent = on ? "\u275a\u275a" : "\u25b6";
    play.setAttribute("aria-label", on ? "pause" : "play");
  }
  function stopTimer() {
    if (timer !== null) { clearTimeout(timer); cancelAnimationFrame(timer); }
    timer = null;
  }
  function pause() {
    stopTimer();
    waiting = running = false;
    setButton(false);
    root.dataset.playing = String(playing());
    report();
  }
  function tick() {
    timer = null;
    if (current >= last) {
      if (engineDone()) { pause(); return; }
      waiting = true;  // at the newest forward of a run still going: the next `load` goes on
      return;
    }
    const behind = last - current;
    show(pace() === LIVE && behind > 4 ? last - 1 : current + 1);
    if (current >= last && engineDone()) pause();  // the run's last forward is on screen: the playback is over
    else schedule();
  }
  function schedule() {
    stopTimer();
    const ms = pace();
    timer = ms === LIVE ? requestAnimationFrame(tick) : setTimeout(tick, ms);
  }
  function start() {  // at the end of a run still going, it waits for the next forward
    if (last < 0) return;
    if (current >= last && engineDone()) show(0);
    setButton(true);
    running = true;
    root.dataset.playing = "true";
    schedule();
  }
  const isPlaying = () => timer !== null || waiting;
  const toggle = () => (isPlaying() ? pause() : start());
  const nextBlock = () => {
    const next = frames.findIndex((f) => f.block > frames[current].block);
    return next < 0 ? last : next;
  };
  const step = (k) => { pause(); show(k); };
  if (play) play.addEventListener("click", toggle);
  const on = (id, fn) => { if (find(id)) find(id).addEventListener("click", fn); };
  on("dg-replay-prev", () => step(current - 1));
  on("dg-replay-next", () => step(current + 1));
  on("dg-replay-end", () => step(last));
  if (slider) slider.addEventListener("input", () => step(Number(slider.value)));
  // The canvas is one Tab stop: arrows move along its positions, Enter or Space opens "why this token?"
  if (board) {
    board.tabIndex = 0;
    board.setAttribute("role", "group");
    board.setAttribute("aria-label", "canvas: arrow keys move along the positions, Enter explains a token");
    board.addEventListener("keydown", (event) => {
      const chips = chipsShown();
      if (!chips.length) return;
      const moves = {ArrowRight: 1, ArrowDown: 1, ArrowLeft: -1, ArrowUp: -1};
      if (event.key in moves) {
        event.preventDefault();
        event.stopPropagation();
        cursor = Math.max(0, Math.min(chips.length - 1, (cursor < 0 ? -moves[event.key] : cursor) + moves[event.key]));
        markCursor();
        const box = chips[cursor].getBoundingClientRect();
        if (box.top < 0 || box.bottom > innerHeight) chips[cursor].scrollIntoView({block: "nearest"});
      } else if ((event.key === "Enter" || event.key === " ") && cursor >= 0) {
        event.preventDefault();
        event.stopPropagation();
        openPopup(chips[cursor]);
      }
    });
  }
  document.addEventListener("keydown", (event) => {
    if (!active() || last < 0 || (board && board.contains(event.target))) return;
    const tag = event.target ? event.target.tagName : "";  // a focused button keeps its keys, except when presenting
    if (event.target !== slider && (/^(INPUT|TEXTAREA|SELECT)$/.test(tag) || (tag === "BUTTON" && !presenting()))) {
      return;
    }
    const moves = {ArrowLeft: current - 1, ArrowRight: current + 1, Home: 0, End: last};
    if (event.key in moves) { event.preventDefault(); step(moves[event.key]); }
    else if (event.key === " ") { event.preventDefault(); toggle(); }
    else if (event.key === "b" || event.key === "B") { event.preventDefault(); step(nextBlock()); }
    else if (event.key === "p" || event.key === "P") { event.preventDefault(); onPresent(true); }
    else if (event.key === "Escape") { onPresent(false); }
  });
  let startX = null;  // a swipe steps (left: forward, right: back); the page never navigates away by it
  root.addEventListener("touchstart", (event) => { startX = event.touches[0].clientX; }, {passive: true});
  root.addEventListener("touchmove", (event) => {
    if (startX !== null && Math.abs(event.touches[0].clientX - startX) > 10 && event.cancelable) event.preventDefault();
  }, {passive: false});
  root.addEventListener("touchend", (event) => {
    if (startX === null) return;
    const dx = event.changedTouches[0].clientX - startX;
    startX = null;
    if (Math.abs(dx) >= 40 && last >= 0) step(current + (dx < 0 ? 1 : -1));
  });
  if (data) load(data);
  return {show, start, pause, load, step, playing: isPlaying, last: () => last, current: () => current,
    frames: () => frames, schedule, ended: () => {  // the engine's run ended: a playback waiting for more stops
      if (waiting && current >= last) pause();
      report();
      if (current >= 0) show(current);
    },
    redraw: () => { shown = ""; if (current >= 0) show(current); }};
}

// "Why this token?" as a popup beside `chip` (its tooltip's lines; a second call on the same chip closes it)
let popup = null;
function closePopup() { if (popup) { popup.remove(); popup = null; } }
function openPopup(chip) {
  if (popup && popup.dataset.for === chip.title) { closePopup(); return; }
  closePopup();
  popup = el("div", {class: "dg-popup", role: "tooltip", "data-for": chip.title}, chip.title);
  document.body.append(popup);
  const box = chip.getBoundingClientRect();
  const left = Math.min(box.left, window.innerWidth - popup.offsetWidth - 8);
  const below = box.bottom + 6 + popup.offsetHeight < window.innerHeight;
  popup.style.left = `${Math.max(8, left)}px`;
  popup.style.top = `${below ? box.bottom + 6 : Math.max(8, box.top - popup.offsetHeight - 6)}px`;
}

// A tap or click on a chip opens its popup (a phone cannot hover); another tap, Escape or a scroll closes it
document.addEventListener("click", (event) => {
  const chip = event.target.closest && event.target.closest(".dg-chip[title]");
  if (chip && chip.closest("#dg-branch-from")) return;  // Branch pins it
  if (chip) openPopup(chip); else closePopup();
});
document.addEventListener("keydown", (event) => { if (event.key === "Escape") closePopup(); });
window.addEventListener("scroll", closePopup, true);

async function main() {
  if (typeof DecompressionStream === "undefined") {
    throw new Error("this browser cannot unpack the replay (it needs DecompressionStream: Chrome 80+, " +
                    "Firefox 113+, Safari 16.4+)");
  }
  if (matchMedia("(prefers-color-scheme: dark)").matches) document.documentElement.classList.add("dark");
  const data = JSON.parse($("dg-replay-data").textContent), root = document.body;
  fillPage(data);
  (0, eval)(await unpack("dg-plotly"));  // defines window.Plotly
  // Presenter view: canvas, meter, heatmap and a caption in large type; settings, prompt and text hidden
  const present = (on) => {
    const playing = player.playing();
    player.pause();
    root.classList.toggle("dg-present", on);
    $("dg-replay-present").textContent = on ? "Leave" : "Present";
    if (playing) player.start();
  };
  const paceBox = $("dg-replay-pace");
  const player = mountPlayer($, data, root, {presenting: () => root.classList.contains("dg-present"),
    onPresent: present, pace: () => (root.classList.contains("dg-present") ? data.present_interval_ms
      : PACES[paceBox.value] || data.interval_ms)});
  paceBox.addEventListener("change", () => { if (player.playing()) player.schedule(); });
  $("dg-replay-present").addEventListener("click", () => present(!root.classList.contains("dg-present")));
  window.dgReplay = {show: player.show, frames: player.frames(), positions,
    positionOf: (chipNode) => chipPositions.get(chipNode)};
  player.show(player.last());
  if (/(^|[#&])present(=1)?($|&)/.test(location.hash.slice(1))) { present(true); player.show(0); }
  root.dataset.ready = "true";
}

if ($("dg-replay-data")) {
  main().catch((error) => {
    $("dg-replay-error").textContent = String((error && error.message) || error);
    document.body.dataset.ready = "error";
    throw error;
  });
}
