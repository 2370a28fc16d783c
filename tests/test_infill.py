"""Canvas infill (engine/infill.py): fixed positions never change in any frame, blanks are what gets denoised,
templates that do not fit are refused plainly."""

import json

import pytest

from engine.cli import main
from engine.infill import filled_text, infill_frames, layout_template, parse_template

TEMPLATE = "Once upon a [___ 3] there was a [___] who <end_of_turn> lived."


def test_fixed_positions_never_change_in_any_frame(engine):
    settings = engine.recommended.replace(max_denoising_steps=6, adaptive_stopping=False)
    layout, frames = infill_frames(engine, TEMPLATE, settings, seed=5)
    frames = list(frames)
    assert len(frames) == 6 and frames[-1].done
    fixed = [i for i, f in enumerate(layout.fixed) if f]
    assert layout.blanks and len(layout.blanks) == 4 and fixed
    for frame in frames:
        for i in fixed:
            assert frame.input_ids[i] == frame.draft_ids[i] == layout.canvas_ids[i], (frame.forward_index, i)
            assert frame.accepted[i]
    final = frames[-1].committed_ids
    assert [final[i] for i in fixed] == [layout.canvas_ids[i] for i in fixed]
    # the blanks were denoised: their draft changed from the random start at some point
    assert any(frames[0].input_ids[i] != frames[-1].draft_ids[i] for i in layout.blanks)
    eos = set(engine.model.generation_config.eos_token_id if isinstance(engine.model.generation_config.eos_token_id,
                                                                         list)
              else [engine.model.generation_config.eos_token_id])
    assert not any(final[i] in eos for i in layout.blanks)
    text, fills = filled_text(engine.tokenizer, layout, final)
    assert text.startswith("Once upon a") and text.endswith("who <end_of_turn> lived.") and len(fills) == 2
    # the speed figures count the 4 tokens the model wrote, not the template's fixed text it copied
    assert all(f.committed_tokens == 0 for f in frames[:-1])
    last = frames[-1]
    assert last.committed_tokens == 4 < layout.template_positions
    assert last.tokens_per_second == pytest.approx(4 / last.elapsed_s)
    assert last.tokens_per_forward == pytest.approx(4 / 6)
    assert last.stop_reason == "filled"  # not "reached max new tokens": Infill has no such setting


def test_template_text_is_plain_text_and_same_seed_same_fill(engine):
    end_turn = engine.tokenizer.convert_tokens_to_ids("<end_of_turn>")
    layout = layout_template(engine.tokenizer, TEMPLATE, engine.canvas_length, 0)
    assert end_turn not in layout.canvas_ids
    settings = engine.recommended.replace(max_denoising_steps=2)
    runs = [list(infill_frames(engine, TEMPLATE, settings, seed=9)[1])[-1].committed_ids for _ in range(2)]
    assert runs[0] == runs[1]


def test_a_space_before_a_blank_is_the_fill_s_own(engine):
    tokenizer = engine.tokenizer
    layout = layout_template(tokenizer, "In the beginning [___ 3] created", engine.canvas_length, 0)
    words = tokenizer("In the beginning", add_special_tokens=False)["input_ids"]
    assert layout.canvas_ids[:len(words) + 3] == words + [-1, -1, -1]  # no lone space token before the blank
    settings = engine.recommended.replace(max_denoising_steps=2)
    final = list(infill_frames(engine, "In the beginning [___ 3] created", settings, seed=1)[1])[-1].committed_ids
    text, fills = filled_text(tokenizer, layout, final)
    assert "  " not in text and text.startswith("In the beginning ") and text.endswith(" created")


@pytest.mark.parametrize("template, error", [
    ("", "empty"),
    ("no blanks here", "no blank"),
    ("a [___ 0] b", "takes 1 to 64"),
    ("a [___ 65] b", "takes 1 to 64"),
    ("a [___ x] b", "malformed blank"),
    ("a [___", "malformed blank"),
])
def test_bad_templates_are_refused_by_name(template, error):
    with pytest.raises(ValueError, match=error):
        parse_template(template, 64)


def test_template_longer_than_the_canvas_is_refused_plainly(engine):
    with pytest.raises(ValueError, match=r"\(\d+ fixed tokens and 20 blank positions\) but one canvas holds 64"):
        layout_template(engine.tokenizer, "word " * 50 + "[___ 20]", engine.canvas_length, 0)
    layout = layout_template(engine.tokenizer, "[___ 64]", engine.canvas_length, 0)
    assert layout.blanks == list(range(64)) and layout.template_positions == 64


def test_cli_infill_prints_the_filled_template(capsys):
    status = main(["infill", "--template", "The [___ 2] is blue.", "--seed", "1", "--steps", "2", "--device", "cpu",
                   "--json"])
    out = json.loads(capsys.readouterr().out)
    assert status == 0 and out["text"].startswith("The") and out["text"].endswith("is blue.")
    assert len(out["blank_positions"]) == 2 and out["result"]["seed"] == 1
    assert main(["infill", "--template", "no blanks"]) == 2
    assert "no blank" in capsys.readouterr().err
    assert main(["infill", "--template", "x [___ 0] y"]) == 2  # refused before the model loads
    assert capsys.readouterr().err == "error: blank [___ 0] asks for 0 tokens; a blank takes at least 1\n"


def test_fixed_positions_hold_at_the_real_vocabulary(standin_engine):
    settings = standin_engine.recommended.replace(max_denoising_steps=2, adaptive_stopping=False)
    layout, frames = infill_frames(standin_engine, "The sky is [___ 3] because of <turn|> [___ 10].", settings,
                                   seed=1)
    frames = list(frames)
    assert len(frames) == 2 and layout.template_positions < standin_engine.canvas_length == 256
    assert standin_engine.tokenizer.convert_tokens_to_ids("<turn|>") not in layout.canvas_ids
    for frame in frames:
        for i, fixed in enumerate(layout.fixed):
            if fixed:
                assert frame.input_ids[i] == frame.draft_ids[i] == layout.canvas_ids[i] and frame.accepted[i]
