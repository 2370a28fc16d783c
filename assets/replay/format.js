// The replay player, part 1: text made visible, numbers formatted as Python formats them, the viridis colours.
// Ports of diffgemma_ui/text.py (visible_token, escape_plotly, plain_text), meter.format_number and canvas_view.viridis:
// the page must read exactly as the playground does.

const VISIBLE = {" ": "\u00b7", "\n": "\u21b5", "\r": "\\r", "\t": "\u21e5"};
const SHOW_AS_CODE = new Set([0x200B, 0x200C, 0x200D, 0x200E, 0x200F, 0x2028, 0x2029, 0x2060, 0xFEFF,
  0x202A, 0x202B, 0x202C, 0x202D, 0x202E, 0x2066, 0x2067, 0x2068, 0x2069]);
const HIDDEN_CATEGORY = /^[\p{Cc}\p{Cs}\p{Co}\p{Cn}]$/u;
const EMPTY_TOKEN = "\u2205";
const DASH = "\u2013";

function visibleChar(char) {
  const code = char.codePointAt(0);
  if (char in VISIBLE) return VISIBLE[char];
  if (code < 0x20 || code === 0x7F) return `\\x${code.toString(16).padStart(2, "0")}`;
  if (SHOW_AS_CODE.has(code) || (code > 0x7F && HIDDEN_CATEGORY.test(char))) {
    return `\u27e8U+${code.toString(16).toUpperCase().padStart(4, "0")}\u27e9`;
  }
  return char;
}

// A token with whitespace and invisible characters shown as marks (still text: put it in the page as text)
function visibleToken(token) {
  token = String(token);
  if (token === "") return EMPTY_TOKEN;
  let out = "";
  for (const char of token) out += visibleChar(char);
  return out;
}

// A token as parts [text, isMark]: whitespace marks apart, so the chip shows them in a dim <span class="dg-sp">
function markedParts(token) {
  token = String(token);
  if (token === "") return [[EMPTY_TOKEN, false]];
  const parts = [];
  for (const char of token) {
    const mark = char in VISIBLE;
    const shown = visibleChar(char);
    const last = parts[parts.length - 1];
    if (!mark && last && !last[1]) last[0] += shown;
    else parts.push([shown, mark]);
  }
  return parts;
}

// Text for a Plotly label: Plotly reads a subset of HTML in labels and decodes entities
function escapePlotly(text) {
  return String(text).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;")
    .replace(/"/g, "&quot;").replace(/'/g, "&#x27;");
}

// Lone surrogates replaced by "?" (as Python's encode(errors="replace")), everything else verbatim
function plainText(text) {
  return String(text).replace(/[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/g, "?");
}

// Python's f"{x:.{digits}f}": toFixed rounds exact ties away from zero, Python to the even digit
function fixed(x, digits) {
  const text = x.toFixed(digits);
  if (!Number.isFinite(x) || Math.abs(x) >= 1e21) return text;
  const exact = Math.abs(x).toFixed(100);
  const cut = exact.indexOf(".") + 1 + digits;
  if (!/^50*$/.test(exact.slice(cut))) return text;
  const down = exact.slice(0, digits ? cut : cut - 1);
  if (Number(down.slice(-1)) % 2 === 1) return text;
  return (x < 0 ? "-" : "") + down;
}

function grouped(text) {  // thousands separated, as Python's "," format option
  const [whole, part] = text.split(".");
  const sign = whole.startsWith("-") ? "-" : "";
  const digits = whole.slice(sign.length).replace(/\B(?=(\d{3})+(?!\d))/g, ",");
  return sign + digits + (part === undefined ? "" : "." + part);
}

// Python's f"{x:.{precision}g}"
function general(x, precision = 6) {
  if (!Number.isFinite(x)) return x > 0 ? "inf" : x < 0 ? "-inf" : "nan";
  if (x === 0) return Object.is(x, -0) ? "-0" : "0";
  const exponent = Number(x.toExponential(precision - 1).split("e")[1]);
  const strip = (s) => (s.includes(".") ? s.replace(/0+$/, "").replace(/\.$/, "") : s);
  if (exponent < -4 || exponent >= precision) {
    const [mantissa, power] = x.toExponential(precision - 1).split("e");
    const p = Number(power);
    return `${strip(mantissa)}e${p < 0 ? "-" : "+"}${String(Math.abs(p)).padStart(2, "0")}`;
  }
  return strip(fixed(x, precision - 1 - exponent));
}

// meter.format_number: digits decimals, thousands separated, unit; a dash for a missing or non-finite value
function formatNumber(value, digits = 1, unit = "") {
  if (typeof value !== "number" || !Number.isFinite(value)) return DASH;
  return grouped(fixed(value, digits)) + unit;
}

// meter.format_count: an integral value as an integer, else with digits decimals
function formatCount(value, digits = 1) {
  if (typeof value !== "number" || !Number.isFinite(value)) return DASH;
  return Number.isInteger(value) ? grouped(String(value)) : formatNumber(value, digits);
}

function roundHalfEven(x) {
  const floor = Math.floor(x);
  const diff = x - floor;
  if (diff > 0.5) return floor + 1;
  if (diff < 0.5) return floor;
  return floor % 2 === 0 ? floor : floor + 1;
}

const VIRIDIS = ["#440154", "#482475", "#414487", "#355f8d", "#2a788e", "#21918c",
  "#22a884", "#44bf70", "#7ad151", "#bddf26", "#fde725"];
const rgb = (hex) => [1, 3, 5].map((i) => parseInt(hex.slice(i, i + 2), 16));

// colors.viridis: the colour of value in [0, 1] as #rrggbb (clamped; non-numbers read as 0)
function viridis(value) {
  value = typeof value === "number" && Number.isFinite(value) ? Math.min(1, Math.max(0, value)) : 0;
  const scaled = value * (VIRIDIS.length - 1);
  const low = Math.min(Math.trunc(scaled), VIRIDIS.length - 2);
  const frac = scaled - low;
  const a = rgb(VIRIDIS[low]), b = rgb(VIRIDIS[low + 1]);
  return "#" + a.map((x, i) => roundHalfEven(x + (b[i] - x) * frac).toString(16).padStart(2, "0")).join("");
}

// canvas_view._confidence_style's text: black or white, whichever reads better on the background (WCAG luminance)
function textOn(background) {
  const channel = (c) => { c /= 255; return c <= 0.04045 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4; };
  const [r, g, b] = rgb(background).map(channel);
  const luminance = 0.2126 * r + 0.7152 * g + 0.0722 * b;
  return (luminance + 0.05) / 0.05 >= 1.05 / (luminance + 0.05) ? "#111111" : "#ffffff";
}
