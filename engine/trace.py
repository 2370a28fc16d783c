"""Traces: a generation as one JSON document (`docs/trace.md`), and the offline HTML page that replays one."""

import base64
import hashlib
import itertools
import json
import math
import re
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

from .engine import DiffusionEngine
from .frames import TEXT, TOKEN_KINDS, Frame, FrameBuilder
from .loading import model_name
from .settings import MAX_PROMPT_CHARS, MAX_SEED, SETTING_NAMES, DiffusionSettings, shown
from .wording import plural

TRACE_FORMAT = "diffgemma-trace"
TRACE_VERSION = 2
READABLE_VERSIONS = (1, 2)  # version 1 has no alternatives
TRACE_SETTINGS = ("max_new_tokens", "max_denoising_steps", "entropy_bound", "t_min", "t_max", "stability_threshold",
                  "confidence_threshold", "adaptive_stopping")  # in every trace; a later setting may be absent
MAX_ALTERNATIVES = 20
MAX_TRACE_BYTES = 20 * 1024 * 1024
MAX_CANVAS_LENGTH = 4096
MAX_FRAMES = 20_000
MAX_TOKEN_ID = 2**31 - 1
MAX_TOKEN_CHARS = 1000
MAX_ENTROPY_NATS = 100.0
MAX_LABEL_CHARS = 300
STOP_REASONS = ("eos", "max_new_tokens", "cancelled")
NO_FRAMES = "the run produced no frames (it ended before its first decoder forward)"
ASSETS_DIR = Path(__file__).resolve().parent.parent / "assets"
PLAYER_DIR = ASSETS_DIR / "replay"
PLAYER_SCRIPTS = ("format.js", "tokens.js", "views.js", "player.js")  # in load order
STYLESHEETS = (PLAYER_DIR / "theme.css", ASSETS_DIR / "style.css", PLAYER_DIR / "page.css")
PLOTLY_GZ = ASSETS_DIR / "vendor" / "plotly-cartesian-4.1.1.min.js.gz"
PAGE = PLAYER_DIR / "page.html"  # a `str.format` template: csp, css, data, plotly, player
PLAY_INTERVAL_MS = 350
PRESENT_INTERVAL_MS = 1400
_SURROGATE = re.compile("[\ud800-\udfff]")


class TraceError(ValueError):
    """A trace that cannot be loaded; the message names the first problem."""


@dataclass(frozen=True)
class ModelInfo:
    """Where a run came from; `name` is never a path."""

    name: str
    revision: str
    device: str
    dtype: str
    canvas_length: int

    @classmethod
    def of(cls, engine: DiffusionEngine) -> "ModelInfo":
        revision = getattr(engine.model.config, "_commit_hash", None) or ""
        dtype = str(getattr(engine.model, "dtype", "")).removeprefix("torch.")
        return cls(name=model_name(engine.source), revision=str(revision), device=str(engine.device), dtype=dtype,
                   canvas_length=int(engine.canvas_length))


@dataclass(frozen=True)
class Trace:
    """One generation; `tokens`: id -> string (escape it), `kinds`: id -> kind where not text."""

    model: ModelInfo
    settings: DiffusionSettings
    seed: int
    prompt: str
    raw: bool
    prompt_ids: tuple[int, ...]
    tokens: dict[int, str]
    text: str
    frames: tuple[Frame, ...]
    kinds: dict[int, str] | None = None

    @classmethod
    def from_frames(cls, frames, *, model: ModelInfo, settings: DiffusionSettings, prompt: str, raw: bool,
                    prompt_ids, token_text, text: str) -> "Trace":
        """The trace of a run's frames, a trailing cancelled repeat folded in; `TraceError`."""
        kept: list[Frame] = []
        for frame in frames:
            if kept and frame.stop_reason == "cancelled" and frame.forward_index == kept[-1].forward_index:
                kept[-1] = frame
            else:
                kept.append(frame)
        if not kept:
            raise TraceError(NO_FRAMES)
        ids, kinds = frame_tokens(kept, getattr(token_text, "kind", None))
        ids |= {int(i) for i in prompt_ids} | set(kept[-1].committed_ids)
        unchecked = cls(model=model, settings=settings, seed=kept[-1].seed, prompt=prompt, raw=raw,
                        prompt_ids=tuple(prompt_ids), tokens={i: token_text(i) for i in ids}, text=text,
                        frames=tuple(kept), kinds=kinds)
        return parse_trace(unchecked.to_dict())

    def to_dict(self) -> dict:
        document = {
            "format": TRACE_FORMAT, "version": TRACE_VERSION, "model": dict(self.model.__dict__),
            "settings": asdict(self.settings), "seed": int(self.seed),
            "prompt": {"text": self.prompt, "raw": bool(self.raw), "ids": [int(i) for i in self.prompt_ids]},
            "text": self.text, "tokens": {str(i): s for i, s in sorted(self.tokens.items())},
            "frames": [_compact(frame) for frame in self.frames],
        }
        if self.kinds is not None:
            document["kinds"] = {str(i): k for i, k in sorted(self.kinds.items())}
        return document

    def to_json(self) -> str:
        """Compact JSON text (non-ASCII kept, no NaN)."""
        return json.dumps(self.to_dict(), ensure_ascii=False, separators=(",", ":"), allow_nan=False)

    def save(self, path) -> Path:
        path = Path(path)
        path.write_text(self.to_json(), encoding="utf-8")
        return path

    @property
    def blocks(self) -> list[tuple[Frame, ...]]:
        return [tuple(group) for _, group in itertools.groupby(self.frames, key=lambda frame: frame.block_index)]


