// The replay player, part 3: ports of diffgemma_ui/canvas_view.py, meter.py and plots.py as DOM elements and Plotly
// figures; every trace string goes in as a text node, an attribute value or an escaped Plotly label, never markup.

const STOP_REASONS = {eos: "ended at end-of-sequence", max_new_tokens: "reached max new tokens", cancelled: "stopped",
  filled: "filled the blanks", "": ""};
const RATE_NOTE = "tokens/s and tokens/forward: committed blocks only (their tokens \u00f7 the engine time and " +
  "forwards they took)";
const DOT = " \u00b7 ";

// An element: attributes set in the given order, children appended (strings as text nodes, null skipped)
function el(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, value);
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(typeof child === "string" ? document.createTextNode(child) : child);
  }
  return node;
}

const plural = (count, word) => `${count} ${word}${count !== 1 ? "s" : ""}`;
const quoted = (text) => `\u201c${text}\u201d`;

// What a chip's tooltip says of position `p` (the lines of canvas_view.chip_html's title)
function chipLines(p) {
  const step = p.first < 0 ? "not yet" : `step ${p.first + 1}`;
  const lines = [`position ${p.pos}: ${quoted(p.cell.text)}`,
    `confidence ${fixed(p.confidence, 3)}${DOT}entropy ${fixed(p.entropy, 3)} nats`, `first accepted: ${step}`];
  if (p.kind === "noisy") {
    lines[0] = `position ${p.pos}: noise ${quoted(p.cell.text)} (renoised)`;
    if (p.guess) lines.push(`current guess: ${quoted(p.guess.text)}` + (p.guess.detail ? ` (${p.guess.detail})` : ""));
  } else if (p.kind === "pad") {
    lines.push("after end-of-sequence: dropped");
  }
  if (p.remelted) lines.splice(1, 0, "re-melted: accepted at an earlier step, renoised in this one");
  const weighed = (alternatives) => {
    const cells = tokenCells(alternatives.map(([token]) => token), alternatives.map(([, , kind]) => kind || TEXT));
    return alternatives.map(([, probability], k) => `${quoted(cells[k].text)} ${fixed(probability * 100, 0)}%`)
      .join(DOT);
  };
  if (p.firstAlternatives && p.firstAlternatives.length) {
    lines.push(`why this token? at step ${p.first + 1}, where it was first accepted: ${weighed(p.firstAlternatives)}`);
    if (p.alternatives.length) lines.push(`now: ${weighed(p.alternatives)}`);
  } else if (p.alternatives.length) {
    lines.push(`why this token? ${weighed(p.alternatives)}`);
  }
  if (p.cell.detail) lines.splice(1, 0, p.cell.detail);
  return lines;
}

// Each chip's position of the frame model (a per-token popup finds what to show here, from the hovered chip)
const chipPositions = new WeakMap();

// One canvas position as a chip (canvas_view.chip_html); `p` is a position of the frame model
function chip(p) {
  const style = p.cell.style === TEXT ? "" : ` dg-tok-${p.cell.style}`;
  const attributes = {class: `dg-chip dg-${p.kind}${style}${p.remelted ? " dg-remelt" : ""}${p.fresh ? " dg-new" : ""}`,
    title: chipLines(p).join("\n")};
  if ((p.kind === "accepted" || p.kind === "committed") && !CONTROL_STYLES.has(p.cell.style)) {
    const background = viridis(p.confidence);
    attributes.style = `background:${background};color:${textOn(background)}`;
  }
  const parts = p.cell.parts.map(([text, mark]) => (mark ? el("span", {class: "dg-sp"}, text) : text));
  const node = el("span", attributes, parts);
  chipPositions.set(node, p);
  return node;
}

// One block (canvas_view.block_html) from the frame model's `block` ({index, live, header, positions})
function blockView(block) {
  return el("section", {class: `dg-block dg-block-${block.live ? "live" : "done"}`, "data-block": String(block.index)},
    el("header", {}, block.header.join(DOT)), el("div", {class: "dg-chips"}, block.positions.map(chip)));
}

// The finished blocks, stacked (canvas_view.stack_html); null when there are none
function stackView(blocks) {
  if (!blocks.length) return null;
  return el("div", {class: "dg-stack", "data-blocks": String(blocks.length)}, blocks);
}

