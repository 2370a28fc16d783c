"""The race: autoregressive decoding as an engine feature, the race runner, its view, the `/race` API and the CLI."""

from __future__ import annotations

import json
import threading

import gradio as gr
import pytest
import torch
from gradio_client import Client
from gradio_client.exceptions import AppError
from transformers import Gemma3ForCausalLM, Gemma3TextConfig

import app
from diffgemma_ui.race_tab import (RaceProgress, RaceSession, RaceTab, caveat_text, explanation, frame_at, panel_html,
                                   result_html)
from diffgemma_ui.text import escape_html
from engine.cli import main, verdict_line
from engine.loading import ModelLoadError
from engine.race import (ORDERS, AutoregressiveDecoder, RaceResult, RaceRunner, SideResult, TokenFrame, causal_lm_bytes,
                         check_fit, check_temperature, eos_ids, punctuation_share, race_runner, repeated_share,
                         side_weights_bytes, weights_bytes_per_forward)
from pages import open_page, set_number

PROMPTS = [("In the beginning", True), ("Blessed are the", True), ("Tell me what happened after the flood.", False)]


@pytest.fixture(scope="module")
def ar(engine):
    return AutoregressiveDecoder.from_diffusion(engine)


@pytest.fixture(scope="module")
def small(engine):
    """One canvas, three denoising steps: a race of a few seconds on the embedded model."""
    return engine.recommended.replace(max_new_tokens=engine.canvas_length, max_denoising_steps=3)


def reference_loop(model, input_ids, new_tokens, eos, temperature=0.0, seed=None):
    """Token by token with a full re-encode of the whole sequence each step (no cache): the encoder, the tied
    lm_head and the softcap written out as `DiffusionGemmaForBlockDiffusion.forward` does; sampling as
    `GenerationMixin._sample` does, after `torch.manual_seed(seed)`."""
    if seed is not None:
        torch.manual_seed(seed)
    sequence, tokens = input_ids, []
    with torch.no_grad():
        for _ in range(new_tokens):
            hidden = model.model.encoder(input_ids=sequence).last_hidden_state
            logits = model.lm_head(hidden[:, -1]).to(torch.float32)
            cap = model.final_logit_softcapping
            logits = torch.tanh(logits / cap) * cap
            if temperature > 0:
                token = torch.multinomial(torch.softmax(logits / temperature, dim=-1), num_samples=1)
            else:
                token = logits.argmax(dim=-1, keepdim=True)
            tokens.append(int(token))
            sequence = torch.cat([sequence, token], dim=-1)
            if tokens[-1] in eos:
                break
    return tokens


# -- the autoregressive side ---------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("prompt,raw", PROMPTS)
def test_greedy_tokens_equal_a_full_re_encode_loop(engine, ar, prompt, raw):
    input_ids = engine.encode_prompt(prompt, raw=raw)
    frames = list(ar.decode(input_ids, 12))
    expected = reference_loop(engine.model, input_ids, 12, ar.eos_token_ids)
    assert frames[-1].committed_ids == expected
    assert [f.token_id for f in frames] == expected  # one frame per forward, one token each
    assert len(frames) == len(expected) and frames[-1].done
    assert frames[-1].stop_reason == ("eos" if expected[-1] in ar.eos_token_ids else "max_new_tokens")


@pytest.mark.slow
def test_sampled_tokens_are_reproducible_for_a_seed_and_match_the_sampling_loop(engine, ar):
    input_ids = engine.encode_prompt("In the beginning", raw=True)

    def sampled(seed):
        return list(ar.frames("In the beginning", 10, raw=True, temperature=1.0, seed=seed))[-1].committed_ids

    first = sampled(5)
    torch.manual_seed(999)  # the global RNG in any state: the run keeps its own
    assert sampled(5) == first
    assert first == reference_loop(engine.model, input_ids, 10, ar.eos_token_ids, temperature=1.0, seed=5)
    assert any(sampled(seed) != first for seed in (6, 7, 8))


