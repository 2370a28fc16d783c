"""The embedded model's card figures: they recompute from the evaluation report shipped beside the weights, the card
quotes them, and the report's samples reproduce when generated again (`python -m training.evaluate`)."""

import json
import os
from pathlib import Path

import pytest

from engine import DEFAULT_MODEL
from training.evaluate import DICTIONARY, EVAL_PROMPTS, dictionary_rate, distinct_2, load_dictionary

MODEL = Path(os.environ.get("DIFFGEMMA_TEST_MODEL") or DEFAULT_MODEL)
REPORT = MODEL / "evaluation.json"


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


def test_card_quotes_the_report(report):
    card = (MODEL / "README.md").read_text()
    q, v, s = report["quality"], report["validation"], report["speed"]
    for figure in (f"{q['dictionary_word_rate']:.1%}", f"{q['distinct_2']:.3f}", f"{q['mean_forwards_per_canvas']:.1f}",
                   f"{q['tokens_per_forward']:.2f}", f"{s['diffusion_over_ar']:.2f}x",
                   f"{v['diffusion_ce_t0.5']:.3f}", f"{v['encoder_perplexity']:.1f}"):
        assert figure in card, figure


@pytest.mark.slow
def test_reported_samples_reproduce(engine, report):
    """Two reported samples generated again at the recommended settings (seed = prompt index): the same number of
    canvases and decoder forwards per canvas within noise (CPU kernels may round differently across thread counts)."""
    if Path(engine.model.name_or_path).resolve() != MODEL.resolve():
        pytest.skip("the engine fixture runs another model than the report's")
    settings = engine.recommended
    for sample in (report["quality"]["samples"][0], report["quality"]["samples"][10]):
        result = engine.generate(sample["prompt"], settings, raw=sample["raw"], seed=sample["seed"])
        expected = sample["forwards_per_block"]
        assert len(result.forwards_per_block) == pytest.approx(len(expected), abs=1)
        assert sum(result.forwards_per_block) / len(result.forwards_per_block) == pytest.approx(
            sum(expected) / len(expected), rel=0.25)
