"""Canvas positions held while the rest denoises: infill (a template's blanks) and branches (pinned tokens)."""

import dataclasses
import itertools
import re
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch
from transformers import LogitsProcessor

from .engine import DiffusionEngine, encode_text
from .frames import Frame, eos_id_list
from .generator import RunRandomState, denoise
from .settings import MAX_PROMPT_CHARS, DiffusionSettings, draw_seed, parse_seed
from .wording import plural

BLANK = re.compile(r"\[___(?:[ \t]+(\d+))?\]")


@dataclass(frozen=True)
class InfillLayout:
    """A template in one canvas; `canvas_ids` has -1 at blanks."""

    canvas_ids: list[int]
    fixed: list[bool]
    blanks: list[int]
    template_positions: int


def parse_template(template: str, canvas_length: int | None) -> list[str | int]:
    """The template (`[___]` one blank, `[___ 12]` twelve) as text (str) and blank lengths (int); `ValueError`."""
    if not isinstance(template, str) or not template.strip():
        raise ValueError("infill template is empty: write text with blanks such as [___] or [___ 12]")
    if len(template) > MAX_PROMPT_CHARS:
        raise ValueError(f"infill template is {len(template):,} characters; the limit is {MAX_PROMPT_CHARS:,}")
    parts: list[str | int] = []
    position = 0
    for match in BLANK.finditer(template):
        parts.append(template[position:match.start()])
        size = int(match.group(1)) if match.group(1) else 1
        if size < 1 or (canvas_length is not None and size > canvas_length):
            limit = "at least 1" if canvas_length is None else f"1 to {canvas_length}"
            raise ValueError(f"blank {match.group(0)} asks for {size} tokens; a blank takes {limit}")
        parts.append(size)
        position = match.end()
    parts.append(template[position:])
    for text in parts:
        if isinstance(text, str) and "[___" in text:
            bad = text[text.index("[___"):][:20]
            raise ValueError(f"malformed blank {bad!r}: write [___] for one token or [___ 12] for twelve")
    if not any(isinstance(p, int) for p in parts):
        raise ValueError("infill template has no blank: mark what to fill with [___] (one token) or [___ 12]")
    return [p for p in parts if p != ""]


def layout_template(tokenizer, template: str, canvas_length: int, pad_id: int) -> InfillLayout:
    """The template laid out in one canvas; `ValueError` for a bad template or more than one canvas."""
    ids: list[int] = []
    parts = parse_template(template, canvas_length)
    for index, part in enumerate(parts):
        if isinstance(part, int):
            ids += [-1] * part
        else:
            text = part.rstrip(" ") if index + 1 < len(parts) else part
            ids += tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    if len(ids) > canvas_length:
        blanks = ids.count(-1)
        raise ValueError(f"the template takes {len(ids)} canvas positions ({plural(len(ids) - blanks, 'fixed token')} "
                         f"and {plural(blanks, 'blank position')}) but one canvas holds {canvas_length}: "
                         "shorten the text or the blanks")
    used = len(ids)
    ids += [pad_id] * (canvas_length - used)
    fixed = [i >= 0 for i in ids]
    return InfillLayout(canvas_ids=ids, fixed=fixed, blanks=[i for i, f in enumerate(fixed) if not f],
                        template_positions=used)


class FixedPositionsLogitsProcessor(LogitsProcessor):
    """Pins each position of `canvas_ids` to its id while `active`; -1: a blank, where `banned` ids are banned."""

    def __init__(self, canvas_ids: list[int], banned: list[int], device: torch.device):
        self.active = True
        ids = torch.tensor(canvas_ids, dtype=torch.long, device=device)
        self.banned = torch.tensor(sorted(set(banned)), dtype=torch.long, device=device)
        self._fixed_at = (ids >= 0).nonzero().squeeze(1)
        self._fixed_ids = ids[self._fixed_at]
        self._blank_at = (ids < 0).nonzero().squeeze(1)

    def __call__(self, input_ids, scores):
        if not self.active:
            return scores
        scores[:, self._fixed_at] = float("-inf")
        scores[:, self._fixed_at, self._fixed_ids] = 0.0
        if self.banned.numel():
            scores[:, self._blank_at.unsqueeze(1), self.banned.unsqueeze(0)] = float("-inf")
        return scores


def infill_frames(engine: DiffusionEngine, template: str, settings: DiffusionSettings | None = None, *,
                  prompt: str | None = None, seed: int | None = None,
                  stop_event: threading.Event | None = None) -> tuple[InfillLayout, Iterator[Frame]]:
    """(layout, frames) filling `template`'s blanks after raw `prompt` (default `<bos>`); `ValueError`."""
    settings = (settings or engine.recommended).replace(max_new_tokens=engine.canvas_length)
    engine.check_settings(settings)
    random_state = RunRandomState(parse_seed(seed))
    generation_config = engine.model.generation_config
    pad_id = generation_config.pad_token_id or 0
    layout = layout_template(engine.tokenizer, template, engine.canvas_length, pad_id)
    if prompt is not None:
        input_ids = encode_text(engine.tokenizer, prompt, True, engine.device)
    else:
        bos = engine.tokenizer.bos_token_id
        input_ids = torch.tensor([[bos if bos is not None else pad_id]], dtype=torch.long, device=engine.device)
    engine.check_budget(input_ids.shape[1], settings)
    banned = eos_id_list(generation_config.eos_token_id) + [pad_id]
    with random_state.active():  # the first canvas: the template, random tokens in the blanks
        noise = torch.randint(0, engine.model.config.text_config.vocab_size, (1, engine.canvas_length),
                              device=engine.device)
    known = torch.tensor([layout.canvas_ids], dtype=torch.long, device=engine.device)
    frames = denoise(engine.model, input_ids, settings, token_text=engine.token_text, stop_event=stop_event,
                     random_state=random_state,
                     logits_processors=[FixedPositionsLogitsProcessor(layout.canvas_ids, banned, engine.device)],
                     initial_canvas=torch.where(known >= 0, known, noise))
    return layout, count_blanks_only(frames, layout)


