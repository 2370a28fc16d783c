"""Step-by-step DiffusionGemma generation: `generate()`'s block loop with the library's own pieces, one `Frame` per
decoder forward (same seed, same token ids as `generate()`; batch size 1), and the per-run random state.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from transformers import LogitsProcessorList

from .frames import Frame
from .sampling import frame_statistics, sampler_state, with_recording
from .settings import DiffusionSettings, draw_seed
from .tokens import eos_id_list

_GLOBAL_RNG_LOCK = threading.RLock()


class RunRandomState:
    """One run's torch RNG state, seeded like `torch.manual_seed(seed)` (None draws one, kept in `seed`), so
    concurrent runs neither disturb nor depend on each other.
    """

    def __init__(self, seed: int | None):
        self.seed = draw_seed() if seed is None else seed
        with _GLOBAL_RNG_LOCK:
            saved = self._capture()
            torch.manual_seed(self.seed)
            self._state = self._capture()
            self._restore(saved)

    @staticmethod
    def _capture():
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
        return torch.get_rng_state(), cuda

    @staticmethod
    def _restore(state):
        cpu, cuda = state
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)

    @contextmanager
    def active(self):
        """Run the body with this run's random state installed, under the process-wide lock."""
        with _GLOBAL_RNG_LOCK:
            saved = self._capture()
            self._restore(self._state)
            try:
                yield
            finally:
                self._state = self._capture()
                self._restore(saved)


class EngineClock:
    """Sums the seconds spent inside `with clock:` sections (CUDA synchronized at each end); time between them is not
    counted.
    """

    def __init__(self, device: torch.device):
        self.seconds = 0.0
        self._sync = device.type == "cuda"

    def __enter__(self):
        self._start = time.perf_counter()
        return self

    def now(self) -> float:
        """Seconds counted so far, the open section included (call inside `with clock:`)."""
        return self.seconds + (time.perf_counter() - self._start)

    def __exit__(self, *exc):
        if self._sync:
            torch.cuda.synchronize()
        self.seconds += time.perf_counter() - self._start
        return False


@dataclass
class _Progress:
    """Counters of one run that frames report."""

    forwards: int = 0
    forwards_per_block: list = dataclasses.field(default_factory=list)
    committed_ids: list = dataclasses.field(default_factory=list)
    committed_tokens: int = 0
    first_frame_s: float = 0.0
    block_remelts: int = 0


