"""Step-by-step generation: `generate()`'s block loop as `denoise()`, one `Frame` per decoder forward, timed by the
engine clock."""

import dataclasses
import functools
import math
import threading
import time
from collections.abc import Callable, Iterator
from typing import NamedTuple

import torch
from transformers import LogitsProcessorList

from .frames import Frame, FrameBuilder, eos_id_list
from .sampling import compile_for_run, frame_statistics, sampler_state, with_recording
from .randomness import RunRandomState
from .settings import DiffusionSettings

class EngineClock:
    """Sums the seconds inside `with clock:` sections (CUDA synchronized at each end)."""

    def __init__(self, device: torch.device):
        self.seconds = 0.0
        self._sync = device.type == "cuda"

    def __enter__(self):
        self._start = time.perf_counter()
        return self

    def now(self) -> float:
        """Seconds so far, the open section included (call inside `with clock:`)."""
        return self.seconds + (time.perf_counter() - self._start)

    def __exit__(self, *exc):
        if self._sync:
            torch.cuda.synchronize()
        self.seconds += time.perf_counter() - self._start


@torch.no_grad()
def denoise(model, input_ids: torch.LongTensor, settings: DiffusionSettings, *,
            token_text: Callable[[int], str] = str, seed: int | None = None,
            stop_event: threading.Event | None = None, random_state: RunRandomState | None = None,
            past_key_values=None, logits_processors: list | None = None,
            initial_canvas: torch.LongTensor | None = None,
            fork: Callable[[int, int, torch.LongTensor], torch.LongTensor] | None = None) -> Iterator[Frame]:
    """Block diffusion on `input_ids` `[1, n]`, one `Frame` per decoder forward; `stop_event` ends with a "cancelled"
    frame; `past_key_values`, `logits_processors`, `initial_canvas` as in `generate()`; `fork(block, forward, canvas)`,
    called with the run's random streams active before each forward, returns its input canvas (`infill.Fork`);
    `ValueError` for batch != 1.

    The body is transformers' `DiffusionGemmaGenerationMixin._generate` for one sequence, phase for phase (its
    comments' numbers below), built from the same private helpers so that the tokens are `generate()`'s; what it adds
    is the frame each forward yields, the engine clock around the model's work, the run's random streams and Stop.
    """
    if input_ids.ndim != 2 or input_ids.shape[0] != 1:
        raise ValueError(f"input_ids must have shape [1, prompt_length], got {tuple(input_ids.shape)}")
    rng = random_state or RunRandomState(seed)
    device = input_ids.device
    clock = EngineClock(device)
    canvas_length = model.config.canvas_length

    with clock:
        # 0.a-0.b. generate()'s config and lengths: max_new_tokens rounds up to whole canvases
        generation_config, model_kwargs = model._prepare_generation_config(None, **settings.generate_kwargs())
        prompt_length = cur_len = input_ids.shape[1]
        if past_key_values is not None:
            cur_len += past_key_values.get_seq_length()
        max_length, max_new_tokens = model._prepare_generated_length(generation_config, cur_len)
        max_new_canvases = math.ceil(max_new_tokens / canvas_length)
        # 0.d. The KV cache (a chat turn brings its own, holding the conversation so far), positions and masks
        if past_key_values is None:
            past_key_values = model._prepare_cache_for_generation(generation_config, 1, max_length)
        eos_tensor = (torch.tensor(generation_config.eos_token_id, device=device)
                      if generation_config.eos_token_id is not None else None)
        pad_id = generation_config.pad_token_id
        encoder_position_ids = torch.arange(cur_len - prompt_length, cur_len, dtype=torch.int32, device=device)[None]
        decoder_position_ids = torch.arange(cur_len, cur_len + canvas_length, dtype=torch.int32, device=device)[None]
        attention_mask = torch.ones((1, cur_len), dtype=torch.bool, device=device)
        decoder_attention_mask = torch.nn.functional.pad(attention_mask, (0, canvas_length), value=True)
        # 0.e. The sampler records the statistics it computes anyway, so a frame costs no second pass over the logits
        sampler = with_recording(model._prepare_sampler(generation_config))
        logits_processor = model._prepare_logits_processor(
            generation_config, LogitsProcessorList(logits_processors) if logits_processors else None)
        stopping_criteria = model._prepare_ar_stopping_criteria(generation_config, None)
        diffusion_stopping_criteria = model._prepare_diffusion_stopping_criteria(generation_config)
        finished_sequences = torch.zeros(1, dtype=torch.bool, device=device)
        # 0.f. A static cache compiles the forwards and this run's sampler; compiled code cannot take the run's
        # generators, so its draws go through torch's global ones, loaded with the run's streams under a lock
        if past_key_values.is_compileable and not generation_config.disable_compile:
            encoder_after_prefill, decoder_forward, sampler, diffusion_stopping_criteria = compile_for_run(
                model, sampler, diffusion_stopping_criteria)
            draws = functools.partial(rng.on_global_generators, device)
        else:
            encoder_after_prefill, decoder_forward = model.model.encoder, rng.without_draws(model.forward)
            draws = rng.active
        n_steps = generation_config.max_denoising_steps
    builder = FrameBuilder(canvas_length, n_steps, prompt_tokens=prompt_length, seed=rng.seed, token_text=token_text)
    committed_ids: list[int] = []
    committed_tokens = 0

    frame = None
    for block in range(max_new_canvases):  # 1. one canvas (block) after another
        with clock:
            # 1.a. Encode the prompt (first block) or the last committed canvas into the KV cache
            unprocessed_input_ids, encoder_mask_mapping = model._prepare_encoder_inputs(
                input_ids=input_ids, attention_mask=attention_mask, encoder_position_ids=encoder_position_ids,
                past_key_values=past_key_values, is_prefill=block == 0, canvas_length=canvas_length,
                batch_size=1, **model_kwargs)
            encoder_forward = model.model.encoder if block == 0 else encoder_after_prefill
            past_key_values = encoder_forward(
                input_ids=unprocessed_input_ids, attention_mask=encoder_mask_mapping,
                past_key_values=past_key_values, position_ids=encoder_position_ids, **model_kwargs).past_key_values
            # 1.b. A fresh canvas of uniformly random tokens (or the caller's first canvas): the run's first draw
            if block == 0 and initial_canvas is not None:
                model_kwargs["decoder_input_ids"] = initial_canvas
            with draws():
                current_canvas, self_conditioning_logits, mask_mapping, finished_denoising = (
                    model._prepare_denoiser_inputs(
                        decoder_attention_mask=decoder_attention_mask, past_key_values=past_key_values,
                        sampler=sampler, diffusion_stopping_criteria=diffusion_stopping_criteria, batch_size=1,
                        device=device, model_kwargs=model_kwargs))
            argmax_canvas = current_canvas

        # 1.c. Denoising steps count down (N..1), as in generate(): the temperature falls with cur_step
        for step_index, cur_step in enumerate(reversed(range(1, n_steps + 1))):
            if stop_event is not None and stop_event.is_set():
                if frame is not None:
                    yield dataclasses.replace(frame, done=True, stop_reason="cancelled")
                return
            with clock:
                with draws():  # 1.c.i-v. decoder forward, token draw, accept or renoise, stopping, self-conditioning
                    if fork is not None:
                        current_canvas = fork(block, builder.forwards, current_canvas)
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
                stopped_early = cur_step > 1 and bool(finished_denoising.all())  # adaptive stopping, before step 1
                block_done = stopped_early or cur_step == 1
                done, stop_reason = False, ""
                if block_done:
                    # 1.d-1.e. Commit the argmax canvas (the likeliest tokens, not the renoised ones); EOS ends the
                    # sequence and pads what follows it
                    input_ids = torch.cat([input_ids, argmax_canvas], dim=-1)
                    input_ids, finished_sequences = model._finalize_canvas(
                        input_ids=input_ids, finished_sequences=finished_sequences,
                        generation_config=generation_config, stopping_criteria=stopping_criteria,
                        canvas_length=canvas_length, eos_tensor=eos_tensor)
                    committed_ids = strip_after_eos(input_ids[0, prompt_length:].tolist(),
                                                    generation_config.eos_token_id)
                    committed_tokens = sum(t != pad_id for t in committed_ids)
                    if bool(finished_sequences.all()):
                        done, stop_reason = True, "eos"
                    elif block == max_new_canvases - 1:
                        done, stop_reason = True, "max_new_tokens"
                # The frame: what the sampler recorded of this forward, brought to the host in one transfer
                confidence, entropy, top_ids, top_probs = frame_statistics(sampler, self_conditioning_logits,
                                                                           argmax_canvas)
                shown = host_lists(input_canvas[0], argmax_canvas[0], sampler_state(sampler).accepted_token_mask[0],
                                   None, confidence, entropy, top_ids=top_ids, top_probs=top_probs)
                frame = builder.add(
                    block_index=block, step_index=step_index, temperature=settings.temperature_at(cur_step),
                    input_ids=shown.input_ids, draft_ids=shown.draft_ids, accepted=shown.accepted,
                    confidence=shown.confidence, entropy=shown.entropy, top_ids=shown.top_ids,
                    top_probs=shown.top_probs, block_done=block_done,
                    block_stopped_early=stopped_early, done=done, committed_ids=committed_ids,
                    committed_tokens=committed_tokens, elapsed_s=clock.now(), stop_reason=stop_reason)
            yield frame
            if block_done:
                break
        if done:
            return
        with clock:  # 1.f. Positions and masks of the next block
            cur_len, decoder_attention_mask, attention_mask, encoder_position_ids, decoder_position_ids = (
                model._prepare_kwargs_for_next_canvas(
                    attention_mask=attention_mask, decoder_attention_mask=decoder_attention_mask,
                    decoder_position_ids=decoder_position_ids, canvas_length=canvas_length, cur_len=cur_len))


