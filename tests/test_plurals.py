"""Counts in the views and messages read as English at one and above ("1 position", "2 positions"): one plural
rule (`engine.wording.plural`, also `diffgemma_ui.text.plural`), no model needed."""

from __future__ import annotations

import pytest

from diffgemma_ui.chat_tab import history_html
from diffgemma_ui.compare_tab import side_html
from diffgemma_ui.deployment import GpuBudget
from diffgemma_ui.keep import check_traceable
from diffgemma_ui.race_tab import explanation, lengths_text, speedup_text
from diffgemma_ui.step_through import step_note
from diffgemma_ui.text import plural
from engine import DiffusionSettings
from engine.race import RaceResult
from synthetic import synthetic_frame
from test_race import side_result


def test_plural_is_singular_at_one_only():
    assert [plural(n, "position") for n in (0, 1, 2, 1024)] == ["0 positions", "1 position", "2 positions",
                                                               "1,024 positions"]
    assert plural(1, "canvas", "canvases") == "1 canvas" and plural(3, "canvas", "canvases") == "3 canvases"


def test_views_say_one_in_the_singular():
    one_accepted = synthetic_frame(4, ["a", "b", "c", "d"], accepted=[True, False, False, False])
    assert "; 1 position accepted, 1 for the first time" in step_note(one_accepted)
    assert "1 oldest turn cut" in history_html([], cut_turns=1)
    assert "max 1 step \u00b7" in side_html("A", DiffusionSettings(max_denoising_steps=1), None, "waiting")
    race = dict(order=("diffusion", "autoregressive"), seed=7, budget=1, canvas_length=64, device="cpu",
                memory_bandwidth_gb_s=None)
    cut = RaceResult(side_result("diffusion"), side_result("autoregressive", tokens=1, stop_reason="cancelled"),
                     cancelled=True, **race)
    assert "cut short after 1 token," in speedup_text(cut) and "ran after 1 token." in explanation(cut)
    assert "same budget of 1 token;" in cut.length_rule
    uneven = RaceResult(side_result("diffusion", tokens=1), side_result("autoregressive", tokens=5), **race)
    assert "diffusion wrote 1 token (" in lengths_text(uneven) and "autoregressive 5 tokens (" in lengths_text(uneven)
    assert side_result("diffusion", tokens=1, forwards=1).line().startswith("diffusion: 1 token, 1 forward,")


def test_refusals_say_one_in_the_singular():
    with pytest.raises(ValueError, match=r"every decoder forward: 1 canvas of 4096 positions x 512 steps"):
        check_traceable(DiffusionSettings(max_new_tokens=64, max_denoising_steps=512), 4096)
    budget = GpuBudget(seconds_per_forward=50, setup_s=10, quota_s=100)
    with pytest.raises(ValueError, match=r"\(2 decoder forwards of .*at most about 1 forward in all"):
        budget.check(DiffusionSettings(max_new_tokens=64, max_denoising_steps=2), 64)