@torch.no_grad()
def denoise(model, input_ids: torch.LongTensor, settings: DiffusionSettings, *,
            token_text: Callable[[int], str] = str, seed: int | None = None,
            stop_event: threading.Event | None = None, random_state: RunRandomState | None = None,
            past_key_values=None, logits_processors: list | None = None,
            initial_canvas: torch.LongTensor | None = None) -> Iterator[Frame]:
    """Run block diffusion on `input_ids` `[1, prompt_length]`, yielding a `Frame` after every decoder forward.

    `token_text`: id -> display string; `seed` (None: drawn) or `random_state`; `stop_event`: ends before the next
    forward with a "cancelled" frame; `past_key_values`, `logits_processors` and `initial_canvas` act as
    `generate()`'s `past_key_values`, `logits_processor` and `decoder_input_ids`. `ValueError` for a batch other than
    1.
    """
    if input_ids.ndim != 2 or input_ids.shape[0] != 1:
        raise ValueError(f"input_ids must have shape [1, prompt_length], got {tuple(input_ids.shape)}")
    rng = random_state or RunRandomState(seed)
    device = input_ids.device
    clock = EngineClock(device)
    progress = _Progress()
    canvas_length = model.config.canvas_length

    with clock, rng.active():
        # Prepare exactly what generate() prepares, from the same library helpers
        generation_config, model_kwargs = model._prepare_generation_config(None, **settings.generate_kwargs())
        prompt_length = cur_len = input_ids.shape[1]
        if past_key_values is not None:
            cur_len += past_key_values.get_seq_length()
        max_length, max_new_tokens = model._prepare_generated_length(generation_config, cur_len)
        max_new_canvases = math.ceil(max_new_tokens / canvas_length)
        if past_key_values is None:
            past_key_values = model._prepare_cache_for_generation(generation_config, 1, max_length)
        eos_tensor = (torch.tensor(generation_config.eos_token_id, device=device)
                      if generation_config.eos_token_id is not None else None)
        pad_id = generation_config.pad_token_id
        encoder_position_ids = torch.arange(cur_len - prompt_length, cur_len, dtype=torch.int32, device=device)
        encoder_position_ids = encoder_position_ids.unsqueeze(0)
        decoder_position_ids = torch.arange(cur_len, cur_len + canvas_length, dtype=torch.int32, device=device)
        decoder_position_ids = decoder_position_ids.unsqueeze(0)
        attention_mask = torch.ones((1, cur_len), dtype=torch.bool, device=device)
        decoder_attention_mask = torch.nn.functional.pad(attention_mask, (0, canvas_length), value=True)
        sampler = with_recording(model._prepare_sampler(generation_config))
        logits_processor = model._prepare_logits_processor(
            generation_config, LogitsProcessorList(logits_processors) if logits_processors else None)
        stopping_criteria = model._prepare_ar_stopping_criteria(generation_config, None)
        diffusion_stopping_criteria = model._prepare_diffusion_stopping_criteria(generation_config)
        finished_sequences = torch.zeros(1, dtype=torch.bool, device=device)
        is_compiling = past_key_values.is_compileable and not generation_config.disable_compile
        if is_compiling:
            encoder_after_prefill, decoder_forward, sampler, diffusion_stopping_criteria = model._compile_functions(
                sampler, diffusion_stopping_criteria)
        else:
            encoder_after_prefill, decoder_forward = model.model.encoder, model.forward
        n_steps = generation_config.max_denoising_steps
    describe_many = getattr(token_text, "describe_many", None)  # `TokenText`: uncached ids decoded in one batch
    token_kind = getattr(token_text, "kind", None)  # plain callables give no kinds

    def make_frame(block, step_index, temperature, input_canvas, argmax_canvas, processed_logits, first_accepted,
                   remelted, block_done, stopped_early, done, stop_reason) -> Frame:
        confidence, entropy, top_ids, top_probs = frame_statistics(sampler, processed_logits, argmax_canvas)
        (input_list, draft_list, accepted_list, first_list, confidence_list, entropy_list, remelted_list, top_id_rows,
         top_prob_rows) = host_lists(input_canvas[0], argmax_canvas[0], _accepted_mask(sampler)[0], first_accepted,
                                     confidence, entropy, remelted, top_ids, top_probs)
        progress.block_remelts += sum(remelted_list)
        canvas_ids = input_list + draft_list
        top_flat = [i for row in top_id_rows for i in row]
        if describe_many is not None:  # canvas and alternatives in one batch
            described = describe_many(canvas_ids + top_flat)
            strings, kinds = [d[0] for d in described], [d[1] for d in described[:len(canvas_ids)]]
        else:
            strings = [token_text(i) for i in canvas_ids + top_flat]
            kinds = [token_kind(i) for i in canvas_ids] if token_kind else []
        k = len(top_id_rows[0]) if top_id_rows else 0
        top_strings = strings[len(canvas_ids):]
        elapsed = clock.now()
        if progress.forwards == 1:
            progress.first_frame_s = elapsed
        return Frame(
            block_index=block, step_index=step_index, forward_index=progress.forwards - 1,
            canvas_length=canvas_length, max_denoising_steps=n_steps, temperature=temperature,
            input_ids=input_list, draft_ids=draft_list, accepted=accepted_list, confidence=confidence_list,
            entropy=entropy_list, first_accepted_step=first_list, remelted=remelted_list,
            block_remelts=progress.block_remelts, top_ids=top_id_rows, top_probs=top_prob_rows,
            top_tokens=[top_strings[p * k:(p + 1) * k] for p in range(len(top_id_rows))],
            input_tokens=strings[:canvas_length], draft_tokens=strings[canvas_length:len(canvas_ids)],
            input_kinds=kinds[:canvas_length], draft_kinds=kinds[canvas_length:], block_done=block_done,
            block_stopped_early=stopped_early, done=done, committed_ids=progress.committed_ids,
            committed_tokens=progress.committed_tokens, forwards_per_block=list(progress.forwards_per_block),
            elapsed_s=elapsed, time_to_first_frame_s=progress.first_frame_s,
            tokens_per_second=progress.committed_tokens / elapsed if elapsed > 0 else 0.0,
            tokens_per_forward=progress.committed_tokens / progress.forwards, prompt_tokens=prompt_length,
            stop_reason=stop_reason, seed=rng.seed)

    frame = None
    is_prefill = True
    for block in range(max_new_canvases):
        with clock, rng.active():
            # Encode the prompt (first block) or the last committed canvas into the KV cache
            unprocessed_input_ids, encoder_mask_mapping = model._prepare_encoder_inputs(
                input_ids=input_ids, attention_mask=attention_mask, encoder_position_ids=encoder_position_ids,
                past_key_values=past_key_values, is_prefill=is_prefill, canvas_length=canvas_length,
                batch_size=1, **model_kwargs)
            encoder_forward = model.model.encoder if is_prefill else encoder_after_prefill
            past_key_values = encoder_forward(
                input_ids=unprocessed_input_ids, attention_mask=encoder_mask_mapping,
                past_key_values=past_key_values, position_ids=encoder_position_ids, **model_kwargs).past_key_values
            is_prefill = False
            # A fresh canvas of uniformly random tokens (or the caller's first canvas)
            if block == 0 and initial_canvas is not None:
                model_kwargs["decoder_input_ids"] = initial_canvas
            current_canvas, self_conditioning_logits, mask_mapping, finished_denoising = (
                model._prepare_denoiser_inputs(
                    decoder_attention_mask=decoder_attention_mask, past_key_values=past_key_values,
                    sampler=sampler, diffusion_stopping_criteria=diffusion_stopping_criteria, batch_size=1,
                    device=device, model_kwargs=model_kwargs))
            argmax_canvas = current_canvas
            first_accepted = torch.full((canvas_length,), -1, dtype=torch.long, device=device)
            progress.block_remelts = 0

        # Denoising steps count down (N..1), as in generate()
        for step_index, cur_step in enumerate(reversed(range(1, n_steps + 1))):
            if stop_event is not None and stop_event.is_set():
                if frame is not None:
                    yield dataclasses.replace(frame, done=True, stop_reason="cancelled")
                return
            with clock, rng.active():
                progress.forwards += 1
                input_canvas = current_canvas
                current_canvas, argmax_canvas, self_conditioning_logits, finished_denoising = (
                    model._denoising_step(
                        decoder_forward=decoder_forward, current_canvas=current_canvas,
                        argmax_canvas=argmax_canvas, input_ids=input_ids,
                        decoder_position_ids=decoder_position_ids,
                        self_conditioning_logits=self_conditioning_logits, mask_mapping=mask_mapping,
                        past_key_values=past_key_values, finished_denoising=finished_denoising,
                        cur_step=cur_step, sampler=sampler, logits_processor=logits_processor,
                        diffusion_stopping_criteria=diffusion_stopping_criteria, **model_kwargs))
                accepted_now = _accepted_mask(sampler)[0]
                remelted = (first_accepted >= 0) & ~accepted_now  # accepted earlier in this block, renoised now
                first_accepted[accepted_now & (first_accepted < 0)] = step_index
                stopped_early = cur_step > 1 and bool(finished_denoising.all())  # before its last step
                block_done = stopped_early or cur_step == 1
                done, stop_reason = False, ""
                if block_done:
                    # Commit the argmax canvas; EOS ends the sequence and pads what follows it
                    input_ids = torch.cat([input_ids, argmax_canvas], dim=-1)
                    input_ids, finished_sequences = model._finalize_canvas(
                        input_ids=input_ids, finished_sequences=finished_sequences,
                        generation_config=generation_config, stopping_criteria=stopping_criteria,
                        canvas_length=canvas_length, eos_tensor=eos_tensor)
                    progress.forwards_per_block.append(step_index + 1)
                    progress.committed_ids = strip_after_eos(
                        input_ids[0, prompt_length:].tolist(), generation_config.eos_token_id)
                    progress.committed_tokens = sum(1 for t in progress.committed_ids if t != pad_id)
                    if bool(finished_sequences.all()):
                        done, stop_reason = True, "eos"
                    elif block == max_new_canvases - 1:
                        done, stop_reason = True, "max_new_tokens"
                temperature = generation_config.t_min + (
                    (generation_config.t_max - generation_config.t_min) * cur_step / n_steps)
                frame = make_frame(block, step_index, temperature, input_canvas, argmax_canvas,
                                   self_conditioning_logits, first_accepted, remelted, block_done, stopped_early, done,
                                   stop_reason)
            yield frame
            if block_done:
                break
        if done:
            return
        with clock:
            cur_len, decoder_attention_mask, attention_mask, encoder_position_ids, decoder_position_ids = (
                model._prepare_kwargs_for_next_canvas(
                    attention_mask=attention_mask, decoder_attention_mask=decoder_attention_mask,
                    decoder_position_ids=decoder_position_ids, canvas_length=canvas_length, cur_len=cur_len))


