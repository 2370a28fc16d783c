"""Canvas infill: a template's text (`[___]` one blank, `[___ 12]` twelve) stays put while the blanks fill."""

from __future__ import annotations

import dataclasses
import itertools
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from transformers import LogitsProcessor

from .engine import DiffusionEngine, encode_text
from .frames import Frame
from .generator import RunRandomState, denoise
from .settings import MAX_PROMPT_CHARS, DiffusionSettings, parse_seed
from .tokens import eos_id_list

BLANK = re.compile(r"\[___(?:[ \t]+(\d+))?\]")


@dataclass(frozen=True)
class InfillLayout:
    """A template in one canvas: `canvas_ids` (-1 for blanks), `fixed` per position, the `blanks`' positions."""

    canvas_ids: list[int]
    fixed: list[bool]
    blanks: list[int]
    template_positions: int


def parse_template(template: str, canvas_length: int | None) -> list[str | int]:
    """The template as fixed text (str) and blank lengths (int); `ValueError` for a bad template."""
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
    """The template laid out in one canvas; `ValueError` as `parse_template` or for more than one canvas."""
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
        raise ValueError(f"the template takes {len(ids)} canvas positions ({len(ids) - blanks} fixed tokens and "
                         f"{blanks} blank) but one canvas holds {canvas_length}: infill works inside one canvas, so "
                         f"shorten the text or the blanks")
    used = len(ids)
    ids += [pad_id] * (canvas_length - used)
    fixed = [i >= 0 for i in ids]
    return InfillLayout(canvas_ids=ids, fixed=fixed, blanks=[i for i, f in enumerate(fixed) if not f],
                        template_positions=used)


class FixedPositionsLogitsProcessor(LogitsProcessor):
    """Pins each position of `canvas_ids` to its id, in place; -1: a blank, where `banned` ids are banned."""

    def __init__(self, canvas_ids: list[int], banned: list[int], device: torch.device):
        self.fixed = torch.tensor([i >= 0 for i in canvas_ids], dtype=torch.bool, device=device)
        self.fixed_ids = torch.tensor([max(i, 0) for i in canvas_ids], dtype=torch.long, device=device)
        self.banned = torch.tensor(sorted(set(banned)), dtype=torch.long, device=device)
        self._fixed_at = self.fixed.nonzero().squeeze(1)
        self._blank_at = (~self.fixed).nonzero().squeeze(1)

    def __call__(self, input_ids, scores):
        scores[:, self._fixed_at] = float("-inf")
        scores[:, self._fixed_at, self.fixed_ids[self._fixed_at]] = 0.0
        if self.banned.numel():
            scores[:, self._blank_at.unsqueeze(1), self.banned.unsqueeze(0)] = float("-inf")
        return scores


def infill_frames(engine: DiffusionEngine, template: str, settings: DiffusionSettings | None = None, *,
                  prompt: str | None = None, seed: int | None = None,
                  stop_event: threading.Event | None = None) -> tuple[InfillLayout, Iterator[Frame]]:
    """(layout, frames) denoising `template`'s blanks after raw `prompt` (default `<bos>`); `ValueError`."""
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
    frames = denoise(engine.model, input_ids, settings, token_text=engine.token_text, stop_event=stop_event,
                     random_state=random_state,
                     logits_processors=[FixedPositionsLogitsProcessor(layout.canvas_ids, banned, engine.device)],
                     initial_canvas=noised_canvas(engine, layout.canvas_ids, random_state))
    return layout, count_blanks_only(frames, layout)


def noised_canvas(engine: DiffusionEngine, known: list[int], random_state: RunRandomState) -> torch.LongTensor:
    """A first canvas `[1, canvas_length]`: the `known` ids, uniformly random tokens where they are -1."""
    with random_state.active():
        noise = torch.randint(0, engine.model.config.text_config.vocab_size, (1, engine.canvas_length),
                              device=engine.device)
    known = torch.tensor([known], dtype=torch.long, device=engine.device)
    return torch.where(known >= 0, known, noise)


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
    """(the filled template, the text of each run of adjacent blanks) of a final canvas's ids."""
    ids = list(canvas_ids[:layout.template_positions])
    runs = itertools.groupby(range(len(ids)), key=lambda position: layout.fixed[position])
    fills = [tokenizer.decode([ids[i] for i in run], skip_special_tokens=True) for fixed, run in runs if not fixed]
    return tokenizer.decode(ids, skip_special_tokens=True), fills
