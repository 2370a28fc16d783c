"""Traces: export then load gives identical frames, every refused trace has its message, the CLI writes both files.

The offline page's browser checks are in `test_replay_browser.py`.
"""

from __future__ import annotations

import copy
import json
import re
import threading

import pytest

from benchmarks.browser import synthetic_trace
from engine.cli import main
from engine.trace import (MAX_TRACE_BYTES, TRACE_VERSION, ModelInfo, Trace, TraceError, load_trace, record_trace,
                          replay_data, replay_html, script_json, trace_of_run)

EXACT_FIELDS = ("block_index", "step_index", "forward_index", "canvas_length", "max_denoising_steps", "temperature",
                "input_ids", "draft_ids", "accepted", "first_accepted_step", "input_tokens", "draft_tokens",
                "block_done", "block_stopped_early", "done", "committed_ids", "committed_tokens",
                "forwards_per_block", "prompt_tokens", "seed", "stop_reason", "input_kinds", "draft_kinds",
                "remelted", "block_remelts", "top_ids", "top_tokens")


@pytest.fixture(scope="module")
def small_doc() -> dict:
    """A valid trace document: 2 blocks of a 16-position canvas, 4 steps each, no model needed."""
    return synthetic_trace(canvas=16, steps=4, blocks=2, vocab=500).to_dict()


def assert_same_run(loaded, original):
    """`loaded` frames are `original` frames up to the trace's rounding."""
    assert len(loaded) == len(original)
    for back, frame in zip(loaded, original):
        for name in EXACT_FIELDS:
            assert getattr(back, name) == getattr(frame, name), name
        assert back.confidence == pytest.approx(frame.confidence, abs=5e-4)
        assert back.entropy == pytest.approx(frame.entropy, abs=5e-4)
        assert len(back.top_probs) == len(frame.top_probs)
        for got, want in zip(back.top_probs, frame.top_probs):
            assert got == pytest.approx(want, abs=5e-4)
        assert back.elapsed_s == pytest.approx(frame.elapsed_s, abs=1e-6)
        assert back.tokens_per_second == pytest.approx(frame.tokens_per_second, rel=1e-4)
        assert back.tokens_per_forward == pytest.approx(frame.tokens_per_forward)


@pytest.mark.slow
def test_export_then_load_gives_identical_frames(engine):
    settings = engine.recommended.replace(max_new_tokens=2 * engine.canvas_length, max_denoising_steps=3,
                                          adaptive_stopping=False)
    original = list(engine.frames("In the beginning", settings, raw=True, seed=11))
    trace = trace_of_run(engine, original, prompt="In the beginning", settings=settings, raw=True)
    again = record_trace(engine, "In the beginning", settings, raw=True, seed=11)
    assert [f.draft_ids for f in again.frames] == [f.draft_ids for f in trace.frames]  # same seed, same run
    text = trace.to_json()
    loaded = load_trace(text)
    assert loaded.frames == trace.frames  # exact: a trace's frames are the compact ones
    assert loaded.to_json() == text
    assert_same_run(loaded.frames, original)
    doc = json.loads(text)
    assert doc["version"] == TRACE_VERSION and doc["seed"] == 11 and doc["prompt"]["raw"] is True
    assert doc["model"]["name"] == "diffgemma-tiny" and doc["model"]["device"] == "cpu"
    assert doc["model"]["dtype"] == "float32"
    assert doc["prompt"]["ids"] == engine.encode_prompt("In the beginning", raw=True)[0].tolist()
    used = set(doc["prompt"]["ids"]) | {i for f in original for i in f.input_ids + f.draft_ids}
    used |= {i for f in original for row in f.top_ids for i in row}
    assert all(len(f["alternatives"]) == engine.canvas_length for f in doc["frames"])
    assert {int(k) for k in doc["tokens"]} == used
    assert all(len(str(c).split(".")[-1]) <= 3 for f in doc["frames"] for c in f["confidence"] + f["entropy"])
    assert loaded.text == engine.summarize(original[-1], len(original)).text
    assert original[0].input_kinds and set(doc["kinds"].values()) <= {"pad", "eos", "special", "byte"}