@pytest.mark.slow
def test_token_frames_count_like_the_diffusion_side(engine, ar):
    frames = list(ar.frames("In the beginning", 8, raw=True, seed=0))
    for i, frame in enumerate(frames):
        assert isinstance(frame, TokenFrame) and frame.forward_index == i and frame.forwards == i + 1
        assert len(frame.committed_ids) == i + 1 and frame.committed_tokens == i + 1  # no pads here
        assert frame.tokens_per_forward == pytest.approx(1.0)
        assert frame.tokens_per_second == pytest.approx(frame.committed_tokens / frame.elapsed_s)
        assert frame.time_to_first_token_s == frames[0].elapsed_s
        assert frame.seed == 0 and frame.prompt_tokens == engine.encode_prompt("In the beginning", raw=True).shape[1]
    assert [f.elapsed_s for f in frames] == sorted(f.elapsed_s for f in frames)
    json.dumps(frames[-1].to_dict())


@pytest.mark.slow
def test_eos_list_ends_the_run_with_the_eos_counted(engine):
    decoder = AutoregressiveDecoder.from_diffusion(engine)
    greedy = list(decoder.frames("In the beginning", 8, raw=True))[-1].committed_ids
    decoder.eos_token_ids = {1, 106, greedy[2]}  # like the real checkpoint's [1, 106, 50]
    frames = list(decoder.frames("In the beginning", 8, raw=True))
    stop = greedy.index(greedy[2]) + 1
    assert frames[-1].committed_ids == greedy[:stop] and frames[-1].stop_reason == "eos"
    assert frames[-1].committed_tokens == stop and len(frames) == stop


def test_eos_ids_accept_an_int_a_list_or_none():
    class Config:
        eos_token_id = [1, 106, 50]

    assert eos_ids(Config()) == {1, 106, 50}
    Config.eos_token_id = 1
    assert eos_ids(Config()) == {1}
    Config.eos_token_id = None
    assert eos_ids(Config()) == set()


@pytest.mark.slow
def test_stop_event_ends_the_run_with_a_cancelled_frame(ar):
    stop = threading.Event()
    frames = []
    for frame in ar.frames("In the beginning", 50, raw=True, stop_event=stop):
        frames.append(frame)
        if len(frames) == 3:
            stop.set()
    assert len(frames) == 4 and frames[-1].stop_reason == "cancelled" and frames[-1].done
    assert frames[-1].committed_ids == frames[-2].committed_ids


def test_bad_autoregressive_inputs_are_refused(engine, ar):
    for value in (-0.1, float("nan"), "warm", None, True, 11):
        with pytest.raises(ValueError, match="ar_temperature"):
            check_temperature(value)
    with pytest.raises(ValueError, match="max_new_tokens"):
        ar.frames("In the beginning", 0)
    with pytest.raises(ValueError, match="prompt is empty"):
        ar.frames("   ", 4)
    with pytest.raises(ValueError, match="seed"):
        ar.frames("x", 4, seed=-5)
    with pytest.raises(ValueError, match="shape"):
        next(ar.decode(torch.tensor([[2, 5], [2, 6]]), 3))


# -- the race runner -----------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_race_counts_are_consistent_and_the_sides_take_turns(engine, small):
    runner = RaceRunner(engine)
    seen = []
    result = runner.run("Tell me what happened after the flood.", small, seed=3, order="autoregressive first",
                        on_frame=lambda side, frame: seen.append(side))
    assert result.order == ("autoregressive", "diffusion")
    assert seen == ["autoregressive"] * result.autoregressive.forwards + ["diffusion"] * result.diffusion.forwards
    assert result.budget == engine.canvas_length and not result.cancelled
    for side in (result.diffusion, result.autoregressive):
        assert side.forwards == len(side.trace) and side.seconds == side.trace[-1][0]
        assert side.tokens == side.trace[-1][1] > 0
        assert side.tokens == sum(1 for t in side.token_ids if t != engine.model.generation_config.pad_token_id)
        assert side.tokens_per_second == pytest.approx(side.tokens / side.seconds)
        assert side.tokens_per_forward == pytest.approx(side.tokens / side.forwards)
        assert side.seconds_per_forward * side.forwards == pytest.approx(side.seconds)
        assert 0 < side.time_to_first_token_s <= side.seconds
        assert side.stop_reason in ("eos", "max_new_tokens") and side.warm_up_s > 0
    assert result.autoregressive.tokens_per_forward == pytest.approx(1.0)
    assert result.diffusion.forwards <= 3  # one canvas of at most three steps
    assert result.speedup == pytest.approx(result.diffusion.tokens_per_second
                                           / result.autoregressive.tokens_per_second)
    assert result.autoregressive.position == 1 and result.diffusion.position == 2
    # the diffusion side's answer is the engine's own for that seed and settings
    assert result.diffusion.token_ids == engine.generate("Tell me what happened after the flood.", small,
                                                         seed=3).token_ids
    summary = result.summary()
    json.dumps(summary)
    assert summary["speedup"] == result.speedup and "trace" not in summary["diffusion"]
    verdict = summary["verdict"]
    assert verdict["winner"] in ("diffusion", "autoregressive") and verdict["bound"] == "compute"
    assert summary["fairness"]
    assert verdict["cost_ratio"] == pytest.approx(result.diffusion.seconds_per_forward
                                                  / result.autoregressive.seconds_per_forward)
    assert set(verdict["faults"]) == {"diffusion", "autoregressive"}
    for side in (result.diffusion, result.autoregressive):
        assert 0 <= side.punctuation_share <= 1 and 0 <= side.repeated_share <= 1
        assert summary[side.name]["faults"] == list(side.faults) == verdict["faults"][side.name]
    assert "ms per canvas forward" in explanation(result)  # the words live in the view, the facts in the engine


