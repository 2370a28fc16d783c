"""diffusers' `DiffusionGemmaPipeline` as a second sampler (optional dependency): its schedulers' canvases,
recorded in the step callback, turned into the engine's frames.
"""

from __future__ import annotations

import importlib.util
import threading
import time

import torch

from .frames import Frame
from .generator import strip_after_eos
from .sampling import canvas_statistics
from .settings import DiffusionSettings, check_prompt
from .tokens import eos_id_list

SCHEDULERS = ("BlockRefinementScheduler", "DiscreteDDIMScheduler", "EntropyBoundScheduler")


def diffusers_available() -> bool:
    """Whether diffusers is installed, looked up without importing it (that takes seconds)."""
    return importlib.util.find_spec("diffusers") is not None


def _diffusers():
    """The `diffusers` module, imported on first use: an optional dependency (raises `ImportError` without it)."""
    import diffusers  # noqa: PLC0415

    return diffusers


def make_scheduler(name: str, settings: DiffusionSettings):
    """A diffusers scheduler by class name, configured from `settings` (`EntropyBoundScheduler`: bound and
    temperatures). `ValueError` for an unknown name, `ImportError` without diffusers.
    """
    if name not in SCHEDULERS:
        raise ValueError(f"scheduler must be one of {', '.join(SCHEDULERS)}, got {name!r}")
    cls = getattr(_diffusers(), name)
    if name == "EntropyBoundScheduler":
        return cls(entropy_bound=settings.entropy_bound, t_max=settings.t_max, t_min=settings.t_min,
                   num_inference_steps=settings.max_denoising_steps)
    return cls(num_inference_steps=settings.max_denoising_steps)


class PipelineStopped(Exception):
    """Raised inside the pipeline's step callback to end a `PipelineRun` that was stopped."""


class PipelineRun:
    """One `DiffusionGemmaPipeline` call on the engine's model in a background thread, read as frames while it runs:
    `start()`, `frames()`, `stop()` (the last frame then "cancelled"), `wait(timeout)`, `error` (what it raised).
    `ValueError` for a bad prompt or scheduler, `ImportError` without diffusers (at construction).
    """

    def __init__(self, engine, prompt: str, settings: DiffusionSettings, scheduler: str, seed: int):
        self.engine, self.settings, self.seed = engine, settings, int(seed)
        self.prompt = check_prompt(prompt)
        self.pipe = _diffusers().DiffusionGemmaPipeline(model=engine.model,
                                                        scheduler=make_scheduler(scheduler, settings),
                                           processor=engine.tokenizer)
        self.pipe.set_progress_bar_config(disable=True)
        self.prompt_tokens = int(engine.encode_prompt(self.prompt).shape[1])
        self.error: BaseException | None = None
        self._steps: list[dict] = []
        self._sequence: list[int] | None = None
        self._stop = threading.Event()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="diffusers-pipeline", daemon=True)
        self._start = 0.0

    def start(self) -> "PipelineRun":
        """Start the call in its thread; returns self."""
        self._start = time.perf_counter()
        self._thread.start()
        return self

    def stop(self) -> None:
        """Ask the call to end after its current denoising step."""
        self._stop.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait up to `timeout` seconds (None: no limit) for the call to end; returns whether it has."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def finished(self) -> bool:
        """Whether the call has ended (completed, stopped or failed)."""
        return self._thread.ident is not None and not self._thread.is_alive()

    @property
    def forwards(self) -> int:
        """Decoder forwards recorded so far."""
        return len(self._steps)

    def latest(self) -> Frame | None:
        """The newest frame (None before the first forward): `frames()[-1]` without building the others."""
        frames = self.frames(only_last=True)
        return frames[-1] if frames else None

    def frames(self, *, only_last: bool = False) -> list[Frame]:
        """The frames so far, one per decoder forward (exact once the call completed); `only_last`: the newest only."""
        finished = self.finished  # read first: a step recorded after it is then only missed, never mislabelled
        steps = list(self._steps)
        sequence = self._sequence
        if sequence is None:  # running or stopped: each block's newest callback canvas
            sequence = []
            for index, step in enumerate(steps):
                if index == len(steps) - 1 or steps[index + 1]["step"] == 0:
                    sequence += step["canvas"]
        config = self.engine.model.generation_config
        return _frames_of(steps, sequence, self.engine.canvas_length, self.settings, config.eos_token_id,
                          config.pad_token_id, self.prompt_tokens, self.seed, self.engine.token_text,
                          complete=finished, stopped=self._stopped, only_last=only_last)

    def _record(self, pipeline, global_step, step_index, tensors):
        if self._stop.is_set():
            raise PipelineStopped
        canvas, logits = tensors["canvas"][0], tensors["logits"][0]
        draft = logits.argmax(dim=-1)
        confidence, entropy = canvas_statistics(logits, draft)
        previous = self._steps[-1]["canvas"] if step_index > 0 and self._steps else None
        self._steps.append({"step": step_index, "input": previous, "draft": draft.tolist(),
                            "accepted": (canvas == draft).tolist(), "confidence": confidence.tolist(),
                            "entropy": entropy.tolist(), "canvas": canvas.tolist(),
                            "elapsed": time.perf_counter() - self._start})
        return {}

    def _run(self) -> None:
        settings = self.settings
        try:
            generator = torch.Generator(device=self.engine.device).manual_seed(self.seed)
            output = self.pipe(prompt=self.prompt, gen_length=settings.max_new_tokens,
                               num_inference_steps=settings.max_denoising_steps,
                               eos_token_id=turn_end_id(self.engine.tokenizer,
                                                        self.engine.model.generation_config.eos_token_id),
                               stability_threshold=settings.stability_threshold,
                               confidence_threshold=settings.confidence_threshold if settings.adaptive_stopping
                               else None,
                               generator=generator, output_type="seq", callback_on_step_end=self._record,
                               callback_on_step_end_tensor_inputs=["canvas", "logits"])
            self._sequence = output.sequences[0].tolist()
        except PipelineStopped:
            self._stopped = True
        except BaseException as error:  # noqa: BLE001 - handed to the reader
            self.error = error