def frame_tokens(frames, kind=None) -> tuple[set[int], dict[int, str] | None]:
    """The ids `frames` show (canvases, alternatives) and their kinds where not text (None: not classified);
    `kind(id)` classifies the alternatives, which frames carry no kinds for."""
    ids = {i for f in frames for row in (f.input_ids, f.draft_ids, *f.top_ids) for i in row}
    kinds = None
    if all(len(f.input_kinds) == len(f.input_ids) and len(f.draft_kinds) == len(f.draft_ids) for f in frames):
        kinds = {i: k for f in frames for i, k in zip(f.input_ids + f.draft_ids, f.input_kinds + f.draft_kinds)
                 if k != TEXT}
        if kind is not None:
            alternatives = {i for f in frames for row in f.top_ids for i in row}.difference(kinds)
            kinds.update((i, k) for i in alternatives if (k := kind(i)) != TEXT)
    return ids, kinds


def record_trace(engine: DiffusionEngine, prompt: str, settings: DiffusionSettings | None = None, *,
                 raw: bool = False, seed: int | None = None, stop_event: threading.Event | None = None,
                 thinking: bool = False) -> Trace:
    """The `Trace` of `prompt` run to the end (arguments as `DiffusionEngine.frames`)."""
    settings = settings or engine.recommended
    frames = engine.frames(prompt, settings, raw=raw, seed=seed, stop_event=stop_event, thinking=thinking)
    return trace_of_run(engine, frames, prompt=prompt, settings=settings, raw=raw, thinking=thinking)


def trace_of_run(engine: DiffusionEngine, frames, *, prompt: str, settings: DiffusionSettings, raw: bool,
                 thinking: bool = False) -> Trace:
    """The `Trace` of `frames` that `engine` produced for `prompt`; `TraceError` for none."""
    frames = list(frames)
    if not frames:
        raise TraceError(NO_FRAMES)
    prompt_ids = engine.encode_prompt(prompt, raw=raw, thinking=thinking)[0].tolist()
    return Trace.from_frames(frames, model=ModelInfo.of(engine), settings=settings, prompt=prompt, raw=raw,
                             prompt_ids=prompt_ids, token_text=engine.token_text,
                             text=engine.summarize(frames[-1], len(frames)).text)


def _compact(frame: Frame) -> dict:
    compact = {
        "block": frame.block_index, "step": frame.step_index, "input_ids": list(frame.input_ids),
        "draft_ids": list(frame.draft_ids), "accepted": [1 if a else 0 for a in frame.accepted],
        "confidence": [_rounded(c) for c in frame.confidence], "entropy": [_rounded(e) for e in frame.entropy],
        "elapsed_s": _rounded(frame.elapsed_s, 6), "block_done": bool(frame.block_done),
        "stopped_early": bool(frame.block_stopped_early), "done": bool(frame.done),
    }
    if frame.top_ids:
        compact["alternatives"] = [{"ids": list(ids), "probs": [_rounded(p) for p in probs]}
                                   for ids, probs in zip(frame.top_ids, frame.top_probs)]
    if frame.block_done:
        compact["committed_ids"] = list(frame.committed_ids)
        compact["committed_tokens"] = int(frame.committed_tokens)
    if frame.stop_reason:
        compact["stop_reason"] = frame.stop_reason
    return compact


def _rounded(value: float, digits: int = 3) -> float:
    value = round(float(value), digits)
    return value if math.isfinite(value) else 0.0