@pytest.mark.slow
def test_alternate_order_alternates(engine, small):
    runner = RaceRunner(engine)
    orders = [runner.run("In the beginning", small, raw=True, seed=1, warm_up=False).order for _ in range(2)]
    assert orders[0] != orders[1] and set(orders[0]) == set(orders[1])


@pytest.mark.slow
def test_a_stopped_race_does_not_start_its_second_side(engine, small):
    stop = threading.Event()
    result = RaceRunner(engine).run("In the beginning", small, raw=True, seed=1, order="diffusion first",
                                    on_frame=lambda side, frame: stop.set(), stop_event=stop, warm_up=False)
    assert result.cancelled and result.autoregressive is None and result.speedup is None
    assert result.diffusion.stop_reason == "cancelled"


def test_race_refuses_bad_inputs_before_running(engine, small):
    runner = RaceRunner(engine)
    with pytest.raises(ValueError, match="order must be one of"):
        runner.run("x", small, order="sideways")
    with pytest.raises(ValueError, match="ar_temperature"):
        runner.run("x", small, ar_temperature=-1)
    with pytest.raises(ValueError, match="prompt is empty"):
        runner.run("", small)
    with pytest.raises(ValueError, match="context"):
        runner.run("\U0001f600" * 2100, small, raw=True)  # 8,400 tokens in 2,100 characters: under the prompt limit
    assert ORDERS[0] == "alternate"


def test_weights_bytes_count_shared_tensors_once_and_scale_experts():
    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.dense = torch.nn.Linear(4, 4, bias=False)  # 16 float32 = 64 bytes
            self.experts = torch.nn.Module()
            self.experts.down_proj = torch.nn.Parameter(torch.zeros(8, 4))  # 32 float32 = 128 bytes

    layer = Layer()

    class Config:
        num_experts, top_k_experts = 8, 2

    assert weights_bytes_per_forward([layer, layer.dense], Config, positions=1) == 64 + 128 * 2 // 8
    assert weights_bytes_per_forward([layer], Config, positions=10_000) == 64 + 128
    assert weights_bytes_per_forward([layer], object(), positions=1) == 64 + 128  # dense config: all of it


# -- the view ------------------------------------------------------------------------------------------------------
def side_result(name, **changes):
    values = dict(name=name, model="m", text="<script>alert(1)</script>", token_ids=[5, 6], tokens=2, forwards=2,
                  seconds=0.5, tokens_per_second=4.0, tokens_per_forward=1.0, time_to_first_token_s=0.25,
                  seconds_per_forward=0.25, seconds_per_token=0.25, stop_reason="eos", prompt_tokens=3, position=1,
                  warm_up_s=0.1, trace=[(0.25, 1), (0.5, 2)])
    values.update(changes)
    return SideResult(**values)


