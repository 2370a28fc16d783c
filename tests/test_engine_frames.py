"""The step-by-step generator: frame contents, parity with model.generate(), cancellation, run isolation."""

import threading

import pytest
import torch

from engine.parity import PARITY_CASES, run_case
from engine.settings import DiffusionSettings

pytestmark = pytest.mark.slow


def short(engine, **changes) -> DiffusionSettings:
    return engine.recommended.replace(**{"max_new_tokens": 128, "max_denoising_steps": 8, **changes})


@pytest.mark.parametrize("case", PARITY_CASES, ids=lambda c: c.label())
def test_final_tokens_equal_generate(engine, case):
    expected, got, _ = run_case(engine, case)
    assert got == expected


def test_frames_describe_every_forward(engine):
    settings = short(engine, adaptive_stopping=False, max_denoising_steps=5)
    frames = list(engine.frames("In the beginning", settings, raw=True, seed=11))
    canvas = engine.canvas_length
    assert [f.forward_index for f in frames] == list(range(len(frames)))
    for f in frames:
        for field in (f.input_ids, f.draft_ids, f.accepted, f.confidence, f.entropy, f.first_accepted_step,
                      f.input_tokens, f.draft_tokens):
            assert len(field) == canvas
        assert all(0.0 <= c <= 1.0 + 1e-6 for c in f.confidence)
        assert all(e >= -1e-5 for e in f.entropy)
        assert all(-1 <= s <= f.step_index for s in f.first_accepted_step)
        # a position accepted in this forward has a first-accepted step
        assert all(s >= 0 for s, a in zip(f.first_accepted_step, f.accepted) if a)
        assert settings.t_min < f.temperature <= settings.t_max + 1e-9
    # adaptive stopping off: every canvas takes all its steps, and there are two canvases of 64 in 128 tokens
    last = frames[-1]
    if last.stop_reason == "max_new_tokens":
        assert last.forwards_per_block == [5] * (128 // canvas) and len(frames) == 5 * (128 // canvas)
    assert last.done and sum(f.done for f in frames) == 1
    assert last.tokens_per_forward == pytest.approx(last.committed_tokens / len(frames))
    assert last.tokens_per_second == pytest.approx(last.committed_tokens / last.elapsed_s)
    assert 0 < last.time_to_first_frame_s <= last.elapsed_s
    # the first forward reads the random initial canvas; later ones keep accepted tokens from the previous step
    for prev, cur in zip(frames, frames[1:]):
        if cur.block_index == prev.block_index:
            kept = [i for i, a in enumerate(prev.accepted) if a]
            assert all(cur.input_ids[i] != -1 for i in kept)
    # display strings decode the ids
    assert frames[0].draft_tokens[0] == engine.tokenizer.decode([frames[0].draft_ids[0]])


def test_first_accepted_step_is_monotone_within_a_block(engine):
    frames = list(engine.frames("The Lord is my shepherd", short(engine), seed=5))
    for prev, cur in zip(frames, frames[1:]):
        if cur.block_index == prev.block_index:
            for a, b in zip(prev.first_accepted_step, cur.first_accepted_step):
                assert a == -1 or a == b


def test_stop_event_ends_within_one_forward(engine):
    stop = threading.Event()
    settings = short(engine, adaptive_stopping=False, max_denoising_steps=50, max_new_tokens=256)
    seen = []
    for frame in engine.frames("And God said", settings, raw=True, seed=1, stop_event=stop):
        seen.append(frame)
        if len(seen) == 3:
            stop.set()
    assert len(seen) == 4  # three frames, then one final "cancelled" frame repeating the third
    assert seen[-1].done and seen[-1].stop_reason == "cancelled" and seen[-1].forward_index == 2


def test_closing_the_generator_stops_work(engine):
    frames = engine.frames("And God said", short(engine, adaptive_stopping=False), raw=True, seed=1)
    next(frames)
    frames.close()
    with pytest.raises(StopIteration):
        next(frames)


def test_same_seed_same_tokens_and_unseeded_runs_report_their_seed(engine):
    s = short(engine)
    a = engine.generate("Blessed are the", s, raw=True, seed=99)
    b = engine.generate("Blessed are the", s, raw=True, seed=99)
    assert a.token_ids == b.token_ids and a.seed == 99
    c = engine.generate("Blessed are the", s, raw=True)
    replay = engine.generate("Blessed are the", s, raw=True, seed=c.seed)
    assert replay.token_ids == c.token_ids


def test_engine_leaves_the_global_rng_alone(engine):
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    engine.generate("Blessed are the", short(engine), raw=True, seed=4)
    assert torch.equal(torch.rand(3), expected)


def test_warm_up_runs_both_prompt_paths_and_changes_no_result(engine, monkeypatch):
    before = engine.generate("Blessed are the", short(engine), raw=True, seed=5)
    calls = []
    original = engine.generate
    monkeypatch.setattr(engine, "generate", lambda *a, **k: calls.append(k) or original(*a, **k))
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    assert engine.warm_up() > 0
    assert torch.equal(torch.rand(3), expected)
    assert engine.token_text.described == len(engine.tokenizer)  # frames only look their strings up
    assert sorted(call["raw"] for call in calls) == [False, True]
    monkeypatch.undo()
    assert engine.generate("Blessed are the", short(engine), raw=True, seed=5).token_ids == before.token_ids


def test_concurrent_runs_equal_solo_runs(engine):
    s = short(engine)
    prompts = [("In the beginning", 1), ("Hear, O Israel", 2), ("Praise the Lord", 3), ("And God said", 4)]
    solo = {seed: engine.generate(p, s, raw=True, seed=seed).token_ids for p, seed in prompts}
    results = {}

    def run(prompt, seed):
        results[seed] = engine.generate(prompt, s, raw=True, seed=seed).token_ids

    threads = [threading.Thread(target=run, args=item) for item in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == solo


def test_the_global_rng_is_untouched_while_a_run_computes(engine):
    """Not only restored after the run: during each decoder forward and sampler step, torch's global RNG holds what
    it held before, so nothing else in the process can draw the run's numbers or disturb them."""
    torch.manual_seed(0)
    before = torch.get_rng_state()
    seen = []
    hooks = [engine.model.model.decoder.register_forward_pre_hook(lambda *_: seen.append(torch.get_rng_state())),
             engine.model.lm_head.register_forward_hook(lambda *_: seen.append(torch.get_rng_state()))]
    try:
        engine.generate("Blessed are the", short(engine), raw=True, seed=4)
    finally:
        for hook in hooks:
            hook.remove()
    assert seen and all(torch.equal(state, before) for state in seen)
    assert torch.equal(torch.get_rng_state(), before)


def test_two_runs_compute_their_forwards_at_the_same_time_and_each_gets_its_solo_tokens(engine):
    """Each decoder forward of either run waits inside the forward until the other run is inside one too: a lock held
    across forwards (or a run's random section) would break the barrier. Their draws interleave at every forward, yet
    each run gets the tokens of its solo run."""
    s = short(engine, adaptive_stopping=False, max_new_tokens=engine.canvas_length, max_denoising_steps=4)
    runs = [("In the beginning", 21), ("Hear, O Israel", 22)]
    solo = {seed: engine.generate(prompt, s, raw=True, seed=seed).token_ids for prompt, seed in runs}
    both_inside = threading.Barrier(2, timeout=60)
    inside, most_inside, lock = [0], [0], threading.Lock()

    def entered(*_):
        with lock:
            inside[0] += 1
        both_inside.wait()
        with lock:
            most_inside[0] = max(most_inside[0], inside[0])

    def left(*_):
        with lock:
            inside[0] -= 1

    results, errors = {}, []

    def run(prompt, seed):
        try:
            results[seed] = engine.generate(prompt, s, raw=True, seed=seed).token_ids
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)
            both_inside.abort()

    decoder = engine.model.model.decoder
    hooks = [decoder.register_forward_pre_hook(entered), decoder.register_forward_hook(left)]
    try:
        threads = [threading.Thread(target=run, args=item) for item in runs]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        for hook in hooks:
            hook.remove()
    assert not errors, errors
    assert most_inside[0] == 2
    assert results == solo


def test_raw_prompt_ids_are_exactly_the_tokenizer_ids(engine):
    ids = engine.encode_prompt("In the beginning", raw=True)
    assert ids.tolist() == engine.tokenizer("In the beginning", return_tensors="pt").input_ids.tolist()


@pytest.mark.parametrize("prompt", ["", "   \n\t", "x" * 100_001])
def test_bad_prompts_are_refused_before_work(engine, prompt):
    with pytest.raises(ValueError, match="prompt"):
        engine.frames(prompt)


def test_context_budget_counts_whole_canvases(engine):
    long_prompt = "\U0001f600" * ((engine.context_limit - 10) // 4)  # 4 tokens a character: under the character limit
    assert len(engine.encode_prompt(long_prompt, raw=True)[0]) < engine.context_limit
    with pytest.raises(ValueError, match="context"):
        engine.frames(long_prompt, raw=True)


def test_hostile_and_unusual_text_is_accepted(engine):
    result = engine.generate("<script>alert(1)</script> 🙂 مرحبا \x00\x1b[31m \ud800", short(engine), seed=3)
    assert isinstance(result.text, str) and result.frames > 0


def test_stopped_early_means_before_the_last_step(engine):
    # a cold schedule and a loose bound (v2's first recommended settings), so that canvases stop early
    settings = engine.recommended.replace(max_new_tokens=128, max_denoising_steps=6, confidence_threshold=2.0,
                                          t_max=0.05, t_min=0.02, entropy_bound=2.0)
    ends = [f for seed in range(3) for f in engine.frames("And God said,", settings, raw=True, seed=seed)
            if f.block_done]
    assert any(f.block_stopped_early for f in ends)
    for frame in ends:
        assert frame.block_stopped_early == (frame.step_index + 1 < frame.max_denoising_steps), frame.step_index


def test_alternatives_start_with_the_draft_token_and_are_sorted_probabilities(engine):
    settings = short(engine, adaptive_stopping=False, max_denoising_steps=4, t_min=0.5, t_max=1.0)
    frames = list(engine.frames("In the beginning", settings, raw=True, seed=2))
    vocab = engine.model.config.text_config.vocab_size
    for f in frames:
        assert len(f.top_ids) == len(f.top_probs) == engine.canvas_length
        for position, (ids, probs) in enumerate(zip(f.top_ids, f.top_probs)):
            assert len(ids) == len(probs) == 5 and len(set(ids)) == 5 and all(0 <= i < vocab for i in ids)
            assert ids[0] == f.draft_ids[position]
            assert probs[0] == pytest.approx(f.confidence[position], rel=1e-5)
            assert all(a >= b for a, b in zip(probs, probs[1:])) and sum(probs) <= 1 + 1e-5


def test_remelt_flags_match_a_count_made_by_hand_from_the_accepted_flags(engine):
    settings = short(engine, adaptive_stopping=False, max_denoising_steps=12, t_min=0.5, t_max=1.0,
                     entropy_bound=0.5)
    frames = list(engine.frames("The Lord is my shepherd", settings, raw=True, seed=4))
    total = 0
    for block in sorted({f.block_index for f in frames}):
        seen, in_block = [False] * engine.canvas_length, 0
        for f in (f for f in frames if f.block_index == block):
            by_hand = [seen[p] and not f.accepted[p] for p in range(engine.canvas_length)]
            in_block += sum(by_hand)
            assert f.remelted == by_hand and f.remelted_count == sum(by_hand) and f.block_remelts == in_block
            seen = [s or a for s, a in zip(seen, f.accepted)]
            total += sum(by_hand)
    assert total > 0  # warm sampling over 12 steps renoises some accepted positions: the test sees re-melts
