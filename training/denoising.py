"""What a run shows someone watching it denoise, measured from its frames, and the targets the embedded model's
recommended settings are held to.

Per canvas (block): decoder forwards, positions the first forward accepted, and at how many different steps
positions were first accepted (the spread of the unmasking order). Per answer: the longest run of one punctuation
character. `denoising_figures` sums them over a prompt set; `TARGETS` and `PRESET_TARGETS` state the bounds and
`check` marks each figure met or missed.
"""

from __future__ import annotations

import re
import statistics

from engine.frames import Frame

_PUNCTUATION_RUN = re.compile(r"([^\w\s])(?:\s*\1)*")

# (figure, comparison, bound): figures of `denoising_figures` and `training.evaluate.sample_quality`
TARGETS = [
    ("median_forwards_per_canvas", ">=", 12),
    ("max_first_forward_accepted_share", "<=", 0.40),
    ("median_acceptance_steps", ">=", 6),
    ("longest_punctuation_run", "<=", 3),
    ("distinct_2", ">=", 0.6),
    ("dictionary_word_rate", ">=", 0.90),
]
# (preset, comparison, bound) on the preset's median forwards per canvas over the recommended settings'
PRESET_TARGETS = [("fast", "<=", 0.6), ("careful", ">=", 1.4)]


def longest_punctuation_run(text: str) -> int:
    """Longest run of one punctuation character in `text`, in characters, whitespace between them allowed:
    `,,,,` and `, , , ,` are both 4, `...` is 3, `.,.,` is 1; 0 when `text` has no punctuation. Counted on the
    decoded text, so a token that is `,,` adds 2."""
    return max((m.group(0).count(m.group(1)) for m in _PUNCTUATION_RUN.finditer(text)), default=0)


def observe(frame: Frame, canvases: list[dict]) -> None:
    """Add what `frame` tells about its canvas to `canvases` (one dict per block, appended at the block's first
    forward): `first_forward_accepted` (positions), then at the block's last forward `forwards` and
    `acceptance_steps` (different steps at which positions were first accepted; never-accepted positions add none)."""
    if frame.step_index == 0:
        canvases.append({"first_forward_accepted": frame.accepted_count})
    if frame.block_done:
        canvases[-1]["forwards"] = frame.step_index + 1
        canvases[-1]["acceptance_steps"] = len({step for step in frame.first_accepted_step if step >= 0})


def denoising_figures(samples: list[dict], canvas_length: int) -> dict:
    """Figures over `samples` (each with `text`, and per block `forwards_per_block`, `first_forward_accepted`,
    `acceptance_steps` as `observe` records them): medians over all canvases of all samples, the largest share of a
    canvas that a first forward accepted, the longest punctuation run of any answer and how many answers have one
    longer than 3.

    Raises:
        ValueError: no canvas in `samples`.
    """
    forwards = [n for s in samples for n in s["forwards_per_block"]]
    if not forwards:
        raise ValueError("no canvas to measure")
    first = [n / canvas_length for s in samples for n in s["first_forward_accepted"]]
    runs = [longest_punctuation_run(s["text"]) for s in samples]
    return {
        "canvases": len(forwards),
        "median_forwards_per_canvas": statistics.median(forwards),
        "median_first_forward_accepted_share": statistics.median(first),
        "max_first_forward_accepted_share": max(first),
        "median_acceptance_steps": statistics.median(n for s in samples for n in s["acceptance_steps"]),
        "longest_punctuation_run": max(runs),
        "answers_with_punctuation_run_over_3": sum(r > 3 for r in runs),
    }


def check(value: float, comparison: str, bound: float) -> bool:
    """Whether `value` meets `comparison` ("<=" or ">=") `bound`.

    Raises:
        ValueError: another comparison.
    """
    if comparison == "<=":
        return value <= bound
    if comparison == ">=":
        return value >= bound
    raise ValueError(f"comparison must be '<=' or '>=', got {comparison!r}")