def load_trace(source) -> Trace:
    """The checked trace in JSON text, bytes or a `Path`; `TraceError` (one line)."""
    if isinstance(source, str):
        source = source.encode("utf-8", errors="surrogatepass")
    if not isinstance(source, (bytes, bytearray, Path)):
        raise TraceError(f"a trace is JSON text, got {type(source).__name__}")
    try:
        size = source.stat().st_size if isinstance(source, Path) else len(source)
        if size > MAX_TRACE_BYTES:
            raise TraceError(f"the trace is {size / 2**20:.1f} MB; the limit is {MAX_TRACE_BYTES // 2**20} MB")
        source = source.read_bytes() if isinstance(source, Path) else source
    except OSError as error:
        raise TraceError(f"cannot read the trace file: {error.strerror or error}") from None
    try:
        text = source.decode("utf-8")
    except UnicodeDecodeError as error:
        raise TraceError(f"the trace is not UTF-8 text (byte {error.start})") from None
    if not text.strip():
        raise TraceError("the trace file is empty (0 bytes)" if not text else "the trace file holds only whitespace")
    try:
        document = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as error:
        raise TraceError(f"the trace is not valid JSON: {error.msg} at line {error.lineno}, column {error.colno}") \
            from None
    except (ValueError, RecursionError) as error:
        raise TraceError(f"the trace is not valid JSON: {str(error)[:120]}") from None
    return parse_trace(document)


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number a trace may hold")


def parse_trace(document) -> Trace:
    """The `Trace` of a decoded document (a setting beyond `TRACE_SETTINGS` that it lacks: the default);
    `TraceError` names the problem and place."""
    doc = _object(document, "the trace")
    if doc.get("format") != TRACE_FORMAT:
        raise TraceError(f"not a DiffGemma trace: 'format' must be {TRACE_FORMAT!r}, got {shown(doc.get('format'))}")
    version = doc.get("version")
    if version not in READABLE_VERSIONS or isinstance(version, bool):
        raise TraceError(f"trace version {shown(version)} is not supported: this playground reads versions "
                         f"{' and '.join(map(str, READABLE_VERSIONS))} (a newer trace needs a newer playground)")
    model_doc = _object(doc.get("model"), "model")
    canvas = _int(model_doc.get("canvas_length"), "model.canvas_length", 1, MAX_CANVAS_LENGTH)
    labels = {key: _string(model_doc.get(key, "" if key == "revision" else None), f"model.{key}", MAX_LABEL_CHARS)
              for key in ("name", "revision", "device", "dtype")}
    settings_doc = _object(doc.get("settings"), "settings")
    missing = [key for key in TRACE_SETTINGS if key not in settings_doc]
    if missing:
        raise TraceError(f"settings: missing {', '.join(missing)}")
    try:
        settings = DiffusionSettings(**{key: settings_doc[key] for key in SETTING_NAMES if key in settings_doc})
    except (TypeError, ValueError) as error:
        raise TraceError(f"settings: {error}") from None
    seed = _int(doc.get("seed"), "seed", 0, MAX_SEED)
    prompt_doc = _object(doc.get("prompt"), "prompt")
    prompt = _string(prompt_doc.get("text"), "prompt.text", MAX_PROMPT_CHARS)
    raw = _bool(prompt_doc.get("raw"), "prompt.raw")
    text = _string(doc.get("text"), "text", MAX_TRACE_BYTES)
    tokens = _id_table(doc.get("tokens"), "tokens", f"in [0, {MAX_TOKEN_ID}] as decimal strings",
                       lambda i: i <= MAX_TOKEN_ID, lambda text, where: _string(text, where, MAX_TOKEN_CHARS))
    prompt_ids = _ids(prompt_doc.get("ids"), "prompt.ids", None, tokens)
    kinds = _id_table(doc["kinds"], "kinds", "listed in tokens", tokens.__contains__,
                      lambda kind, where: _choice(kind, where, TOKEN_KINDS)) if "kinds" in doc else None
    frame_docs = doc.get("frames")
    if not isinstance(frame_docs, list) or not frame_docs:
        raise TraceError("frames must be a non-empty list")
    if len(frame_docs) > MAX_FRAMES:
        raise TraceError(f"the trace has {len(frame_docs):,} frames; the limit is {MAX_FRAMES:,}")
    frames = _frames(frame_docs, canvas, settings, seed, len(prompt_ids), tokens, kinds)
    return Trace(model=ModelInfo(**labels, canvas_length=canvas), settings=settings, seed=seed, prompt=prompt,
                 raw=raw, prompt_ids=tuple(prompt_ids), tokens=tokens, text=text, frames=tuple(frames), kinds=kinds)