def test_result_card_escapes_and_explains_either_winner():
    slow = RaceResult(side_result("diffusion", tokens_per_second=2.0, seconds_per_forward=1.0,
                                  tokens_per_forward=2.0, seconds_per_token=0.5),
                      side_result("autoregressive", position=2), ("diffusion", "autoregressive"), 7, 64, 64, "cpu",
                      None)
    assert slow.speedup == pytest.approx(0.5)
    text = explanation(slow)
    assert text.startswith("Autoregressive decoding wins") and "1000.00 ms per canvas forward" in text
    assert "compute-bound" in text and slow.verdict()["winner"] == "autoregressive"
    html = result_html(slow)
    assert escape_html(text) in html
    assert 'data-speedup="0.5"' in html and "2.0x slower" in html and "<script" not in html
    fast = RaceResult(side_result("diffusion", tokens_per_second=12.0, tokens_per_forward=3.0),
                      side_result("autoregressive"), ("autoregressive", "diffusion"), 7, 64, 256, "cuda:0", 3000.0)
    assert explanation(fast).startswith("Diffusion wins") and "reading the weights" in explanation(fast)
    assert fast.verdict() == {"winner": "diffusion", "stopped_side": None, "cost_ratio": 1.0, "bound": "memory",
                              "faults": {"diffusion": [], "autoregressive": []}}


def test_a_stopped_race_names_no_winner_and_says_which_side_was_cut_short():
    cut_short = RaceResult(side_result("diffusion", tokens_per_second=300.0, seconds_per_token=0.003),
                           side_result("autoregressive", tokens=334, tokens_per_second=145.0, stop_reason="cancelled",
                                       position=2),
                           ("diffusion", "autoregressive"), 7, 1024, 64, "cpu", None, cancelled=True)
    assert cut_short.speedup is None and cut_short.stopped_side == "autoregressive"
    text = explanation(cut_short)
    assert text.startswith("No winner: the race was stopped while the autoregressive side ran after 334 tokens")
    assert "Diffusion wins" not in text and "decoding wins" not in text
    assert cut_short.verdict()["winner"] is None and cut_short.verdict()["stopped_side"] == "autoregressive"
    html = result_html(cut_short)
    assert "the autoregressive side was cut short after 334 tokens, so no speedup is given" in html
    assert 'data-speedup=""' in html and "Stopped before both sides ran" not in html
    never_ran = RaceResult(side_result("diffusion", stop_reason="cancelled"), None, ("diffusion", "autoregressive"),
                           7, 64, 64, "cpu", None, cancelled=True)
    assert never_ran.stopped_side == "diffusion" and explanation(never_ran) == ""
    assert "Autoregressive never ran: Stop came before its turn." in result_html(never_ran)
    assert "never ran" not in html  # both sides ran in the cut-short race
    first_done = RaceResult(side_result("diffusion"), None, ("diffusion", "autoregressive"), 7, 64, 64, "cpu", None,
                            cancelled=True)
    assert "Stopped before the autoregressive side ran" in result_html(first_done)


def test_answers_of_very_different_lengths_are_called_out_under_the_speedup():
    short = RaceResult(side_result("diffusion", tokens=41, tokens_per_second=400.0),
                       side_result("autoregressive", tokens=256, tokens_per_second=190.0, stop_reason="max_new_tokens"),
                       ("diffusion", "autoregressive"), 7, 256, 64, "cpu", None)
    html = result_html(short)
    assert ("diffusion wrote 41 tokens (ended at end-of-sequence), autoregressive 256 tokens (reached max new tokens)"
            in html)
    close = RaceResult(side_result("diffusion", tokens=150), side_result("autoregressive", tokens=256),
                       ("diffusion", "autoregressive"), 7, 256, 64, "cpu", None)
    assert "dg-race-lengths" not in result_html(close)


def test_answer_checks_count_punctuation_only_tokens_and_repeated_runs():
    assert punctuation_share([",", " ,", "\n", " the", "2", "<0xE2>", "  "]) == pytest.approx(2 / 5)  # spaces: neither
    assert punctuation_share([]) == punctuation_share(["\n"]) == 0.0 and repeated_share([]) == 0.0
    assert repeated_share([" a", " b", " c", " d"] * 3) == pytest.approx(8 / 12)  # the first run is not a repeat
    assert repeated_share(" the cat sat on the mat and then the dog ran".split(" ")) == 0.0
    assert repeated_share(["x"] * 5) == pytest.approx(4 / 5) and repeated_share(["x"] * 4) == 0.0
    commas = side_result("diffusion", tokens=41, punctuation_share=0.8)
    loop = side_result("autoregressive", repeated_share=0.9, punctuation_share=0.6)  # as much as code may have
    assert commas.faults == ("punctuation",) and loop.faults == ("repetition",) and side_result("x").faults == ()
    assert commas.summary()["faults"] == ["punctuation"]


