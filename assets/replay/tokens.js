// The replay player, part 2: what one canvas position shows, by token kind (a port of diffgemma_ui/token_view.py).
// A cell: {text, parts, style, detail}: `text` for tooltips, `parts` ([text, isMark] pairs) for the chip, `style`
// its dg-tok-* class, `detail` a tooltip line.

const PAD = "pad", EOS = "eos", SPECIAL = "special", BYTE = "byte", TEXT = "text";
const CONTROL_STYLES = new Set([SPECIAL, PAD, EOS]);
const MARKER = /^<(\|?)([^<>|]*)(\|?)>$/u;
const ID_PIECE = /^<id:(-?\p{Nd}+)>$/u;
const BYTE_PIECES = /^(?:<0x[0-9A-Fa-f]{2}>)+$/;
// Python's str.isspace() characters (what str.strip() removes)
const PY_SPACE = "\\t\\n\\v\\f\\r\\x1c-\\x1f \\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000";
const PY_STRIP = new RegExp(`^[${PY_SPACE}]+|[${PY_SPACE}]+$`, "gu");
const BRACKETS = /^[<>[\]|]+|[<>[\]|]+$/g;
const utf8 = new TextDecoder("utf-8", {fatal: true});

const cell = (text, style, detail = "") => ({text, parts: [[text, false]], style, detail});

// token_view.special_label: <pad> -> "pad", <|turn> -> "turn start", <turn|> -> "turn end", <id:N> -> "id N"
function specialLabel(piece) {
  piece = String(piece);
  let match = ID_PIECE.exec(piece);
  if (match) return `id ${match[1]}`;
  match = MARKER.exec(piece);
  if (match) {
    const [, opens, rawName, closes] = match;
    const name = rawName.replace(/_/g, " ").replace(PY_STRIP, "") || "marker";
    if (opens && !closes) return `${name} start`;
    if (closes && !opens) return `${name} end`;
    return name;
  }
  return piece.replace(BRACKETS, "") || "special";
}

// engine.frames.parse_byte_display: "<0xE2><0x80>" -> [0xE2, 0x80]; [] when the string is not byte pieces
function parseByteDisplay(text) {
  if (!BYTE_PIECES.test(text)) return [];
  return text.match(/<0x[0-9A-Fa-f]{2}>/g).map((piece) => parseInt(piece.slice(3, 5), 16));
}

const hex = (bytes) => bytes.map((b) => b.toString(16).toUpperCase().padStart(2, "0")).join(" ");

// The bytes split into UTF-8 characters: [start, end, character], or [i, i + 1, null] for a byte that starts none
function utf8Units(data) {
  const units = [];
  let i = 0;
  while (i < data.length) {
    const lead = data[i];
    const size = lead < 0x80 ? 1 : lead >= 0xC2 && lead <= 0xDF ? 2 : lead >= 0xE0 && lead <= 0xEF ? 3
      : lead >= 0xF0 && lead <= 0xF4 ? 4 : 0;
    if (size && i + size <= data.length) {
      try {
        units.push([i, i + size, utf8.decode(new Uint8Array(data.slice(i, i + size)))]);
        i += size;
        continue;
      } catch (error) { /* not a character: a lone byte below */ }
    }
    units.push([i, i + 1, null]);
    i += 1;
  }
  return units;
}

// The cells of consecutive byte positions, read as one UTF-8 byte string
function byteRun(pieces) {
  const data = pieces.flat();
  const owner = pieces.flatMap((piece, index) => piece.map(() => index));
  const shown = pieces.map(() => []), notes = pieces.map(() => []);
  for (const [begin, end, char] of utf8Units(data)) {
    const first = owner[begin], last = owner[end - 1];
    if (char === null) {
      const name = `0x${hex([data[begin]])}`;
      shown[first].push(name);
      notes[first].push(`byte ${name}: not a whole UTF-8 character here`);
      continue;
    }
    const visible = visibleToken(char);
    shown[first].push(visible);
    if (last === first) {
      notes[first].push(`bytes ${hex(data.slice(begin, end))} = \u201c${visible}\u201d`);
      continue;
    }
    notes[first].push(`bytes ${hex(data.slice(begin, end))} over ${last - first + 1} positions = ` +
      `\u201c${visible}\u201d`);
    for (let index = first + 1; index <= last; index++) {
      const back = index - first;
      notes[index].push(`continues \u201c${visible}\u201d from ${back} position${back !== 1 ? "s" : ""} before`);
    }
  }
  return pieces.map((piece, i) => {
    const texts = shown[i], lines = notes[i].join("; ");
    if (texts.length && texts.every((t) => t.startsWith("0x") && t.length === 4)) {
      return cell(texts.join(" "), "byte", lines);
    }
    if (texts.length) return cell(texts.join(""), "bytes", lines);
    return cell(`+${hex(piece)}`, "bytecont", lines);
  });
}

const singleCells = new Map();

// A token read on its own (text or special), cached: a canvas shows the same tokens often
function singleCell(token, kind) {
  const key = `${kind}\u0000${token}`;
  let found = singleCells.get(key);
  if (found === undefined) {
    if (CONTROL_STYLES.has(kind)) {
      const what = {pad: "pad", eos: "end-of-sequence", special: "special token"}[kind];
      found = cell(specialLabel(token), kind, `${what} ${token}: a control symbol, not text`);
    } else {
      found = {text: visibleToken(token), parts: markedParts(token), style: TEXT, detail: ""};
    }
    singleCells.set(key, found);
  }
  return found;
}

// token_view.token_cells: one cell per position; byte positions are read together within a run of equal groups
function tokenCells(tokens, kinds = null, groups = null) {
  const n = tokens.length;
  kinds = kinds && kinds.length ? kinds : tokens.map(() => TEXT);
  groups = groups || tokens.map(() => null);
  const cells = new Array(n);
  let pos = 0;
  while (pos < n) {
    const data = kinds[pos] === BYTE ? parseByteDisplay(tokens[pos]) : [];
    if (data.length) {
      let end = pos + 1;
      while (end < n && kinds[end] === BYTE && groups[end] === groups[pos] && parseByteDisplay(tokens[end]).length) {
        end++;
      }
      byteRun(tokens.slice(pos, end).map(parseByteDisplay)).forEach((c, i) => { cells[pos + i] = c; });
      pos = end;
      continue;
    }
    cells[pos] = singleCell(tokens[pos], kinds[pos]);
    pos += 1;
  }
  return cells;
}

// token_view.draft_labels: each draft token as one plain line (for hover labels; escape it for Plotly)
function draftLabels(tokens, kinds) {
  const suffix = {pad: " (pad)", eos: " (end-of-sequence)", special: " (special token)"};
  return tokenCells(tokens, kinds).map((c) => c.text + (suffix[c.style] || ""));
}