// The block being denoised and the status line (canvas_view.live_html)
function liveView(forward, block, status) {
  return el("div", {class: "dg-canvas", "data-forward": String(forward)}, block ? blockView(block) : null,
    status ? el("p", {class: "dg-status"}, status) : null);
}

// The colour legend (canvas_view.legend_html)
function legendView() {
  const stops = VIRIDIS.map((_, i) => viridis(i / 10)).join(", ");
  return el("div", {class: "dg-legend", "aria-hidden": "true"},
    el("span", {class: "dg-chip dg-noisy"}, "noise"), el("span", {}, "renoised"),
    el("span", {class: "dg-chip dg-noisy dg-remelt"}, "melt"), el("span", {}, "re-melted (was accepted)"),
    el("span", {class: "dg-scale", style: `background:linear-gradient(90deg, ${stops})`}),
    el("span", {}, "confidence 0 \u2192 1"),
    el("span", {class: "dg-chip dg-committed dg-tok-special"}, "eos"), el("span", {}, "special token (not text)"),
    el("span", {class: "dg-chip dg-committed dg-tok-byte"}, "0xE2"), el("span", {}, "byte"),
    el("span", {class: "dg-ws"}, el("span", {class: "dg-sp"}, "\u00b7"), " space ",
      el("span", {class: "dg-sp"}, "\u21b5"), " newline"));
}

// The meter's figures (meter.meter_values with no committed frame given, as the playground's replay shows them)
function meterValues(f) {
  const fpb = f.forwardsPerBlock;
  const counting = !fpb.length;
  const none = f.done ? DASH : "\u2026";
  let progress;
  if (f.done) {
    progress = (f.stopReason in STOP_REASONS ? STOP_REASONS[f.stopReason] : f.stopReason) || "done";
  } else {
    progress = `block ${f.block + 1}${DOT}step ${f.step + 1}/${f.maxSteps}`;
    if (counting) progress += `${DOT}tokens/s from the first committed block`;
  }
  const perForwardMs = msPerForward(f);
  return {
    "tokens/s": counting ? none : formatNumber(f.tokensPerSecond, 1),
    "tokens/forward": counting ? none : formatNumber(f.tokensPerForward, 2),
    "forwards/block": fpb.length ? formatCount(fpb.reduce((a, b) => a + b, 0) / fpb.length, 1) : `\u2265 ${f.step + 1}`,
    "ms/forward": formatNumber(perForwardMs, perForwardMs >= 10 ? 0 : 1),
    [`forwards used of ${grouped(String((f.block + 1) * f.maxSteps))}`]: grouped(String(f.forward + 1)),
    "elapsed": formatNumber(f.elapsed, 2, " s"),
    "first frame": formatNumber(f.firstFrame * 1000, 0, " ms"),
    "tokens": grouped(String(f.committedTokens)),
    "progress": progress,
  };
}

// meter_values' ms/forward: engine ms per decoder forward after the first (prefill excluded); before it, the first's
function msPerForward(f) {
  return f.forward < 1 ? f.firstFrame * 1000 : (f.elapsed - f.firstFrame) / f.forward * 1000;
}

// meter_html's short-answer note: an answer ended at EOS that filled under half of the positions it paid for
function shortAnswerNote(f) {
  const positions = (f.block + 1) * f.canvasLength;
  if (!f.done || f.stopReason !== "eos" || 2 * f.committedTokens >= positions) return "";
  return `a ${grouped(String(f.committedTokens))}-token answer paid for ${grouped(String(positions))} canvas ` +
    "positions: every forward denoises the whole canvas, so tokens/s counts only the answer";
}

// A meter label with a line break allowed after each "/" ("tokens/<wbr>s")
function labelParts(label) {
  const parts = [];
  label.split("/").forEach((part, i, all) => {
    if (i) parts.push(el("wbr"));
    parts.push(i < all.length - 1 ? `${part}/` : part);
  });
  return parts;
}

