"""Branching a run from one of its forwards: the run's seed and no pins give the run back, pins hold, same seed
same branch, context and budget carried on."""

from __future__ import annotations

import pytest

from engine.infill import branch_frames, changed_share

pytestmark = pytest.mark.slow


def _run(engine, **changes):
    settings = engine.recommended.replace(**{"max_new_tokens": 2 * engine.canvas_length, "max_denoising_steps": 6,
                                             "adaptive_stopping": False, "t_min": 0.5, "t_max": 1.0,
                                             "entropy_bound": 2.0, **changes})
    prompt_ids = engine.encode_prompt("In the beginning", raw=True)[0].tolist()
    frames = list(engine.frames("In the beginning", settings, raw=True, seed=2))  # two canvases, no EOS
    return settings, prompt_ids, frames


def test_pinned_tokens_hold_and_the_same_seed_gives_the_same_branch(engine):
    settings, prompt_ids, frames = _run(engine)
    point = frames[2]
    pins = {0: point.draft_ids[5], 7: 42}
    first = list(branch_frames(engine, prompt_ids, point, pins, settings, seed=3))
    again = list(branch_frames(engine, prompt_ids, point, pins, settings, seed=3))
    assert [f.draft_ids for f in first] == [f.draft_ids for f in again]
    block = [f for f in first if f.block_index == 0]
    assert all(f.draft_ids[0] == pins[0] and f.draft_ids[7] == 42 for f in block)
    assert first[0].forward_index == point.forward_index  # the branch redoes that forward, from its canvas
    assert all(first[0].input_ids[p] == point.input_ids[p] for p in range(engine.canvas_length) if p not in pins)
    assert first[0].input_ids[7] == 42


@pytest.mark.parametrize("at", [0, 3, 8, -1])
def test_the_runs_own_seed_and_no_pins_give_the_run_back_from_any_forward(engine, at):
    settings, prompt_ids, frames = _run(engine)
    point = frames[at]
    for seed in (None, point.seed):
        branch = list(branch_frames(engine, prompt_ids, point, {}, settings, seed=seed))
        original = frames[point.forward_index:]
        assert [f.draft_ids for f in branch] == [f.draft_ids for f in original]
        assert [f.input_ids for f in branch] == [f.input_ids for f in original]
        assert branch[-1].committed_ids == frames[-1].committed_ids


def test_another_seed_keeps_the_forwards_before_the_branch_and_draws_anew_after(engine):
    settings, prompt_ids, frames = _run(engine)
    point = frames[2]
    branch = list(branch_frames(engine, prompt_ids, point, {}, settings, seed=11))
    assert branch[0].input_ids == point.input_ids and branch[0].seed == 11
    assert [f.draft_ids for f in branch] != [f.draft_ids for f in frames[2:]]


def test_a_branch_from_a_later_block_keeps_the_committed_blocks_and_the_budget(engine):
    settings, prompt_ids, frames = _run(engine)
    assert frames[-1].stop_reason == "max_new_tokens"  # these settings and seed run both canvases
    later = next(f for f in frames if f.block_index == 1)
    branch = list(branch_frames(engine, prompt_ids, later, {3: 42}, settings, seed=1))
    assert branch[-1].committed_ids[:engine.canvas_length] == later.committed_ids[:engine.canvas_length]
    assert {f.block_index for f in branch} == {1}  # one canvas of budget was left
    assert branch[-1].committed_ids[engine.canvas_length + 3] == 42


def test_bad_pins_are_refused_before_any_work(engine):
    settings, prompt_ids, frames = _run(engine, max_new_tokens=engine.canvas_length)
    with pytest.raises(ValueError, match="pinned position"):
        branch_frames(engine, prompt_ids, frames[0], {engine.canvas_length: 1}, settings)
    with pytest.raises(ValueError, match="pinned token"):
        branch_frames(engine, prompt_ids, frames[0], {0: 10**9}, settings)


def test_changed_share_without_a_model():
    assert changed_share([1, 2, 3, 4], [1, 9, 3, 9]) == 0.5
    with pytest.raises(ValueError):
        changed_share([1], [1, 2])
