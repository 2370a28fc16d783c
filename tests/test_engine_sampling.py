"""The recording sampler accepts exactly what transformers' sampler accepts, and its statistics are the logits'."""

from __future__ import annotations

import pytest
import torch
from transformers.models.diffusion_gemma.generation_diffusion_gemma import (EntropyBoundSampler,
                                                                            EntropyBoundSamplerConfig)

from engine.generator import host_lists, one_transfer
from engine.sampling import (RecordingEntropyBoundSampler, canvas_statistics, draft_first, entropy_and_normalizer,
                             frame_statistics, top_alternatives, top_k, with_recording)


def _samplers(entropy_bound: float, vocab: int = 500, canvas: int = 32):
    library = EntropyBoundSampler(EntropyBoundSamplerConfig(entropy_bound=entropy_bound), canvas, vocab, 8)
    return library, RecordingEntropyBoundSampler.of(library)


@pytest.mark.parametrize("entropy_bound, scale", [(0.1, 1.0), (2.0, 3.0), (1000.0, 0.5), (1e-6, 8.0)])
def test_recording_sampler_accepts_what_the_library_sampler_accepts(entropy_bound, scale):
    generator = torch.Generator().manual_seed(7)
    logits = torch.randn(1, 32, 500, generator=generator) * scale
    logits[0, :5, 3] += 40  # a few confident positions, so that bounds accept different counts
    current = torch.randint(0, 500, (1, 32), generator=generator)
    denoiser = torch.randint(0, 500, (1, 32), generator=generator)
    library, recording = _samplers(entropy_bound)
    expected = library.accept_canvas(current, denoiser, logits, 3)
    got = recording.accept_canvas(current, denoiser, logits, 3)
    assert torch.equal(got, expected)
    assert torch.equal(recording.accepted_token_mask, library.accepted_token_mask)

    confidence, entropy = canvas_statistics(logits[0], logits[0].argmax(-1))
    recorded_confidence, recorded_entropy, recorded_ids, recorded_probs = frame_statistics(
        recording, logits, logits.argmax(-1))
    torch.testing.assert_close(recorded_entropy, entropy, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(recorded_confidence, confidence, rtol=1e-5, atol=1e-6)
    _, _, fallback_ids, fallback_probs = frame_statistics(library, logits, logits.argmax(-1))
    assert torch.equal(recorded_ids, fallback_ids)  # the record holds what a pass over the logits finds
    torch.testing.assert_close(recorded_probs, fallback_probs, rtol=1e-5, atol=1e-7)
    assert recording.top_ids is None  # taken once: the record does not outlive its frame


def test_recording_sampler_reuses_its_buffers_from_step_to_step_and_still_accepts_the_same():
    generator = torch.Generator().manual_seed(11)
    library, recording = _samplers(0.5)
    buffers = []
    for step in (3, 2, 1):
        logits = torch.randn(1, 32, 500, generator=generator) * step
        current, denoiser = (torch.randint(0, 500, (1, 32), generator=generator) for _ in range(2))
        expected = library.accept_canvas(current, denoiser, logits, step)
        assert torch.equal(recording.accept_canvas(current, denoiser, logits, step), expected)
        assert torch.equal(recording.token_entropy, torch.distributions.Categorical(logits=logits).entropy())
        buffers.append(recording._workspace[0].data_ptr())
    assert len(set(buffers)) == 1
    recording.accept_canvas(current[:, :16], denoiser[:, :16], logits[:, :16], 1)  # another shape: new buffers
    assert recording._workspace[0].shape == (1, 16, 500)


def test_frame_statistics_fall_back_to_the_logits_without_a_recording():
    logits = torch.randn(1, 16, 100)
    library, _ = _samplers(0.1, vocab=100, canvas=16)
    confidence, entropy, top_ids, _ = frame_statistics(library, logits, logits.argmax(-1))
    assert torch.equal(top_ids, logits[0].topk(5, dim=-1).indices)
    expected_confidence, expected_entropy = canvas_statistics(logits[0], logits[0].argmax(-1))
    assert torch.equal(confidence, expected_confidence) and torch.equal(entropy, expected_entropy)


def test_recording_sampler_refuses_other_samplers():
    class OtherSampler(EntropyBoundSampler):
        pass

    other = OtherSampler(EntropyBoundSamplerConfig(entropy_bound=0.1), 4, 10, 2)
    with pytest.raises(TypeError, match="OtherSampler"):
        RecordingEntropyBoundSampler.of(other)
    assert with_recording(other) is other  # the engine then runs it as it is, statistics from the logits
    library = EntropyBoundSampler(EntropyBoundSamplerConfig(entropy_bound=0.1), 4, 10, 2)
    assert type(with_recording(library)) is RecordingEntropyBoundSampler


def test_host_lists_keep_ids_flags_and_floats_exactly():
    ids = torch.tensor([0, 1, 262_143, 258_880])
    draft = torch.tensor([2, 106, 50, 7])
    accepted = torch.tensor([True, False, True, False])
    first = torch.tensor([-1, 0, 3, -1])
    confidence = torch.tensor([0.1, 1e-30, 1.0, 0.33333334], dtype=torch.float32)
    entropy = torch.tensor([12.476, 0.0, 3.5e-8, 1.0], dtype=torch.float32)
    lists = host_lists(ids, draft, accepted, first, confidence, entropy)
    assert lists == (ids.tolist(), draft.tolist(), accepted.tolist(), first.tolist(), confidence.tolist(),
                     entropy.tolist(), [], [], [])
    assert [type(v) for v in (lists[0][0], lists[2][0], lists[4][0])] == [int, bool, float]


def test_host_lists_carry_remelt_flags_and_alternatives_in_the_same_transfer():
    ids, draft = torch.tensor([5, 262_143, 9]), torch.tensor([7, 8, 9])
    flags, first = torch.tensor([True, False, False]), torch.tensor([0, 2, -1])
    floats = torch.tensor([0.5, 0.25, 1.0])
    remelted = torch.tensor([False, True, False])
    top_ids = torch.tensor([[7, 1, 2], [8, 262_143, 0], [9, 4, 3]])
    top_probs = torch.tensor([[0.5, 0.2, 0.1], [0.25, 0.25, 0.125], [1.0, 0.0, 0.0]])
    lists = host_lists(ids, draft, flags, first, floats, floats, remelted, top_ids, top_probs)
    assert lists[6] == [False, True, False]
    assert lists[7] == top_ids.tolist() and lists[8] == top_probs.tolist()
    assert type(lists[7][1][1]) is int
    rows = (ids, draft, flags, first, floats, floats, remelted, None, top_probs)
    transferred = one_transfer(rows, (int, int, bool, int, float, float, bool, int, float))  # an accelerator's way
    assert transferred == host_lists(*rows) and transferred[7] == []
    assert [type(transferred[i][0]) for i in (0, 2, 4)] == [int, bool, float]


def test_alternatives_put_the_draft_first_even_when_tokens_tie():
    log_probs = torch.log_softmax(torch.tensor([[1.0, 3.0, 3.0, 0.0, 2.0, 3.0], [5.0, 1.0, 1.0, 1.0, 1.0, 1.0]]), -1)
    draft = torch.tensor([5, 0])  # position 0: three tokens tie at the top; the draft is the last of them
    ids, probs = top_alternatives(log_probs, draft, k=2)
    assert ids[:, 0].tolist() == [5, 0]
    assert torch.all(probs[:, :-1] >= probs[:, 1:]) and torch.all(probs.sum(-1) <= 1 + 1e-6)
    torch.testing.assert_close(probs[:, 0], log_probs.gather(-1, draft[:, None]).squeeze(-1).exp())
    many_ties = torch.log_softmax(torch.zeros(1, 8), -1)
    ids, _ = top_alternatives(many_ties, torch.tensor([7]), k=3)
    assert ids[0, 0].item() == 7 and len(set(ids[0].tolist())) == 3


def test_alternatives_already_led_by_the_draft_stay_in_their_order():
    log_probs = torch.log_softmax(torch.tensor([[0.0, 4.0, 1.0, 3.0], [2.0, 0.5, 1.0, 0.0]]), -1)
    values, ids = log_probs.topk(3, dim=-1)
    got_ids, got_probs = draft_first(values.clone(), ids.clone(), ids[:, 0].clone(), values[:, 0])
    assert got_ids.tolist() == [[1, 3, 2], [0, 2, 1]]
    torch.testing.assert_close(got_probs, values.exp())


@pytest.mark.parametrize("vocab", [4096, 1000, 512])
def test_top_k_finds_what_topk_finds(vocab):
    generator = torch.Generator().manual_seed(vocab)
    values = torch.randn(48, vocab, generator=generator) * 4
    values[:8, 200:205] = 30.0  # five winners in one chunk
    values[8:16, ::300] = 30.0  # winners spread over chunks
    expected_values, expected_ids = values.topk(5, dim=-1)
    got_values, got_ids = top_k(values, 5)
    assert torch.equal(got_values, expected_values)
    assert torch.equal(values.gather(-1, got_ids), got_values)  # ids point at their values
    distinct = expected_values[:, :-1] > expected_values[:, 1:]
    rows_without_ties = distinct.all(-1) & (values > expected_values[:, -1:]).sum(-1).eq(4)
    assert torch.equal(got_ids[rows_without_ties], expected_ids[rows_without_ties])


def test_top_k_keeps_the_largest_values_among_ties():
    values = torch.zeros(3, 1024)
    values[0, 5] = values[1, 700] = 1.0
    got_values, got_ids = top_k(values, 5)
    assert got_values[:, 0].tolist() == [1.0, 1.0, 0.0] and got_values[:, 1:].eq(0).all()
    assert got_ids[0, 0] == 5 and got_ids[1, 0] == 700 and all(len(set(row)) == 5 for row in got_ids.tolist())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_entropy_is_bitwise_the_library_categorical_entropy(dtype):
    logits = (torch.randn(1, 8, 300, generator=torch.Generator().manual_seed(3)) * 4).to(dtype)
    logits[0, 0, :7] = -torch.inf  # what a top-k or masking processor leaves
    logits[0, 1, 11] += 60
    entropy, normalizer = entropy_and_normalizer(logits)
    assert torch.equal(entropy, torch.distributions.Categorical(logits=logits).entropy())
    buffers = (torch.full_like(logits, 7.0), torch.full_like(logits, -3.0))  # stale values from an earlier step
    again, normalized_in_buffers = entropy_and_normalizer(logits, buffers)
    assert torch.equal(again, entropy) and torch.equal(normalized_in_buffers, normalizer)
    assert normalizer.dtype == torch.float32
    expected = logits.double().logsumexp(-1, keepdim=True).float()  # a half dtype rounds each exp it sums
    torch.testing.assert_close(normalizer, expected, rtol=0, atol=1e-5 if dtype == torch.float32 else 2e-3)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_alternatives_are_their_float32_log_probabilities(dtype):
    """Five near ties 1/64 apart under a wide distribution: in the logits' dtype their log-probabilities round to a
    few equal values; shown, they are their float32 log-probabilities, in their order."""
    logits = (torch.randn(1, 16, 4096, generator=torch.Generator().manual_seed(5)) * 0.05 + 1.9).clamp(max=1.95)
    logits[0, :, 100:105] = torch.tensor([2.0, 2.015625, 2.03125, 2.046875, 2.0625])
    logits = logits.to(dtype)
    recording = RecordingEntropyBoundSampler.of(_samplers(0.5, vocab=4096, canvas=16)[0])
    canvas = torch.zeros(1, 16, dtype=torch.long)
    recording.accept_canvas(canvas, canvas, logits, 3)
    _, _, ids, probs = frame_statistics(recording, logits, logits.argmax(-1))
    assert ids.tolist() == [[104, 103, 102, 101, 100]] * 16
    expected = torch.log_softmax(logits.double(), -1)[0].gather(-1, ids)
    torch.testing.assert_close(probs.double().log(), expected, rtol=0, atol=1e-3)
    assert torch.all(probs[:, :-1] > probs[:, 1:])


def test_a_certain_position_shows_an_entropy_of_plus_zero():
    logits = torch.full((1, 4, 50), -1e4)
    logits[0, :, 7] = 1e4  # one token certain: p log p sums to zero, which may come out as -0.0 or -1e-8
    _, entropy, _, _ = frame_statistics(RecordingEntropyBoundSampler.of(_samplers(0.1, 50, 4)[0]), logits,
                                        logits.argmax(-1))
    assert [f"{value:.3f}" for value in entropy.tolist()] == ["0.000"] * 4