// The meter (meter.meter_html): a card per figure, progress, seed and counts below
function meterView(f) {
  const values = meterValues(f);
  const progress = values.progress;
  delete values.progress;
  const cards = Object.entries(values).map(([label, value]) => el("div", {class: "dg-stat"},
    el("span", {class: "dg-stat-value"}, value), el("span", {class: "dg-stat-label"}, labelParts(label))));
  let tps = f.forwardsPerBlock.length ? f.tokensPerSecond : 0;
  if (!Number.isFinite(tps)) tps = 0;
  const ttff = Number.isFinite(f.firstFrame) ? f.firstFrame : 0;
  const prompt = f.promptTokens;
  const footer = el("div", {class: "dg-meter-note"}, el("span", {class: "dg-progress"}, progress),
    ` engine clock${DOT}seed ${f.seed}${DOT}prompt ${grouped(String(prompt))} token${prompt === 1 ? "" : "s"}${DOT}` +
    `${grouped(String(f.forward + 1))} forward${f.forward === 0 ? "" : "s"} `,
    el("span", {class: "dg-rate-note"}, RATE_NOTE));
  const short = shortAnswerNote(f);
  return el("div", {class: "dg-meter", "data-state": f.done ? "done" : "running", "data-tps": general(tps),
    "data-ttff": general(ttff)}, cards, footer,
    short ? el("div", {class: "dg-meter-note dg-short-answer"}, short) : null);
}

// -- figures (plots.py) -------------------------------------------------------------------------------------------

const HEIGHT = 330, TOOLBAR_PX = 28;
const GRID = "rgba(128,128,128,0.22)", NOT_ACCEPTED_COLOUR = "rgba(140,140,140,0.45)";
const ACCEPTED_COLOUR = "#E69F00", ENTROPY_COLOUR = "#56B4E9", REMELT_COLOUR = "#f97316";
const GAP_CELLS = 96, HOVER_CELLS = 16384;  // plots.GAP_CELLS, plots.HOVER_CELLS
const round3 = (x) => Number(fixed(x, 3));

// plots._layout; belowToolbar: title and top margin moved down by TOOLBAR_PX, clear of the hover mode bar
function layout(title, extra, belowToolbar = false) {
  const drop = belowToolbar ? TOOLBAR_PX : 0, height = HEIGHT + drop;
  const spec = Object.assign({
    title: {text: escapePlotly(title), x: 0.01, xanchor: "left", y: round3(1 - (5 + drop) / height), yanchor: "top",
      font: {size: 14}},
    height, margin: {l: 48, r: 16, t: 40, b: 40},
    paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
    font: {family: "Inter, system-ui, sans-serif", size: 12, color: "#7c8494"},
    hoverlabel: {font: {family: "ui-monospace, SFMono-Regular, Menlo, monospace", size: 12}},
    showlegend: false,
  }, extra);
  spec.margin = Object.assign({}, spec.margin, {t: spec.margin.t + drop});
  return spec;
}

const axis = (title, extra) => Object.assign({title: {text: title}, gridcolor: GRID, zeroline: false}, extra);

function legendLine(...lines) {
  return {text: lines.map(escapePlotly).join("<br>"), showarrow: false, align: "left", xref: "paper", yref: "paper",
    x: 0, y: 1.0, xanchor: "left", yanchor: "bottom", font: {size: 11}};
}

// plots._block_title: what the figure shows and how far its block got
function blockTitle(frames, what) {
  const last = frames[frames.length - 1];
  const steps = last.step + 1;
  let state;
  if (last.blockDone) state = `${DOT}${plural(steps, "step")}`;
  else if (last.done) state = `${DOT}stopped at step ${steps}`;
  else state = `${DOT}step ${steps}/${last.maxSteps}${DOT}live`;
  return `${what}${DOT}block ${last.block + 1}${state}`;
}