def test_the_card_says_so_beside_the_speedup_when_an_answer_is_mostly_punctuation_or_repeats():
    # 41 tokens, mostly commas, at 2.78x the speed of 256 readable autoregressive tokens
    commas = RaceResult(side_result("diffusion", tokens=41, tokens_per_second=278.0, punctuation_share=0.78),
                        side_result("autoregressive", tokens=256, tokens_per_second=100.0,
                                    stop_reason="max_new_tokens"),
                        ("diffusion", "autoregressive"), 7, 256, 64, "cpu", None)
    assert commas.verdict()["winner"] == "diffusion"
    assert commas.verdict()["faults"] == {"diffusion": ["punctuation"], "autoregressive": []}
    html = result_html(commas)
    speedup = html[html.index('<p class="dg-race-speedup">'):]
    speedup = speedup[:speedup.index("</p>")]
    assert "2.78x the autoregressive speed" in speedup and "dg-race-caveat" in speedup  # beside the speedup
    assert "The diffusion answer is mostly punctuation (78% of its visible tokens have no letter or digit)" in speedup
    assert "not readable text" in speedup and 'data-faults="diffusion"' in html
    assert explanation(commas).startswith("Diffusion wins on speed alone:")
    looping = RaceResult(side_result("diffusion"), side_result("autoregressive", repeated_share=0.9,
                                                               punctuation_share=0.7),
                         ("diffusion", "autoregressive"), 7, 64, 64, "cpu", None)
    assert "The autoregressive answer is mostly punctuation (70% of its visible tokens have no letter or digit) and " \
           "repeats itself (90% of its tokens repeat an earlier run of 4)." in caveat_text(looping)
    clean = RaceResult(side_result("diffusion"), side_result("autoregressive"), ("diffusion", "autoregressive"), 7,
                       64, 64, "cpu", None)
    assert caveat_text(clean) == "" and "dg-race-caveat" not in result_html(clean)
    assert 'data-faults=""' in result_html(clean) and "alone" not in explanation(clean)


def test_panels_escape_model_text_and_follow_the_replay_clock():
    frames = [TokenFrame(i, 7, "<b>", [7] * (i + 1), i + 1, 0.0, i == 2, "eos" if i == 2 else "", 0.1 * (i + 1),
                         0.1, (i + 1) / (0.1 * (i + 1)), 1.0, 3, 0) for i in range(3)]
    assert frame_at(frames, 0.05) is None and frame_at(frames, 0.25) is frames[1] and frame_at(frames, 9) is frames[2]
    html = panel_html("autoregressive", frame_at(frames, 0.25), text="<img src=x onerror=alert(1)>", model="<m>",
                      position=2, state="replay", t=0.25, first_token_s=0.1)
    assert "<img" not in html and "&lt;img" in html and "&lt;m&gt;" in html
    assert 'data-tokens="2"' in html and "8.0" in html  # 2 tokens at 0.25 s on the replay clock
    waiting = panel_html("diffusion", None, text="", model="m", position=2, state="waiting")
    assert 'data-state="waiting"' in waiting and "waits its turn" in waiting



def test_a_side_that_never_ran_says_so_after_the_race():
    html = panel_html("diffusion", None, text="", model="m", position=None, state="unrun")
    note = html.split('class="dg-meter-note">')[1].split("<")[0]
    assert note == "not run: Stop came before its turn \u00b7 engine clock" and "Not run." in html
    assert "dg-race-caret" not in html
    idle = panel_html("diffusion", None, text="", model="m", position=None, state="idle")
    assert "press Race to start \u00b7 engine clock" in idle and "The answer appears here." in idle
    unnoted = panel_html("diffusion", None, text="", model="m", position=None, state="running")
    assert unnoted.split('class="dg-meter-note">')[1].startswith("running now")