def _accepted_mask(sampler) -> torch.BoolTensor:
    """The sampler's accepted-token mask `[1, canvas_length]` of the last step (`sampler_state`)."""
    return sampler_state(sampler).accepted_token_mask


def host_lists(input_ids, draft_ids, accepted, first_accepted, confidence, entropy, remelted=None, top_ids=None,
               top_probs=None) -> tuple[list, ...]:
    """A frame's per-position tensors as Python lists in one device transfer (float64 holds ids and float32 exactly):
    (input ids, draft ids, accepted, first-accepted steps, confidence, entropy, re-melted, alternative id rows,
    alternative probability rows); missing optional ones come back empty.
    """
    length = input_ids.shape[0]
    rows = [input_ids, draft_ids, accepted, first_accepted, confidence, entropy]
    if remelted is not None:
        rows.append(remelted)
    k = 0 if top_ids is None else top_ids.shape[-1]
    values = torch.cat([t.to(torch.float64).reshape(-1) for t in rows + ([top_ids, top_probs] if k else [])])
    values = values.tolist()
    per_position = [values[i * length:(i + 1) * length] for i in range(len(rows))]
    ids_in, ids_draft, flags, first, conf, ent = per_position[:6]
    melted = [v != 0.0 for v in per_position[6]] if remelted is not None else []
    offset = len(rows) * length
    top_id_rows = [[int(v) for v in values[offset + p * k:offset + (p + 1) * k]] for p in range(length)] if k else []
    offset += length * k
    top_prob_rows = [values[offset + p * k:offset + (p + 1) * k] for p in range(length)] if k else []
    return ([int(v) for v in ids_in], [int(v) for v in ids_draft], [v != 0.0 for v in flags],
            [int(v) for v in first], conf, ent, melted, top_id_rows, top_prob_rows)


def strip_after_eos(token_ids: list[int], eos_token_id: int | list[int] | None) -> list[int]:
    """Generated ids up to and including the first EOS (the pads `_finalize_canvas` put after it dropped)."""
    eos_ids = set(eos_id_list(eos_token_id))
    for i, token in enumerate(token_ids):
        if token in eos_ids:
            return token_ids[: i + 1]
    return token_ids