// plots.confidence_heatmap(frames, animate=False, hover=True): confidence per (step, position) of one block
function heatmapFigure(frames) {
  const n = frames[0].confidence.length;
  const withHover = n * frames.length <= HOVER_CELLS;
  const z = [], hover = [], dotsX = [], dotsY = [], meltX = [], meltY = [];
  let before = [];
  frames.forEach((f, row) => {
    z.push(f.confidence.map(round3));
    const labels = withHover ? f.draftLabels() : [];
    if (withHover) hover.push(f.confidence.map((c, pos) => {
      return `step ${row + 1}${DOT}position ${pos}<br>${quoted(escapePlotly(labels[pos]))} ` +
        `${f.accepted[pos] ? "accepted" : "renoised"}<br>` +
        `confidence ${fixed(c, 3)}${DOT}entropy ${fixed(f.entropy[pos], 3)} nats`;
    }));
    f.accepted.forEach((a, pos) => {
      if (a && !before[pos]) { dotsX.push(pos); dotsY.push(row + 1); }
      else if (!a && f.remelted[pos]) { meltX.push(pos); meltY.push(row + 1); }
    });
    before = f.accepted;
  });
  const last = frames[frames.length - 1];
  const rows = last.blockDone || last.done ? frames.length : Math.max(frames.length, last.maxSteps);
  const data = [
    {type: "heatmap", z, x: [...Array(n).keys()], y: frames.map((_, i) => i + 1), hoverongaps: false,
      ...(withHover ? {hovertext: hover, hovertemplate: "%{hovertext}<extra></extra>"}
        : {hovertemplate: "step %{y} \u00b7 position %{x}<br>confidence %{z:.3f}<extra></extra>"}),
      colorscale: "Viridis", zmin: 0, zmax: 1,
      xgap: Number(n <= GAP_CELLS), ygap: Number(rows <= GAP_CELLS),
      colorbar: {title: {text: "conf."}, thickness: 10, len: 0.9, outlinewidth: 0}},
    {type: "scatter", mode: "markers", x: dotsX, y: dotsY, hoverinfo: "skip", name: "accepted at this step",
      marker: {symbol: "circle", size: n * rows <= 64 * 64 ? 4 : 3, color: "rgba(255,255,255,0.85)",
        line: {width: 0.5, color: "rgba(0,0,0,0.6)"}}},
    {type: "scatter", mode: "markers", x: meltX, y: meltY, hoverinfo: "skip", name: "re-melted at this step",
      marker: {symbol: "x", size: 7, color: REMELT_COLOUR}},
  ];
  return {data, layout: layout(blockTitle(frames, "Confidence per step and position"), {
    xaxis: axis("position", {range: [-0.5, n - 0.5], showgrid: false}),
    yaxis: axis("step", {range: [rows + 0.5, 0.5], autorange: false, showgrid: false,
      dtick: Math.max(1, Math.ceil(rows / 8))}),
    annotations: [legendLine("colour: confidence of the draft token",
      "white dot: accepted \u00b7 orange \u00d7: re-melted (was accepted)")],
    margin: {l: 48, r: 16, t: 72, b: 40},
  })};
}

// The grey cover over the heatmap's rows after step k (the playground heatmap's animation, one frame)
function heatmapCover(k, steps) {
  return [{type: "rect", xref: "paper", x0: 0, x1: 1, yref: "y", y0: k + 1.5, y1: steps + 0.5,
    fillcolor: "rgba(128,128,128,0.88)", line: {width: 0}, layer: "above", visible: k < steps - 1}];
}

// plots.unmasking_order: per position, the step (1-based) at which it was first accepted
function orderFigure(f) {
  const n = f.first.length;
  const steps = Math.max(1, f.maxSteps);
  const last = Math.max(0, ...f.first.filter((s) => s >= 0)) + 1;
  const labels = f.draftLabels();
  const y = [], colours = [], hover = [];
  f.first.forEach((step, pos) => {
    const token = escapePlotly(labels[pos]);
    if (step < 0) {
      y.push(0.3);
      colours.push(NOT_ACCEPTED_COLOUR);
      hover.push(`position ${pos}<br>${quoted(token)}<br>not accepted yet`);
    } else {
      y.push(step + 1);
      colours.push(last > 1 ? viridis(step / Math.max(1, last - 1)) : viridis(0));
      hover.push(`position ${pos}<br>${quoted(token)}<br>first accepted at step ${step + 1}`);
    }
  });
  const top = Math.min(steps, Math.max(last, 1));
  return {data: [{type: "bar", x: [...Array(n).keys()], y, marker: {color: colours, line: {width: 0}}, hovertext: hover,
    hovertemplate: "%{hovertext}<extra></extra>"}], layout: layout(blockTitle([f], "Unmasking order"), {
    xaxis: axis("position", {range: [-0.5, n - 0.5]}),
    yaxis: axis("first accepted at step", {range: [0, top + 0.5], dtick: Math.max(1, Math.ceil(top / 6))}),
    bargap: 0.15,
    annotations: [legendLine("bar height and colour: step first accepted", "short grey bar: not accepted yet")],
    margin: {l: 48, r: 16, t: 72, b: 40},
  }, true)};
}