def test_panels_mark_the_side_a_stopped_race_never_reached_live_and_in_replay(engine):
    tab = RaceTab(RaceRunner(engine))
    stopped = TokenFrame(0, 7, "x", [], 0, 0.0, True, "cancelled", 0.4, 0.0, 0.0, 0.0, 3, 0)
    progress = RaceProgress(order=["autoregressive"], finished=True)
    progress.frames["autoregressive"].append(stopped)
    states = {side: html.split('data-state="')[1].split('"')[0]
              for side, html in zip(("diffusion", "autoregressive"), tab.panels(progress))}
    assert states == {"diffusion": "unrun", "autoregressive": "done"}
    replay = tab.panels(progress, state="replay", t=0.0)
    assert 'data-state="unrun"' in replay[0] and 'data-state="replay"' in replay[1]
    progress.finished = False
    assert 'data-state="waiting"' in tab.panels(progress)[0]


def test_a_side_stopped_before_its_first_token_shows_no_rate_and_no_replay_caret():
    stopped = TokenFrame(0, 7, "x", [], 0, 0.0, True, "cancelled", 0.4, 0.0, 0.0, 0.0, 3, 0)
    html = panel_html("autoregressive", stopped, text="", model="m", position=1, state="done", t=float("inf"))
    cards = html.split('class="dg-meter-note"')[0]
    assert "0.0" not in cards and "\u2026" not in cards and cards.count("\u2013") >= 3  # tokens/s, per forward, first
    assert "dg-race-caret" not in html and "replay" not in html


