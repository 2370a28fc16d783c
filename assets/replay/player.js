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
      [data.tokens[i], raw.alt_milli[p][k] / 1000])) : null));
    f.draftLabels = () => f.labels;
    return f;
  });
}

// Each position of frame `f` as the canvas shows it: a live block (accepted draft tokens and the noise around them)
// or, when `live` is false, the finished block (committed tokens, pads after end-of-sequence)
function positions(f, live) {
  const n = f.canvasLength, flags = f.accepted;
  const common = (pos) => ({pos, confidence: f.confidence[pos], entropy: f.entropy[pos], first: f.first[pos],
    remelted: false, alternatives: f.alternatives ? f.alternatives[pos] : []});
  if (live) {
    const shown = flags.map((a, p) => (a ? f.draftTokens[p] : f.inputTokens[p]));
    const kinds = f.draftKinds && f.inputKinds ? flags.map((a, p) => (a ? f.draftKinds[p] : f.inputKinds[p])) : null;
    const cells = tokenCells(shown, kinds, flags), drafts = tokenCells(f.draftTokens, f.draftKinds);
    return flags.map((a, pos) => ({...common(pos), kind: a ? "accepted" : "noisy", cell: cells[pos],
      guess: a ? null : drafts[pos], remelted: f.remelted[pos]}));
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

// The player of `data` in the elements `find(id)` gives (one that is missing is not drawn), its state on `root`'s
// dataset: show a forward, play and pause (at narration speed while `presenting()`), the keys while `active()`.
// `load(data)` plays another run, or more frames of this one (`same`); P and Esc call `onPresent(true | false)`.
function mountPlayer(find, data, root, {presenting, onPresent, active = () => true}) {
  const config = {displaylogo: false, responsive: true, showSendToCloud: false,
    modeBarButtonsToRemove: ["select2d", "lasso2d", "sendDataToCloud"]};
  const slider = find("dg-replay-slider"), play = find("dg-replay-play");
  let frames = [], blocks = [], last = -1, finished = new Map(), current = -1, shown = "", timer = null;

  function load(next, same = false) {
    data = next;
    frames = frameModels(data);
    last = frames.length - 1;
    blocks = [];
    frames.forEach((f) => { (blocks[f.block] = blocks[f.block] || []).push(f); });
    if (!same) { finished = new Map(); shown = ""; current = -1; }
    slider.max = String(last);
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
  function plot(id, figure) { if (find(id)) Plotly.react(find(id), figure.data, figure.layout, config); }
  function show(k) {
    k = Math.max(0, Math.min(last, k));
    const f = frames[k], block = blocks[f.block];
    const stack = stackView(stackSections(f));
    find("dg-stack").replaceChildren(...(stack ? [stack] : []));
    if (stack && stack.lastElementChild) {  // the end of the stack, or the newest block's header when it is taller
      const newestTop = stack.lastElementChild.getBoundingClientRect().top - stack.getBoundingClientRect().top;
      stack.scrollTop = Math.min(newestTop, stack.scrollHeight - stack.clientHeight);
    }
    const status = k === last ? (f.stopReason in STOP_REASONS ? STOP_REASONS[f.stopReason] : f.stopReason) : "";
    find("dg-canvas").replaceChildren(liveView(f.forward, f.blockDone ? null : blockModel(f, true), status));
    find("dg-meter").replaceChildren(meterView(f));
    if (`${f.block}:${block.length}` !== shown) {
      plot("dg-heatmap", heatmapFigure(block));
      plot("dg-entropy", entropyFigure(block));
      shown = `${f.block}:${block.length}`;
    }
    Plotly.relayout(find("dg-heatmap"), {shapes: heatmapCover(f.step, block.length)});
    plot("dg-order", orderFigure(f));
    find("dg-replay-label").textContent = `forward ${k + 1}/${last + 1}${DOT}block ${f.block + 1}${DOT}step ` +
      `${f.step + 1}`;
    find("dg-replay-caption").textContent = caption(f, f.step > 0 ? frames[k - 1] : null);
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
  function start() {  // at the end of a run still going, it waits for the next forward
    if (current >= last && frames[last].done) show(0);
    play.textContent = "\u275a\u275a";
    play.setAttribute("aria-label", "pause");
    root.dataset.playing = "true";
    timer = setInterval(() => {
      if (current < last) show(current + 1);
      else if (frames[last].done) pause();
    }, presenting() ? data.present_interval_ms : data.interval_ms);
  }
  const toggle = () => (timer === null ? start() : pause());
  const nextBlock = () => {
    const next = frames.findIndex((f) => f.block > frames[current].block);
    return next < 0 ? last : next;
  };
  play.addEventListener("click", toggle);
  find("dg-replay-prev").addEventListener("click", () => { pause(); show(current - 1); });
  find("dg-replay-next").addEventListener("click", () => { pause(); show(current + 1); });
  slider.addEventListener("input", () => { pause(); show(Number(slider.value)); });
  document.addEventListener("keydown", (event) => {
    if (!active() || last < 0) return;
    if (event.target && event.target !== slider && /^(INPUT|TEXTAREA|SELECT)$/.test(event.target.tagName)) return;
    const moves = {ArrowLeft: current - 1, ArrowRight: current + 1, Home: 0, End: last};
    if (event.key in moves) { event.preventDefault(); pause(); show(moves[event.key]); }
    else if (event.key === " ") { event.preventDefault(); toggle(); }
    else if (event.key === "b" || event.key === "B") { event.preventDefault(); pause(); show(nextBlock()); }
    else if (event.key === "p" || event.key === "P") { event.preventDefault(); onPresent(true); }
    else if (event.key === "Escape") { onPresent(false); }
  });
  load(data);
  return {show, start, pause, load, playing: () => timer !== null, last: () => last, frames: () => frames};
}

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
  const player = mountPlayer($, data, root, {presenting: () => root.classList.contains("dg-present"),
    onPresent: present});
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