@pytest.mark.slow
def test_a_stopped_run_keeps_one_frame_per_forward(engine):
    stop = threading.Event()
    frames = []
    settings = engine.recommended.replace(max_denoising_steps=8, adaptive_stopping=False)
    for frame in engine.frames("In the beginning", settings, raw=True, seed=2, stop_event=stop):
        frames.append(frame)
        if len(frames) == 2:
            stop.set()
    assert len(frames) == 3 and frames[-1].forward_index == frames[-2].forward_index  # the engine's repeat
    trace = Trace.from_frames(frames, model=ModelInfo.of(engine), settings=settings, prompt="In the beginning",
                              raw=True, prompt_ids=[2], token_text=engine.token_text, text="")
    assert [f.forward_index for f in trace.frames] == [0, 1]
    assert trace.frames[-1].stop_reason == "cancelled" and trace.frames[-1].done
    assert load_trace(trace.to_json()).frames == trace.frames


def test_synthetic_round_trip_is_exact(small_doc):
    trace = load_trace(json.dumps(small_doc))
    assert trace.to_dict() == small_doc
    assert [f.forwards_per_block for f in trace.frames][-1] == [4, 4]
    assert trace.frames[-1].first_accepted_step == load_trace(json.dumps(small_doc)).frames[-1].first_accepted_step
    assert all(f.time_to_first_frame_s == trace.frames[0].elapsed_s for f in trace.frames)


@pytest.mark.slow
def test_a_version_1_trace_still_loads_without_alternatives(engine):
    settings = engine.recommended.replace(max_new_tokens=engine.canvas_length, max_denoising_steps=3,
                                          adaptive_stopping=False)
    trace = record_trace(engine, "In the beginning", settings, raw=True, seed=3)
    doc = trace.to_dict()
    doc["version"] = 1
    for frame in doc["frames"]:
        del frame["alternatives"]
    old = load_trace(json.dumps(doc))
    assert [f.draft_ids for f in old.frames] == [f.draft_ids for f in trace.frames]
    assert all(f.top_ids == [] and f.top_probs == [] for f in old.frames)
    assert [f.remelted for f in old.frames] == [f.remelted for f in trace.frames]  # derived from the flags


def _mutated(doc: dict, change) -> dict:
    doc = copy.deepcopy(doc)
    change(doc)
    return doc


def _set(path: str, value):
    def change(doc):
        *parents, last = path.split(".")
        target = doc
        for key in parents:
            target = target[int(key)] if key.isdigit() else target[key]
        target[int(last) if last.isdigit() else last] = value
    return change