def count_blanks_only(frames: Iterator[Frame], layout: InfillLayout) -> Iterator[Frame]:
    """`frames` counting only the blanks as committed tokens; a completed fill stops as "filled"."""
    blanks = len(layout.blanks)
    for frame in frames:
        if frame.done and frame.stop_reason == "max_new_tokens":
            frame = dataclasses.replace(frame, stop_reason="filled")
        if frame.committed_tokens:
            frame = dataclasses.replace(
                frame, committed_tokens=blanks,
                tokens_per_second=blanks / frame.elapsed_s if frame.elapsed_s > 0 else 0.0,
                tokens_per_forward=blanks / (frame.forward_index + 1))
        yield frame


def filled_text(tokenizer, layout: InfillLayout, canvas_ids: list[int]) -> tuple[str, list[str]]:
    """(the filled template, the text of each run of adjacent blanks) of a final canvas."""
    ids = list(canvas_ids[:layout.template_positions])
    runs = itertools.groupby(range(len(ids)), key=lambda position: layout.fixed[position])
    fills = [tokenizer.decode([ids[i] for i in run], skip_special_tokens=True) for fixed, run in runs if not fixed]
    return tokenizer.decode(ids, skip_special_tokens=True), fills


def changed_share(original: Sequence[int], branch: Sequence[int]) -> float:
    """The share of positions whose token differs; `ValueError` for unequal or 0 lengths."""
    if len(original) != len(branch) or not original:
        raise ValueError(f"canvases to compare must have the same positive length, got {len(original)} and "
                         f"{len(branch)}")
    return sum(a != b for a, b in zip(original, branch)) / len(original)


class Fork:
    """The `denoise` fork of a branch at `frame`'s forward: `pins` set there, `random_state` (the run's) restarted from
    `seed` there when it differs from the frame's."""

    def __init__(self, frame: Frame, pins: Mapping[int, int], seed: int, device: torch.device,
                 random_state: RunRandomState):
        self.frame, self.pins, self.seed, self.random_state = frame, dict(pins), seed, random_state
        held = [pins.get(p, -1) for p in range(frame.canvas_length)]  # active to the block's end
        self.held = FixedPositionsLogitsProcessor(held, [], device) if pins else None

    def __call__(self, block: int, forward: int, canvas: torch.LongTensor) -> torch.LongTensor:
        at = self.frame.forward_index
        if forward == at:
            if canvas[0].tolist() != list(self.frame.input_ids):
                raise ValueError(f"forward {at + 1} of this run does not replay here (another device or library "
                                 f"version made it): branch it where it was made")
            if self.seed != self.frame.seed:
                self.random_state.reseed(self.seed)
            if self.pins:
                canvas = canvas.clone()
                canvas[0, list(self.pins)] = torch.tensor(list(self.pins.values()), dtype=canvas.dtype,
                                                          device=canvas.device)
        if self.held is not None:
            self.held.active = forward >= at and block == self.frame.block_index
        return canvas


def branch_frames(engine: DiffusionEngine, prompt_ids: Sequence[int], frame: Frame, pins: Mapping[int, int],
                  settings: DiffusionSettings, *, seed: int | None = None,
                  stop_event: threading.Event | None = None) -> Iterator[Frame]:
    """The run of `prompt_ids` from `frame`'s forward, `pins` (position -> id) held for its block, drawing from
    `seed` (None: the run's); `ValueError`."""
    canvas_length, vocab = engine.canvas_length, engine.model.config.text_config.vocab_size
    for position, token in pins.items():
        if not (isinstance(position, int) and 0 <= position < canvas_length):
            raise ValueError(f"a pinned position must be in [0, {canvas_length - 1}], got {position!r}")
        if not (isinstance(token, int) and 0 <= token < vocab):
            raise ValueError(f"a pinned token must be an id in [0, {vocab - 1}], got {token!r}")
    seed = frame.seed if seed is None else parse_seed(seed)
    if seed is None:
        seed = draw_seed()
    engine.check_settings(settings)
    input_ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=engine.device)
    engine.check_budget(input_ids.shape[1], settings)
    random_state = RunRandomState(frame.seed)
    fork = Fork(frame, pins, seed, engine.device, random_state)
    frames = denoise(engine.model, input_ids, settings, token_text=engine.token_text, stop_event=stop_event,
                     random_state=random_state, fork=fork,
                     logits_processors=[fork.held] if fork.held is not None else None)
    at = frame.forward_index
    return (f if f.seed == seed else dataclasses.replace(f, seed=seed) for f in frames if f.forward_index >= at)