# -- the CLI -------------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_cli_race_prints_one_json_object(capsys):
    assert main(["race", "--prompt", "In the beginning", "--raw", "--seed", "2", "--max-new-tokens", "64",
                 "--steps", "2", "--device", "cpu", "--order", "diffusion-first", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["order"] == ["diffusion", "autoregressive"] and summary["seed"] == 2
    for side in ("diffusion", "autoregressive"):
        assert summary[side]["tokens"] > 0 and isinstance(summary[side]["text"], str)
    assert summary["diffusion"]["forwards"] <= 2


def test_cli_verdict_line_gives_the_facts_on_one_line():
    commas = RaceResult(side_result("diffusion", tokens_per_second=8.0, seconds_per_forward=0.5,
                                    punctuation_share=0.9, repeated_share=0.7),
                        side_result("autoregressive"), ("diffusion", "autoregressive"), 7, 64, 64, "cpu", None)
    assert verdict_line(commas.verdict()) == ("winner=diffusion stopped_side=none cost_ratio=2.00 bound=compute "
                                              "faults=diffusion:punctuation+repetition")
    stopped = RaceResult(side_result("diffusion", stop_reason="cancelled"), None, ("diffusion", "autoregressive"), 7,
                         64, 64, "cuda:0", None, cancelled=True)
    assert verdict_line(stopped.verdict()) == ("winner=none stopped_side=diffusion cost_ratio=n/a bound=memory "
                                               "faults=none")


def test_cli_race_refuses_bad_input_before_loading(capsys):
    assert main(["race", "--prompt", " "]) == 2
    assert "prompt is empty" in capsys.readouterr().err
    assert main(["race", "--prompt", "x", "--ar-temperature", "-2"]) == 2
    assert "ar_temperature" in capsys.readouterr().err


# -- the /race API -------------------------------------------------------------------------------------------------
# prompt, raw, max_new_tokens, max_denoising_steps, entropy_bound, t_min, t_max, stability_threshold,
# confidence_threshold, adaptive_stopping, seed (the /generate inputs), then ar_temperature and order
RACE_ARGS = ("In the beginning", True, 64, 3, 0.5, 0.4, 0.8, 1, 0.05, True, 4, 0.0, "diffusion first")


@pytest.fixture(scope="module")
def client(served_app):
    return Client(served_app[1], verbose=False)


@pytest.mark.slow
def test_race_api_returns_both_texts_and_consistent_summaries(client, engine):
    api = client.view_api(return_format="dict", print_info=False)["named_endpoints"]["/race"]
    assert [p["parameter_name"] for p in api["parameters"]][-2:] == ["ar_temperature", "order"]
    diffusion_text, ar_text, summary = client.predict(*RACE_ARGS, api_name="/race")
    assert summary["order"] == ["diffusion", "autoregressive"] and summary["seed"] == 4 and summary["budget"] == 64
    for name, text in (("diffusion", diffusion_text), ("autoregressive", ar_text)):
        side = summary[name]
        assert side["text"] == text and side["tokens"] > 0 and side["forwards"] > 0
        assert side["tokens"] == sum(1 for t in side["token_ids"] if t != engine.model.generation_config.pad_token_id)
        assert side["tokens_per_second"] == pytest.approx(side["tokens"] / side["seconds"])
        assert side["tokens_per_forward"] == pytest.approx(side["tokens"] / side["forwards"])
        assert side["seconds_per_forward"] == pytest.approx(side["seconds"] / side["forwards"])
        assert 0 < side["time_to_first_token_s"] <= side["seconds"]
    assert summary["diffusion"]["forwards"] <= 3 and summary["autoregressive"]["tokens_per_forward"] == 1.0
    assert summary["speedup"] == pytest.approx(summary["diffusion"]["tokens_per_second"]
                                               / summary["autoregressive"]["tokens_per_second"])
    # the diffusion side is the /generate run of the same inputs
    _, generated = client.predict(*RACE_ARGS[:11], api_name="/generate")
    assert generated["token_ids"] == summary["diffusion"]["token_ids"]


@pytest.mark.slow
@pytest.mark.parametrize("index,value", [(0, ""), (2, 0), (3, 10_000), (4, "many"), (5, 0.9), (10, 1.5),
                                         (9, "maybe")])
def test_race_api_refuses_bad_inputs_as_generate_does(client, index, value):
    args = list(RACE_ARGS)
    args[index] = value
    with pytest.raises(AppError) as generate_error:
        client.predict(*args[:11], api_name="/generate")
    with pytest.raises(AppError) as race_error:
        client.predict(*args, api_name="/race")
    assert str(race_error.value) == str(generate_error.value) and str(race_error.value)


@pytest.mark.slow
@pytest.mark.parametrize("index,value,message", [(11, -1, "ar_temperature"), (11, "hot", "ar_temperature"),
                                                 (12, "sideways", "order must be one of")])
def test_race_api_refuses_bad_race_inputs(client, index, value, message):
    args = list(RACE_ARGS)
    args[index] = value
    with pytest.raises(AppError, match=message):
        client.predict(*args, api_name="/race")


# -- the page ------------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_browser_race_fills_both_panels_and_shows_the_speedup(browser, served_app, tmp_path):
    page, problems = open_page(browser, served_app[1])
    page.get_by_role("tab", name="Race", exact=True).click()
    page.fill("#dg-race-prompt textarea", "In the beginning")
    page.check("#dg-race-raw input[type=checkbox]")
    set_number(page, "Token budget", 64)
    page.locator("#dg-race-preset input").fill("fast")
    page.locator("#dg-race-preset input").press("Enter")
    page.click("#dg-race-start")
    page.wait_for_selector(".dg-race-result[data-state='done']", timeout=120_000)
    for side in ("diffusion", "autoregressive"):
        panel = page.locator(f".dg-race-panel[data-side='{side}']")
        assert int(panel.get_attribute("data-tokens")) > 0
        assert panel.locator(".dg-race-answer").inner_text().strip()
    assert float(page.locator(".dg-race-result").get_attribute("data-speedup")) > 0
    assert "the autoregressive speed" in page.locator(".dg-race-speedup").inner_text()
    assert "never at once" in page.locator(".dg-race-rules").inner_text()
    assert page.locator(".dg-race-costs tr").count() == 3
    page.screenshot(path=str(tmp_path / "race.png"), full_page=True)
    assert not problems, problems
    page.close()


# -- a separate autoregressive checkpoint ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def causal_lm(engine, tmp_path_factory):
    """A tiny random Gemma 3 causal LM with the embedded model's tokenizer, saved as a checkpoint folder."""
    folder = tmp_path_factory.mktemp("ar-model")
    config = Gemma3TextConfig(vocab_size=len(engine.tokenizer), hidden_size=32, intermediate_size=64,
                              num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                              max_position_embeddings=512, sliding_window=64, eos_token_id=[1, 4], pad_token_id=0,
                              bos_token_id=2)
    torch.manual_seed(0)
    Gemma3ForCausalLM(config).save_pretrained(folder)
    engine.tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.slow
def test_a_separate_causal_lm_races_against_the_diffusion_model(engine, small, causal_lm):
    runner = race_runner(engine, str(causal_lm))
    assert not runner.ar.shared_weights and runner.ar.eos_token_ids == {1, 4}
    result = runner.run("In the beginning", small, raw=True, seed=0, order="autoregressive first")
    assert result.autoregressive.model == str(causal_lm) and result.autoregressive.tokens > 0
    # greedy: the tokens of the checkpoint's own generate()
    input_ids = runner.ar.encode_prompt("In the beginning", raw=True)
    generated = runner.ar.model.generate(input_ids, max_new_tokens=result.budget, do_sample=False)
    expected = generated[0, input_ids.shape[1]:]
    assert result.autoregressive.token_ids == expected.tolist()[: len(result.autoregressive.token_ids)]


def test_an_ar_model_that_does_not_fit_is_refused_with_both_needs(engine, causal_lm):
    needed = causal_lm_bytes(str(causal_lm), torch.float32)
    assert needed > 0
    with pytest.raises(ModelLoadError) as info:
        check_fit(engine, str(causal_lm), torch.float32, free=needed // 2)
    message = str(info.value)
    assert "\n" not in message and "needs about" in message and "diffusion model's" in message
    assert "free" in message and "without --ar-model" in message
    assert check_fit(engine, str(causal_lm), torch.float32, free=10 * needed) == needed


@pytest.mark.slow
def test_app_refuses_an_ar_model_that_does_not_fit_at_start(causal_lm, monkeypatch, capsys):
    monkeypatch.setattr("engine.race.free_bytes", lambda device: 1000)
    assert app.main(["--device", "cpu", "--ar-model", str(causal_lm), "--port", "7999"]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "needs about" in lines[0] and "GiB free" in lines[0]


@pytest.mark.slow
def test_gpu_bandwidth_bound_fields_follow_from_bytes_and_bandwidth(engine, small, monkeypatch):
    """The bound as a GPU run computes it (measured bandwidth stood in for: there is no GPU here)."""
    runner = RaceRunner(engine)
    weights = side_weights_bytes(engine, runner.ar)
    assert 0 < weights[1] <= weights[0]  # a one-token forward reads at most what a canvas forward reads
    monkeypatch.setattr(runner, "_bandwidth_figures", lambda: (2e9, weights))
    result = runner.run("In the beginning", small, raw=True, seed=0, warm_up=False)
    assert result.memory_bandwidth_gb_s == 2.0
    for side, bytes_per_forward in zip((result.diffusion, result.autoregressive), weights):
        assert side.weights_bytes_per_forward == bytes_per_forward
        assert side.bandwidth_bound_s_per_forward == pytest.approx(bytes_per_forward / 2e9)
        assert side.bandwidth_bound_tokens_per_second == pytest.approx(
            side.tokens_per_forward / side.bandwidth_bound_s_per_forward)
    html = result_html(result)
    assert "bandwidth bound per forward" in html and "2 GB/s" in html


@pytest.mark.slow
def test_race_tab_runs_then_replays_and_resets_buttons_on_failure(engine, monkeypatch):
    tab, session = RaceTab(RaceRunner(engine)), RaceSession()
    inputs = ("In the beginning", True, "fast", 64, 0, 0.0, "diffusion first")
    live = list(tab.race_stream(session, None, *inputs))
    assert live[0][3]["interactive"] is False and live[0][4]["interactive"] is True  # Race off, Stop on
    assert session.progress is not None and session.progress.result is not None
    replay = list(tab.replay_stream(session))
    assert 'data-state="replay"' in replay[0][0] if len(replay) > 1 else True
    final = replay[-1]
    assert 'data-state="done"' in final[2] and final[3]["interactive"] is True and final[4]["interactive"] is False
    tokens = session.progress.result.diffusion.tokens
    assert f'data-tokens="{tokens}"' in final[0]

    monkeypatch.setattr(tab.runner, "run", lambda *args, **kwargs: (_ for _ in ()).throw(RuntimeError("boom")))
    outputs = []
    with pytest.raises(gr.Error, match="engine failed"):
        for output in tab.race_stream(RaceSession(), None, *inputs):
            outputs.append(output)
    assert outputs[-1][3]["interactive"] is True and outputs[-1][4]["interactive"] is False


def test_race_is_not_refused_on_zero_gpu(engine, monkeypatch):
    """The race runs in the GPU process on ZeroGPU (tests/test_spaces.py): its checks pass there as anywhere."""
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    race = RaceTab(RaceRunner(engine)).ui_request("In the beginning", True, "fast", 64, 0, 0.0, "alternate")
    assert race[2] == "alternate"