def _frames(frame_docs: list, canvas: int, settings: DiffusionSettings, seed: int, prompt_tokens: int,
            tokens: dict[int, str], kinds: dict[int, str] | None) -> list[Frame]:
    n_steps = settings.max_denoising_steps
    builder = FrameBuilder(canvas, n_steps, prompt_tokens=prompt_tokens, seed=seed, token_text=tokens.__getitem__,
                           token_kind=None if kinds is None else lambda i: kinds.get(i, TEXT))
    frames: list[Frame] = []
    committed: list[int] = []
    committed_tokens, previous_elapsed, expected = 0, 0.0, (0, 0)
    for index, item in enumerate(frame_docs):
        where = f"frame {index}"
        f = _object(item, where)
        block = _int(f.get("block"), f"{where}: block", 0, MAX_FRAMES)
        step = _int(f.get("step"), f"{where}: step", 0, n_steps - 1)
        if (block, step) != expected:
            raise TraceError(f"{where}: block {block} step {step} does not follow the previous frame "
                             f"(expected block {expected[0]} step {expected[1]})")
        input_ids, draft_ids = (_ids(f.get(key), f"{where}: {key}", canvas, tokens)
                                for key in ("input_ids", "draft_ids"))
        accepted = [bool(v) for v in _entries(f.get("accepted"), f"{where}: accepted", canvas,
                                              lambda v: type(v) in (int, bool) and v in (0, 1), "entries are 0 or 1")]
        confidence = _floats(f.get("confidence"), f"{where}: confidence", canvas, 1.0)
        entropy = _floats(f.get("entropy"), f"{where}: entropy", canvas, MAX_ENTROPY_NATS)
        elapsed = f.get("elapsed_s")
        if type(elapsed) not in (int, float) or not previous_elapsed <= elapsed <= 1e7:  # NaN fails too
            raise TraceError(f"{where}: elapsed_s must be seconds counting up from the previous frame's "
                             f"({previous_elapsed}), got {shown(elapsed)}")
        previous_elapsed = elapsed = float(elapsed)
        block_done, stopped_early, done = (_bool(f.get(key), f"{where}: {key}")
                                           for key in ("block_done", "stopped_early", "done"))
        stop_reason = _choice(f.get("stop_reason", ""), f"{where}: stop_reason", STOP_REASONS, "")
        for broken, problem in (
                (done != bool(stop_reason), "a frame is done exactly when it has a stop_reason"),
                (done and index != len(frame_docs) - 1, "marked done but more frames follow"),
                (stopped_early and not block_done, "stopped_early needs block_done"),
                (step == n_steps - 1 and not block_done and stop_reason != "cancelled",
                 f"the block's last step ({n_steps}) must finish the block")):
            if broken:
                raise TraceError(f"{where}: {problem}")
        if block_done:
            committed = _ids(f.get("committed_ids"), f"{where}: committed_ids", None, tokens)
            if len(committed) > (block + 1) * canvas:
                raise TraceError(f"{where}: committed_ids has {len(committed):,} ids, more than "
                                 f"{plural(block + 1, 'canvas', 'canvases')} of {canvas}")
            committed_tokens = _int(f.get("committed_tokens"), f"{where}: committed_tokens", 0, len(committed))
        top_ids, top_probs = _alternatives(f.get("alternatives"), where, canvas, tokens)
        expected = (block + 1, 0) if block_done else (block, step + 1)
        frames.append(builder.add(
            block_index=block, step_index=step, temperature=settings.temperature_at(n_steps - step),
            input_ids=input_ids, draft_ids=draft_ids, accepted=accepted, confidence=confidence, entropy=entropy,
            top_ids=top_ids, top_probs=top_probs, block_done=block_done, block_stopped_early=stopped_early, done=done,
            committed_ids=list(committed), committed_tokens=committed_tokens, elapsed_s=elapsed,
            stop_reason=stop_reason))
    return frames


def _object(value, where: str) -> dict:
    if not isinstance(value, dict):
        raise TraceError(f"{where} must be a JSON object, got {type(value).__name__}")
    return value


