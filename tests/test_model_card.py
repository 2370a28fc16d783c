"""The embedded model's card figures: they recompute from the evaluation report shipped beside the weights, the
report was made at the settings the model ships, the card quotes it, and the report's samples reproduce when
generated again (`python -m training.evaluate`)."""

import json
import os
from pathlib import Path

import pytest
from transformers.models.diffusion_gemma.generation_diffusion_gemma import DiffusionGemmaGenerationConfig

from engine import DEFAULT_MODEL
from engine.settings import DiffusionSettings
from training.denoising import PRESET_TARGETS, TARGETS, check, denoising_figures
from training.evaluate import DICTIONARY, EVAL_PROMPTS, dictionary_rate, distinct_2, load_dictionary

MODEL = Path(os.environ.get("DIFFGEMMA_TEST_MODEL") or DEFAULT_MODEL)
REPORT = MODEL / "evaluation.json"
CANVAS_LENGTH = 64


@pytest.fixture(scope="module")
def report() -> dict:
    if not REPORT.exists():
        pytest.skip(f"{REPORT} not found: the model under test ships no evaluation report")
    return json.loads(REPORT.read_text())


def test_figures_recompute_from_the_reported_samples(report):
    if not DICTIONARY.exists():
        pytest.skip(f"{DICTIONARY} not found (apt-get install wamerican)")
    q = report["quality"]
    samples = q["samples"]
    assert [(s["prompt"], s["raw"]) for s in samples] == EVAL_PROMPTS
    texts = [s["text"] for s in samples]
    assert dictionary_rate(texts, load_dictionary()) == pytest.approx(q["dictionary_word_rate"])
    assert distinct_2(texts)[0] == pytest.approx(q["distinct_2"])
    forwards = sum(sum(s["forwards_per_block"]) for s in samples)
    canvases = sum(len(s["forwards_per_block"]) for s in samples)
    assert forwards / canvases == pytest.approx(q["mean_forwards_per_canvas"])
    assert sum(s["tokens"] for s in samples) / forwards == pytest.approx(q["tokens_per_forward"])
    assert q["eos_endings"] == sum(s["stop_reason"] == "eos" for s in samples)
    for s in samples:
        assert len(s["first_forward_accepted"]) == len(s["acceptance_steps"]) == len(s["forwards_per_block"])
        assert all(0 <= n <= CANVAS_LENGTH for n in s["first_forward_accepted"])
        assert all(1 <= steps <= forwards for steps, forwards in zip(s["acceptance_steps"], s["forwards_per_block"]))
    for figure, value in denoising_figures(samples, CANVAS_LENGTH).items():
        assert value == pytest.approx(q[figure]), figure


def test_report_was_made_at_the_shipped_settings(report):
    shipped = DiffusionSettings.from_generation_config(DiffusionGemmaGenerationConfig.from_pretrained(MODEL))
    assert DiffusionSettings(**report["settings"]) == shipped
    assert report["denoising"]["runs"]["recommended"]["settings"] == report["settings"]


def test_shipped_settings_meet_the_denoising_targets(report):
    """Every target, recomputed from the reported samples: the recommended settings' figures, and each preset's
    median forwards per canvas over the recommended settings' (recounted from its own samples)."""
    runs = report["denoising"]["runs"]
    q = runs["recommended"]["quality"]
    figures = {**denoising_figures(q["samples"], CANVAS_LENGTH), "distinct_2": distinct_2(
        [s["text"] for s in q["samples"]])[0]}
    if DICTIONARY.exists():
        figures["dictionary_word_rate"] = dictionary_rate([s["text"] for s in q["samples"]], load_dictionary())
    for figure, comparison, bound in TARGETS:
        if figure in figures:
            assert check(figures[figure], comparison, bound), (figure, figures[figure])
    base = figures["median_forwards_per_canvas"]
    for name, comparison, bound in PRESET_TARGETS:
        ratio = denoising_figures(runs[name]["quality"]["samples"], CANVAS_LENGTH)["median_forwards_per_canvas"] / base
        assert ratio == pytest.approx(runs[name]["forwards_ratio"])
        assert check(ratio, comparison, bound), (name, ratio)
    assert all(t["met"] for t in report["denoising"]["targets"])


def test_card_quotes_the_report(report):
    card = (MODEL / "README.md").read_text()
    q, v, s = report["quality"], report["validation"], report["speed"]
    runs = report["denoising"]["runs"]
    for figure in (f"{q['dictionary_word_rate']:.1%}", f"{q['distinct_2']:.3f}", f"{q['mean_forwards_per_canvas']:.1f}",
                   f"{q['median_forwards_per_canvas']:g}", f"{q['max_first_forward_accepted_share']:.1%}",
                   f"{q['median_acceptance_steps']:g}", f"{q['tokens_per_forward']:.2f}",
                   f"{s['diffusion_over_ar']:.2f}x", f"{runs['fast']['forwards_ratio']:.2f}x",
                   f"{runs['careful']['forwards_ratio']:.2f}x",
                   f"{v['diffusion_ce_t0.5']:.3f}", f"{v['encoder_perplexity']:.1f}"):
        assert figure in card, figure
    for key in ("max_denoising_steps", "entropy_bound", "t_max", "t_min", "stability_threshold",
                "confidence_threshold"):
        assert f"`{key}` {report['settings'][key]:g}" in card, key


@pytest.mark.slow
def test_reported_samples_reproduce(engine, report):
    """Two reported samples generated again at the recommended settings (seed = prompt index): the same number of
    canvases and decoder forwards per canvas within noise (CPU kernels may round differently across thread counts),
    and a first forward that accepts at most 40% of a canvas."""
    if Path(engine.model.name_or_path).resolve() != MODEL.resolve():
        pytest.skip("the engine fixture runs another model than the report's")
    settings = engine.recommended
    for sample in (report["quality"]["samples"][0], report["quality"]["samples"][10]):
        first = []
        for frame in engine.frames(sample["prompt"], settings, raw=sample["raw"], seed=sample["seed"]):
            if frame.step_index == 0:
                first.append(frame.accepted_count)
        result = frame
        expected = sample["forwards_per_block"]
        assert len(result.forwards_per_block) == pytest.approx(len(expected), abs=1)
        assert sum(result.forwards_per_block) / len(result.forwards_per_block) == pytest.approx(
            sum(expected) / len(expected), rel=0.25)
        assert max(first) <= 0.4 * CANVAS_LENGTH