REFUSED = {
    "wrong format": (_set("format", "something-else"), "not a DiffGemma trace"),
    "newer version": (_set("version", 3), "trace version 3 is not supported"),
    "version as text": (_set("version", "1"), "trace version '1' is not supported"),
    "version true": (_set("version", True), "trace version True is not supported"),
    "absurd canvas": (_set("model.canvas_length", 10**9), "model.canvas_length must be an integer in [1, 4096]"),
    "mismatched lengths": (lambda d: d["frames"][3]["confidence"].pop(), "frame 3: confidence has 15 entries; the "
                                                                         "canvas has 16 positions"),
    "mismatched ids": (lambda d: d["frames"][0]["input_ids"].append(1), "frame 0: input_ids has 17 entries"),
    "unknown id": (lambda d: d["frames"][1]["draft_ids"].__setitem__(0, 999_999),
                   "frame 1: draft_ids: token id 999999 has no string in tokens"),
    "negative id": (lambda d: d["frames"][1]["draft_ids"].__setitem__(0, -5), "token ids are integers in [0,"),
    "confidence above one": (lambda d: d["frames"][2]["confidence"].__setitem__(0, 7.5),
                             "frame 2: confidence: entries are numbers in [0, 1], got 7.5"),
    "accepted not 0/1": (lambda d: d["frames"][2]["accepted"].__setitem__(0, 2),
                         "frame 2: accepted: entries are 0 or 1"),
    "token string too long": (lambda d: d["tokens"].__setitem__(next(iter(d["tokens"])), "x" * 5000),
                              "is 5,000 characters; the limit is 1,000"),
    "token key not an id": (lambda d: d["tokens"].__setitem__("<script>", "x"), "tokens: keys are token ids"),
    "steps out of order": (_set("frames.1.step", 2), "frame 1: block 0 step 2 does not follow the previous frame"),
    "new block too early": (_set("frames.1.block", 1), "frame 1: block 1 step 1 does not follow"),
    "done too early": (lambda d: d["frames"][2].update(done=True, stop_reason="eos"),
                       "frame 2: marked done but more frames follow"),
    "done without reason": (lambda d: d["frames"][-1].pop("stop_reason"),
                            "a frame is done exactly when it has a stop_reason"),
    "time backwards": (_set("frames.2.elapsed_s", 0.0001), "frame 2: elapsed_s must be seconds counting up"),
    "bad settings": (_set("settings.t_min", 5.0), "settings: t_min must be below t_max"),
    "missing setting": (lambda d: d["settings"].pop("entropy_bound"), "settings: missing entropy_bound"),
    "seed out of range": (_set("seed", -1), "seed must be an integer in [0,"),
    "no frames": (_set("frames", []), "frames must be a non-empty list"),
    "unknown kind": (lambda d: d.__setitem__("kinds", {next(iter(d["tokens"])): "weird"}),
                     "must be one of text, byte, pad, eos, special, got 'weird'"),
    "kind of an unlisted id": (_set("kinds", {"999999": "eos"}), "kinds: keys are token ids listed in tokens"),
    "alternatives of another length": (_set("frames.0.alternatives", []),
                                       "frame 0: alternatives has 0 entries; the canvas has 16 positions"),
    "alternatives rising": (lambda d: d["frames"][0].__setitem__("alternatives", [
        {"ids": [i, i], "probs": [0.1, 0.5]} for i in d["frames"][0]["draft_ids"]]),
        "frame 0: alternatives[0]: probs must not increase"),
    "alternative ids unknown": (lambda d: d["frames"][0].__setitem__("alternatives", [
        {"ids": [999_999], "probs": [0.5]}] * 16), "alternatives[0].ids: token id 999999 has no string"),
    "frames not objects": (_set("frames", [1, 2]), "frame 0 must be a JSON object, got int"),
    "too many frames": (_set("frames", [{}] * 20_001), "the trace has 20,001 frames; the limit is 20,000"),
    "prompt not text": (_set("prompt.text", ["<script>"]), "prompt.text must be a string, got list"),
    "model name too long": (_set("model.name", "m" * 301), "model.name is 301 characters; the limit is 300"),
    "committed past the canvases": (lambda d: d["frames"][3]["committed_ids"].extend(d["frames"][3]["draft_ids"]),
                                    "frame 3: committed_ids has 32 ids, more than 1 canvas of 16"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_each_bad_trace_is_refused_with_its_message(small_doc, case):
    change, message = REFUSED[case]
    with pytest.raises(TraceError) as caught:
        load_trace(json.dumps(_mutated(small_doc, change)))
    assert message in str(caught.value)
    assert "\n" not in str(caught.value) and len(str(caught.value)) < 300


@pytest.mark.parametrize("text, message", [
    ("{not json", "the trace is not valid JSON: Expecting property name"),
    ('{"format": NaN}', "the trace is not valid JSON: NaN is not a number a trace may hold"),
    ("[" * 100_000 + "]" * 100_000, "the trace is not valid JSON"),
    ("[1, 2]", "the trace must be a JSON object, got list"),
    ('{"n": ' + "9" * 5000 + "}", "the trace is not valid JSON"),
    ("", "the trace file is empty (0 bytes)"),
    (" \n\t", "the trace file holds only whitespace"),
])
def test_malformed_json_is_refused(text, message):
    with pytest.raises(TraceError, match=re.escape(message)):
        load_trace(text)


def test_oversized_and_non_utf8_traces_are_refused(tmp_path):
    big = b" " * (MAX_TRACE_BYTES + 1)
    with pytest.raises(TraceError, match=r"the trace is 20\.0 MB; the limit is 20 MB"):
        load_trace(big)
    path = tmp_path / "big.json"
    path.write_bytes(big)
    with pytest.raises(TraceError, match="the limit is 20 MB"):
        load_trace(path)
    with pytest.raises(TraceError, match="not UTF-8"):
        load_trace(b'{"format": "\xff"}')
    with pytest.raises(TraceError, match="cannot read the trace file"):
        load_trace(tmp_path / "missing.json")
    empty = tmp_path / "empty.json"
    empty.write_bytes(b"")  # an upload of a 0-byte file
    with pytest.raises(TraceError, match=re.escape("the trace file is empty (0 bytes)")):
        load_trace(empty)


HOSTILE = '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=2">'


def hostile_trace() -> Trace:
    """A valid trace whose every string carries markup: tokens, prompt, text and model name."""
    doc = synthetic_trace(canvas=16, steps=3, blocks=2, vocab=300, token_text=lambda i: f"{HOSTILE}{i}").to_dict()
    doc["prompt"]["text"] = HOSTILE
    doc["text"] = HOSTILE
    doc["model"]["name"] = HOSTILE[:200]
    return load_trace(json.dumps(doc))


DATA_SCRIPT = re.compile(r'<script type="application/json" id="dg-replay-data">([^<]*)</script>')


def page_data(page: str) -> dict:
    """The data an offline replay page embeds (`engine.trace.replay_data`)."""
    return json.loads(DATA_SCRIPT.search(page).group(1))


def test_hostile_strings_load_but_reach_the_page_only_as_data():
    trace = hostile_trace()  # loaded: a vocabulary may hold markup; the player shows it as text
    assert trace.frames[0].draft_tokens[0].startswith("<script>")
    page = replay_html(trace)
    outer = re.sub(r'(<script type="application/(?:json|octet-stream)" id="dg-[\w-]+">)[^<]*', r"\1", page)
    assert "<script>window" not in outer and "<img" not in outer and "__pwned" not in outer
    assert outer.count("<script") == 3  # the data, Plotly and the player: no other script on the page
    packed = DATA_SCRIPT.search(page).group(1)
    assert "<" not in packed and "\\u003cscript>window" in packed  # inert inside its <script> element
    data = page_data(page)
    assert data["prompt"] == HOSTILE and data["text"] == HOSTILE and data["model"]["name"] == HOSTILE[:200]
    shown = {data["tokens"][i] for f in data["frames"] for i in f["draft"]}
    assert shown == {t for f in trace.frames for t in f.draft_tokens}  # kept as they are, for the player's text nodes


def test_replay_data_keeps_what_the_player_needs_exactly():
    trace = synthetic_trace(canvas=16, steps=4, blocks=2, vocab=500)
    data = replay_data(trace)
    assert len(data["frames"]) == len(trace.frames) and data["seed"] == str(trace.seed)
    assert data["prompt_tokens"] == len(trace.prompt_ids) and data["model"]["canvas_length"] == 16
    for item, frame in zip(data["frames"], trace.frames):
        assert [data["tokens"][i] for i in item["input"]] == frame.input_tokens
        assert [data["tokens"][i] for i in item["draft"]] == frame.draft_tokens
        assert [c == "1" for c in item["accepted"]] == frame.accepted
        assert [v / 1000 for v in item["confidence_milli"]] == frame.confidence  # the trace's 3 decimals, exactly
        assert [v / 1000 for v in item["entropy_milli"]] == frame.entropy
        assert (item["block"], item["step"]) == (frame.block_index, frame.step_index)
        assert item["elapsed_s"] == frame.elapsed_s
        if frame.block_done:
            assert (item["committed"], item["committed_tokens"]) == (len(frame.committed_ids), frame.committed_tokens)
    used = {i for f in trace.frames for i in (*f.input_ids, *f.draft_ids)}
    assert len(data["tokens"]) == len(used) < len(trace.tokens)  # canvas ids only, each once (not the prompt's)
    assert data["kinds"] is None  # synthetic frames carry no kinds


def test_page_json_is_inert_and_valid_utf8():
    text = script_json({"a": "</script><!--\ud800", "b": "\u00e9\U0001f600"})
    assert "<" not in text and "\\ud800" in text and "\u00e9\U0001f600" in text
    text.encode("utf-8")  # a lone surrogate would not encode
    assert json.loads(text) == {"a": "</script><!--\ud800", "b": "\u00e9\U0001f600"}


@pytest.mark.slow
def test_cli_writes_a_trace_and_its_replay(tmp_path, capsys):
    trace_path, html_path = tmp_path / "run.json", tmp_path / "run.html"
    assert main(["generate", "--prompt", "In the beginning", "--raw", "--seed", "3", "--max-new-tokens", "64",
                 "--steps", "3", "--device", "cpu", "--json", "--trace", str(trace_path)]) == 0
    result = json.loads(capsys.readouterr().out)
    trace = load_trace(trace_path)
    assert trace.seed == 3 and len(trace.frames) == result["forwards"]
    assert trace.frames[-1].committed_ids == result["token_ids"]
    assert main(["replay", str(trace_path), "--html", str(html_path)]) == 0
    page = html_path.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and len(page_data(page)["frames"]) == len(trace.frames)
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "diffgemma-trace", "version": 9}', encoding="utf-8")
    assert main(["replay", str(bad), "--html", str(tmp_path / "x.html")]) == 2
    assert "trace version 9 is not supported" in capsys.readouterr().err
    assert not (tmp_path / "x.html").exists()