def _int(value, where: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise TraceError(f"{where} must be an integer in [{low}, {high}], got {shown(value)}")
    return value


def _bool(value, where: str) -> bool:
    if not isinstance(value, bool):
        raise TraceError(f"{where} must be true or false, got {shown(value)}")
    return value


def _string(value, where: str, limit: int) -> str:
    if not isinstance(value, str):
        raise TraceError(f"{where} must be a string, got {type(value).__name__}")
    if len(value) > limit:
        raise TraceError(f"{where} is {len(value):,} characters; the limit is {limit:,}")
    return value


def _list(value, where: str, length: int | None) -> list:
    if not isinstance(value, list):
        raise TraceError(f"{where} must be a list, got {type(value).__name__}")
    if length is not None and len(value) != length:
        raise TraceError(f"{where} has {len(value):,} entries; the canvas has {length:,} positions")
    return value


def _entries(value, where: str, length: int | None, valid, rule: str) -> list:
    values = _list(value, where, length)
    for item in values:
        if not valid(item):
            raise TraceError(f"{where}: {rule}, got {shown(item)}")
    return list(values)


def _ids(value, where: str, length: int | None, tokens: dict[int, str]) -> list[int]:
    ids = _entries(value, where, length, lambda v: type(v) is int and 0 <= v <= MAX_TOKEN_ID,
                   f"token ids are integers in [0, {MAX_TOKEN_ID}]")
    for token_id in ids:
        if token_id not in tokens:
            raise TraceError(f"{where}: token id {token_id} has no string in tokens")
    return ids


def _floats(value, where: str, length: int, high: float) -> list[float]:
    return [float(v) for v in _entries(value, where, length, lambda v: type(v) in (int, float) and 0 <= v <= high,
                                       f"entries are numbers in [0, {high:g}]")]


def _alternatives(value, where: str, canvas: int, tokens: dict[int, str]) -> tuple[list[list[int]], list[list[float]]]:
    if value is None:
        return [], []
    top_ids, top_probs = [], []
    for position, item in enumerate(_list(value, f"{where}: alternatives", canvas)):
        place = f"{where}: alternatives[{position}]"
        row = _object(item, place)
        ids = _ids(row.get("ids"), f"{place}.ids", None, tokens)
        if not 1 <= len(ids) <= MAX_ALTERNATIVES:
            raise TraceError(f"{place}: 1 to {MAX_ALTERNATIVES} alternatives, got {len(ids)}")
        probs = _floats(row.get("probs"), f"{place}.probs", len(ids), 1.0)
        if any(a < b for a, b in zip(probs, probs[1:])):
            raise TraceError(f"{place}: probs must not increase")
        top_ids.append(ids)
        top_probs.append(probs)
    return top_ids, top_probs


def _id_table(value, name: str, key_rule: str, valid_key, check) -> dict[int, str]:
    table: dict[int, str] = {}
    for key, item in _object(value, name).items():
        if not (key.isascii() and key.isdigit() and len(key) <= 10) or not valid_key(int(key)):
            raise TraceError(f"{name}: keys are token ids {key_rule}, got {shown(key)}")
        table[int(key)] = check(item, f"{name}[{key}]")
    return table


def _choice(value, where: str, choices: tuple[str, ...], *also: str) -> str:
    """`value` if in `choices` or `also` (unnamed in the message); else `TraceError`."""
    if value not in (*choices, *also):
        raise TraceError(f"{where} must be one of {', '.join(choices)}, got {shown(value)}")
    return value


def replay_data(trace: Trace) -> dict:
    """What the player needs of `trace`, JSON-ready (schema: `docs/trace.md`)."""
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
    """`data` as JSON inert inside a `<script>` (`<` and lone surrogates escaped)."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    text = _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
    return text.replace("<", "\\u003c")


def player_script(names: tuple[str, ...] = PLAYER_SCRIPTS) -> str:
    """The player's JavaScript files in one function scope; `FileNotFoundError`."""
    body = "\n".join((PLAYER_DIR / name).read_text(encoding="utf-8") for name in names)
    return f'\n(() => {{\n"use strict";\n{body}\n}})();\n'


def replay_html(trace: Trace) -> str:
    """The offline replay page of `trace`; `FileNotFoundError` for a missing asset."""
    player = player_script()
    digest = base64.b64encode(hashlib.sha256(player.encode("utf-8")).digest()).decode("ascii")
    # Only the player runs (by its hash); it evaluates the unpacked Plotly bundle
    csp = (f"default-src 'none'; script-src 'sha256-{digest}' 'unsafe-eval'; style-src 'unsafe-inline'; "
           "img-src data:; font-src data:")
    css = "\n".join(path.read_text(encoding="utf-8") for path in STYLESHEETS)
    plotly = base64.b64encode(PLOTLY_GZ.read_bytes()).decode("ascii")
    return PAGE.read_text(encoding="utf-8").format(csp=csp, css=css, data=script_json(replay_data(trace)),
                                                   plotly=plotly, player=player)


def write_replay(trace: Trace, path) -> Path:
    """Write `replay_html(trace)` to `path`, returned; `OSError`."""
    path = Path(path)
    path.write_text(replay_html(trace), encoding="utf-8")
    return path