class HostLists(NamedTuple):
    """A frame's rows as lists, by name ([] for a row not given)."""

    input_ids: list
    draft_ids: list
    accepted: list
    first_accepted: list
    confidence: list
    entropy: list
    remelted: list
    top_ids: list
    top_probs: list


def host_lists(input_ids, draft_ids, accepted, first_accepted, confidence, entropy, remelted=None, top_ids=None,
               top_probs=None) -> HostLists:
    """A frame's tensors `[canvas_length]` (alternatives `[canvas_length, k]`) as lists (from an accelerator in one
    transfer); None: []."""
    rows = (input_ids, draft_ids, accepted, first_accepted, confidence, entropy, remelted, top_ids, top_probs)
    kinds = (int, int, bool, int, float, float, bool, int, float)
    if any(row is not None and row.device.type != "cpu" for row in rows):
        return HostLists(*one_transfer(rows, kinds))
    dtypes = {int: torch.int64, bool: torch.bool}
    return HostLists(*([] if row is None else row.to(dtypes.get(kind, row.dtype)).tolist()
                       for row, kind in zip(rows, kinds)))


def one_transfer(rows: tuple, kinds: tuple) -> tuple[list, ...]:
    """`rows` (tensors or None) as lists of `kinds` (int, bool, float), copied to the host as one float64 tensor."""
    host = torch.cat([row.to(torch.float64).reshape(-1) for row in rows if row is not None]).cpu()  # exact for ids
    lists, offset = [], 0
    for row, kind in zip(rows, kinds):
        if row is None:
            lists.append([])
            continue
        values = host[offset:offset + row.numel()].view(row.shape)
        lists.append(values.to(torch.int64).tolist() if kind is int else (values != 0).tolist() if kind is bool
                     else values.tolist())
        offset += row.numel()
    return tuple(lists)


def strip_after_eos(token_ids: list[int], eos_token_id: int | list[int] | None) -> list[int]:
    """Generated ids up to and including the first EOS."""
    eos_ids = set(eos_id_list(eos_token_id))
    return next((token_ids[:i + 1] for i, token in enumerate(token_ids) if token in eos_ids), token_ids)
