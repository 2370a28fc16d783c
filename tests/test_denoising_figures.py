"""The denoising figures the embedded model's settings are chosen by (`training.denoising`): punctuation runs, the
per-canvas record taken from frames, and the medians over a prompt set (synthetic frames, no model needed)."""

import pytest

from synthetic import synthetic_frame
from training.denoising import check, denoising_figures, longest_punctuation_run, observe


@pytest.mark.parametrize("text, expected", [
    ("", 0),
    ("In the beginning God created", 0),
    ("and, behold, the", 1),
    ("the,,,, how", 4),
    ("the, , , , how", 4),
    ("so, behold,,,. Now", 3),
    ("wait...", 3),
    (".,.,.,", 1),
    ("I I covered,,,,, how I,,,,,,,,,,,,,,,,, so", 17),
    ("he said: \"go\" \"now\"", 2),
])
def test_longest_punctuation_run_counts_one_character_across_spaces(text, expected):
    assert longest_punctuation_run(text) == expected


def test_observe_records_each_canvas_from_its_frames():
    n = 8
    canvases = []
    # block 0: the first forward accepts positions 0 and 1, the second 2..4, the third (last) 5; 6 and 7 never
    steps = [[0, 1], [0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 5]]
    first = [-1] * n
    for step, accepted_positions in enumerate(steps):
        accepted = [i in accepted_positions for i in range(n)]
        for i in accepted_positions:
            if first[i] < 0:
                first[i] = step
        observe(synthetic_frame(n, ["x"] * n, step=step, accepted=accepted, first_accepted_step=list(first),
                                block_done=step == len(steps) - 1), canvases)
    # block 1 stops after one forward that accepts everything
    observe(synthetic_frame(n, ["x"] * n, step=0, block=1, accepted=[True] * n, first_accepted_step=[0] * n,
                            block_done=True), canvases)
    assert canvases == [{"first_forward_accepted": 2, "forwards": 3, "acceptance_steps": 3},
                        {"first_forward_accepted": 8, "forwards": 1, "acceptance_steps": 1}]


def test_denoising_figures_take_medians_over_all_canvases():
    samples = [
        {"text": "a, b,,,, c", "forwards_per_block": [16, 16, 4], "first_forward_accepted": [2, 4, 60],
         "acceptance_steps": [10, 12, 1]},
        {"text": "a. b. c...", "forwards_per_block": [14], "first_forward_accepted": [8],
         "acceptance_steps": [9]},
    ]
    figures = denoising_figures(samples, canvas_length=64)
    assert figures["canvases"] == 4
    assert figures["median_forwards_per_canvas"] == 15
    assert figures["median_first_forward_accepted_share"] == pytest.approx(6 / 64)
    assert figures["max_first_forward_accepted_share"] == pytest.approx(60 / 64)
    assert figures["median_acceptance_steps"] == 9.5
    assert figures["longest_punctuation_run"] == 4
    assert figures["answers_with_punctuation_run_over_3"] == 1
    with pytest.raises(ValueError, match="no canvas"):
        denoising_figures([], canvas_length=64)


def test_check_compares_both_ways_and_refuses_other_signs():
    assert check(12, ">=", 12) and not check(11.5, ">=", 12)
    assert check(0.4, "<=", 0.4) and not check(0.41, "<=", 0.4)
    with pytest.raises(ValueError, match="comparison"):
        check(1, "<", 2)
