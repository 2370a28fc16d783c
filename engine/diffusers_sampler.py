"""diffusers' `DiffusionGemmaPipeline` as an optional second sampler: its step callback's canvases as frames."""

import importlib.util
import threading
import time

import torch

from .frames import Frame, FrameBuilder, eos_id_list
from .generator import strip_after_eos
from .sampling import canvas_statistics
from .settings import DiffusionSettings, check_prompt

SCHEDULERS = ("BlockRefinementScheduler", "DiscreteDDIMScheduler", "EntropyBoundScheduler")
SCHEDULER_SETTINGS = ("entropy_bound", "t_min", "t_max")  # set on EntropyBoundScheduler only


def diffusers_available() -> bool:
    """Whether diffusers is installed, without importing it (seconds)."""
    return importlib.util.find_spec("diffusers") is not None


def import_diffusers():
    """The diffusers package (optional; seconds to import); ImportError when missing."""
    import diffusers  # noqa: PLC0415 - optional, heavy

    return diffusers


def ignored_settings(name: str) -> tuple[str, ...]:
    """The settings scheduler `name` ignores, sampling with its own defaults instead; `ValueError`."""
    if name not in SCHEDULERS:
        raise ValueError(f"scheduler must be one of {', '.join(SCHEDULERS)}, got {name!r}")
    return () if name == "EntropyBoundScheduler" else SCHEDULER_SETTINGS


def check_pipeline_settings(settings: DiffusionSettings) -> DiffusionSettings:
    """`settings` if diffusers' pipeline reads them as the engine does; `ValueError` for a stability threshold of 0
    with adaptive stopping (the engine: stable at once; the pipeline takes 0 as 1)."""
    if settings.adaptive_stopping and settings.stability_threshold == 0:
        raise ValueError("stability_threshold 0 (stable at once) has no match in diffusers' pipeline, which reads 0 "
                         "as 1: use 1 or more, or turn adaptive stopping off")
    return settings


def make_scheduler(name: str, settings: DiffusionSettings):
    """A diffusers scheduler by class name, set from `settings`; `ValueError`, `ImportError`."""
    ignored_settings(name)
    cls = getattr(import_diffusers(), name)
    if name == "EntropyBoundScheduler":
        return cls(entropy_bound=settings.entropy_bound, t_max=settings.t_max, t_min=settings.t_min,
                   num_inference_steps=settings.max_denoising_steps)
    return cls(num_inference_steps=settings.max_denoising_steps)


class PipelineStopped(Exception):
    """Raised in the step callback to end a stopped `PipelineRun`."""


class PipelineRun:
    """One pipeline call in a thread, read as frames as it runs; `ValueError`, `ImportError`."""

    def __init__(self, engine, prompt: str, settings: DiffusionSettings, scheduler: str, seed: int):
        self.engine, self.settings, self.seed = engine, check_pipeline_settings(settings), int(seed)
        self.prompt = check_prompt(prompt)
        self.pipe = import_diffusers().DiffusionGemmaPipeline(
            model=engine.model, scheduler=make_scheduler(scheduler, settings), processor=engine.tokenizer)
        self.pipe.set_progress_bar_config(disable=True)
        self.prompt_tokens = engine.encode_prompt(self.prompt).shape[1]
        self.error: BaseException | None = None
        self._steps: list[dict] = []
        self._sequence: list[int] | None = None
        self._stop = threading.Event()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="diffusers-pipeline", daemon=True)
        self._start = 0.0

    def start(self) -> "PipelineRun":
        self._start = time.perf_counter()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Whether the call ended within `timeout` seconds (None: no limit)."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def finished(self) -> bool:
        return self._thread.ident is not None and not self._thread.is_alive()

    @property
    def forwards(self) -> int:
        return len(self._steps)

    def latest(self) -> Frame | None:
        """The newest frame (None before the first forward), the others not built."""
        frames = self.frames(only_last=True)
        return frames[-1] if frames else None

    def frames(self, *, only_last: bool = False) -> list[Frame]:
        """The frames so far (exact once the call completed); `only_last`: the newest only."""
        complete = self.finished  # read first: a later step is then missed, never mislabelled
        steps, sequence, stopped = list(self._steps), self._sequence, self._stopped
        if sequence is None:  # running or stopped: each block's newest callback canvas
            sequence = [i for n, step in enumerate(steps) if n == len(steps) - 1 or steps[n + 1]["step"] == 0
                        for i in step["canvas"]]
        config, canvas_length = self.engine.model.generation_config, self.engine.canvas_length
        n_steps = self.settings.max_denoising_steps
        builder = FrameBuilder(canvas_length, n_steps, prompt_tokens=self.prompt_tokens, seed=self.seed,
                               token_text=self.engine.token_text, remelts=False)
        frames: list[Frame] = []
        block, committed = -1, []
        for index, step in enumerate(steps):
            block += step["step"] == 0
            newest = index == len(steps) - 1
            last_of_block = (newest and complete and not stopped) or (not newest and steps[index + 1]["step"] == 0)
            if last_of_block:
                committed = strip_after_eos(sequence[: (block + 1) * canvas_length], config.eos_token_id)
            stop_reason = ""
            if newest and complete:
                ended_at_eos = committed and committed[-1] in eos_id_list(config.eos_token_id)
                stop_reason = "cancelled" if stopped else "eos" if ended_at_eos else "max_new_tokens"
            frame = builder.add(
                block_index=block, step_index=step["step"], temperature=0.0,
                input_ids=step["input"] or step["canvas"], draft_ids=step["draft"],
                accepted=step["accepted"], confidence=step["confidence"], entropy=step["entropy"],
                block_done=last_of_block, block_stopped_early=last_of_block and step["step"] + 1 < n_steps,
                done=newest and complete, committed_ids=list(committed),
                committed_tokens=sum(t != config.pad_token_id for t in committed), elapsed_s=step["elapsed"],
                stop_reason=stop_reason, build=newest or not only_last)
            if frame is not None:
                frames.append(frame)
        return frames

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
        settings, config = self.settings, self.engine.model.generation_config
        try:
            output = self.pipe(
                prompt=self.prompt, gen_length=settings.max_new_tokens,
                num_inference_steps=settings.max_denoising_steps,
                eos_token_id=turn_end_id(self.engine.tokenizer, config.eos_token_id),
                stability_threshold=settings.stability_threshold,
                confidence_threshold=settings.confidence_threshold if settings.adaptive_stopping else None,
                generator=torch.Generator(device=self.engine.device).manual_seed(self.seed), output_type="seq",
                callback_on_step_end=self._record, callback_on_step_end_tensor_inputs=["canvas", "logits"])
            self._sequence = output.sequences[0].tolist()
        except PipelineStopped:
            self._stopped = True
        except BaseException as error:  # noqa: BLE001 - handed to the reader
            self.error = error


def turn_end_id(tokenizer, eos) -> int | None:
    """The first of `eos` the chat template writes after an answer, else the first."""
    ids = eos_id_list(eos)
    if not ids:
        return None
    try:
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}], tokenize=True)
        rendered = rendered["input_ids"] if hasattr(rendered, "keys") else rendered
    except Exception:  # noqa: BLE001 - no or an unusual template
        return ids[0]
    return next((i for i in ids if i in set(rendered)), ids[0])


def pipeline_frames(engine, prompt: str, settings: DiffusionSettings, scheduler: str, seed: int) -> list[Frame]:
    """The frames of the pipeline run to the end; raises what the run raised."""
    run = PipelineRun(engine, prompt, settings, scheduler, seed).start()
    run.wait()
    if run.error is not None:
        raise run.error
    return run.frames()