// plots.whole_step: the tick step (1, 2, 5, 10, 20, 50...) that puts at most `most` steps on 0..span
function wholeStep(span, most = 7) {
  for (let e = 0; e < 20; e++) for (const m of [1, 2, 5]) if (span <= most * m * 10 ** e) return m * 10 ** e;
  return 10 ** 20;
}

// plots.entropy_and_acceptance: mean entropy (line) and positions accepted (bars) per step of one block
function entropyFigure(frames) {
  const steps = frames.map((_, i) => i + 1);
  const n = frames[0].confidence.length;
  const mean = (f) => f.entropy.reduce((a, b) => a + b, 0) / Math.max(1, f.entropy.length);
  return {data: [
    {type: "bar", x: steps, y: frames.map((f) => f.accepted.filter(Boolean).length), yaxis: "y2", name: "accepted",
      marker: {color: ACCEPTED_COLOUR, opacity: 0.6, line: {width: 0}},
      hovertemplate: "step %{x}<br>%{y} accepted<extra></extra>"},
    {type: "scatter", mode: "lines+markers", x: steps, y: frames.map((f) => round3(mean(f))), name: "mean entropy",
      line: {color: ENTROPY_COLOUR, width: 2.5}, marker: {size: 5},
      hovertemplate: "step %{x}<br>mean entropy %{y:.3f} nats<extra></extra>"},
  ], layout: layout(blockTitle(frames, "Entropy & acceptance"), {
    xaxis: axis("step", {range: [0.5, Math.max(frames.length, 1) + 0.5], tick0: 1,
      dtick: Math.max(1, Math.ceil(frames.length / 8))}),
    yaxis: axis("mean entropy (nats)", {rangemode: "tozero"}),
    yaxis2: {title: {text: "accepted positions"}, overlaying: "y", side: "right", range: [0, n], showgrid: false,
      zeroline: false, tickmode: "linear", tick0: 0, dtick: wholeStep(n)},
    margin: {l: 52, r: 52, t: 64, b: 40},
    showlegend: true,
    legend: {orientation: "h", x: 0, xanchor: "left", y: 1.0, yanchor: "bottom", font: {size: 11},
      bgcolor: "rgba(0,0,0,0)"},
  }, true)};
}

// -- presenter captions ----------------------------------------------------------------------------------------

// One plain-language line for frame `f` (its block's previous frame `prev`, or null) that a teacher can read aloud
function caption(f, prev) {
  const n = f.canvasLength, accepted = f.accepted.filter(Boolean).length;
  const fresh = f.first.filter((step) => step === f.step).length;
  const melted = f.remelted.filter(Boolean).length;
  let line;
  if (!prev) {
    line = `Forward ${f.forward + 1}: block ${f.block + 1} starts as ${n} random tokens; the model keeps the ` +
      `${plural(accepted, "position")} it is surest of and renoises the other ${n - accepted}.`;
  } else {
    line = `Forward ${f.forward + 1}: ${accepted} of ${n} positions accepted, ${fresh} for the first time; ` +
      `${n - accepted} renoised.`;
    if (melted) line += ` ${plural(melted, "token")} melted back into noise: accepted before, not now.`;
  }
  if (f.blockDone) {
    line += ` Block ${f.block + 1} is committed after ${plural(f.step + 1, "forward")}` +
      (f.stoppedEarly ? ": its likeliest tokens had settled." : ".");
  }
  if (f.done) {
    line += {eos: " End of sequence: the answer is complete.", max_new_tokens: " The token budget is spent.",
      cancelled: " The run was stopped here."}[f.stopReason] || "";
  }
  return line;
}