def turn_end_id(tokenizer, eos) -> int | None:
    """The EOS id that ends a chat answer: the first of `eos` the chat template writes after an assistant message,
    else the first of `eos` (the pipeline stops at one id only).
    """
    ids = eos_id_list(eos)
    if not ids:
        return None
    try:
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}], tokenize=True)
        rendered = rendered["input_ids"] if isinstance(rendered, dict) or hasattr(rendered, "keys") else rendered
    except Exception:  # noqa: BLE001 - no or an unusual template: the generation config's first id
        return ids[0]
    return next((i for i in ids if i in set(rendered)), ids[0])


def pipeline_frames(engine, prompt: str, settings: DiffusionSettings, scheduler: str, seed: int) -> list[Frame]:
    """Run the pipeline with `scheduler` to the end and return its frames; raises as `PipelineRun` or what the call
    raised.
    """
    run = PipelineRun(engine, prompt, settings, scheduler, seed).start()
    run.wait()
    if run.error is not None:
        raise run.error
    return run.frames()


def _frames_of(steps: list[dict], sequence: list[int], canvas_length: int, settings: DiffusionSettings, eos,
               pad_id, prompt_tokens: int, seed: int, token_text, *, complete: bool = True,
               stopped: bool = False, only_last: bool = False) -> list[Frame]:
    """Frames from the recorded steps (step 0 opens a block) and the output sequence. `complete`: the call ended;
    `stopped`: by `stop()` (last block not committed); `only_last`: build only the newest frame.
    """
    kind = getattr(token_text, "kind", None)
    frames: list[Frame] = []
    block = -1
    forwards_per_block: list[int] = []
    committed: list[int] = []
    first_accepted: list[int] = []
    n_steps = settings.max_denoising_steps
    for index, step in enumerate(steps):
        if step["step"] == 0:
            block += 1
            first_accepted = [-1] * canvas_length
        newest = index == len(steps) - 1
        last_of_block = (newest and complete and not stopped) or (not newest and steps[index + 1]["step"] == 0)
        first_accepted = [step["step"] if a and f < 0 else f for a, f in zip(step["accepted"], first_accepted)]
        input_ids = step["input"] if step["input"] is not None else step["canvas"]
        done = newest and complete
        if last_of_block:
            forwards_per_block = forwards_per_block + [step["step"] + 1]
            committed = strip_after_eos(sequence[: (block + 1) * canvas_length], eos)
        if only_last and not newest:
            continue
        committed_tokens = sum(1 for t in committed if t != pad_id)
        elapsed = step["elapsed"]
        stop_reason = ""
        if done:
            eos_ids = set(eos if isinstance(eos, list) else [eos])
            stop_reason = ("cancelled" if stopped else "eos" if committed and committed[-1] in eos_ids
                           else "max_new_tokens")
        frames.append(Frame(
            block_index=block, step_index=step["step"], forward_index=index, canvas_length=canvas_length,
            max_denoising_steps=n_steps, temperature=0.0, input_ids=list(input_ids), draft_ids=step["draft"],
            accepted=step["accepted"], confidence=step["confidence"], entropy=step["entropy"],
            first_accepted_step=list(first_accepted), input_tokens=[token_text(i) for i in input_ids],
            draft_tokens=[token_text(i) for i in step["draft"]], block_done=last_of_block,
            block_stopped_early=last_of_block and step["step"] + 1 < n_steps, done=done,
            committed_ids=list(committed), committed_tokens=committed_tokens,
            forwards_per_block=list(forwards_per_block), elapsed_s=elapsed,
            time_to_first_frame_s=steps[0]["elapsed"],
            tokens_per_second=committed_tokens / elapsed if elapsed > 0 else 0.0,
            tokens_per_forward=committed_tokens / (index + 1), prompt_tokens=prompt_tokens, seed=seed,
            stop_reason=stop_reason,
            input_kinds=[kind(i) for i in input_ids] if kind else [],
            draft_kinds=[kind(i) for i in step["draft"]] if kind else [],
        ))
    return frames
