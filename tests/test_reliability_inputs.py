"""Bad input at the UI and API boundary: every rejection is one clear message (the ValueError's), never a traceback.

Three layers are checked: the validation functions directly (`diffgemma_ui.validation`, `engine.DiffusionSettings`,
`engine.parse_seed`), the live UI's checks (`PlaygroundTab.request_run`, `apply_preset`), and the served `/generate`
API through `gradio_client` and raw HTTP (what gradio_client refuses to send: NaN, infinities, lone surrogates).
Hypothesis explores the settings and seed space against a small reference of what must be accepted. Unusual but
valid text (control characters, lone surrogates, right-to-left, emoji, markup) is accepted and runs.

Every distinct bad input tried is recorded in `BAD_INPUTS`; the count is printed when the module ends (`-s`).
"""

from __future__ import annotations

import json
import math
from html.parser import HTMLParser

import gradio as gr
import httpx
import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from diffgemma_ui import meter
from diffgemma_ui.hub import RUN_INPUT_NAMES, Hub
from diffgemma_ui.playground_tab import PlaygroundTab
from diffgemma_ui.validation import (MAX_PROMPT_CHARS, PRESET_FIELDS, build_request, build_settings, check_prompt,
                                     parse_run, preset_values)
from engine import PRESET_NAMES, DiffusionSettings
from engine.settings import MAX_SEED, RANGES, parse_flag, parse_seed, spec
from engine.settings import SETTING_NAMES as ALL_SETTING_NAMES
from synthetic import canvas_html

SETTING_NAMES = tuple(name for name in ALL_SETTING_NAMES if spec(name).kind is not bool)  # the numeric ones

pytestmark = pytest.mark.slow

# prompt, raw, max_new_tokens, max_denoising_steps, entropy_bound, t_min, t_max, stability_threshold,
# confidence_threshold, adaptive_stopping, seed (the API's order)
GOOD = ["In the beginning", True, 64, 2, 0.5, 0.4, 0.8, 1, 0.05, True, 5]
INDEX = {name: i for i, name in enumerate(
    ["prompt", "raw", *SETTING_NAMES, "adaptive_stopping", "seed"])}
UI_MAX_NEW_TOKENS = spec("max_new_tokens").ui_high  # the page's slider tops
UI_MAX_DENOISING_STEPS = spec("max_denoising_steps").ui_high
MAX_MESSAGE_CHARS = 300  # a clear message is one short line
BAD_INPUTS: set[str] = set()  # every distinct bad input tried, as "field=repr(value)"


def note_bad(field: str, value) -> None:
    """Record one bad input (the count is printed at the end of the module)."""
    BAD_INPUTS.add(f"{field}={value!r:.200}")


@pytest.fixture(scope="module", autouse=True)
def report_bad_input_count():
    """Print how many distinct bad inputs this module tried (run pytest with -s to see it)."""
    yield
    print(f"\n[reliability] distinct bad inputs tried: {len(BAD_INPUTS)}")


@pytest.fixture(scope="module")
def client(served_app):
    api_client = Client(served_app[1], verbose=False)
    yield api_client
    api_client.close()


def with_value(field: str, value) -> list:
    """The GOOD arguments with one field replaced."""
    args = list(GOOD)
    args[INDEX[field]] = value
    return args


def by_name(args) -> dict:
    """A run's inputs (`GOOD`'s order) by name, as the hub's door takes them."""
    return dict(zip(RUN_INPUT_NAMES, args))


def validation_message(hub: Hub, args) -> str:
    """The ValueError message that the served API's own checks give for `args` (API limits); fails if none."""
    try:
        hub.request(by_name(args), ui_limits=False)
    except ValueError as error:
        return str(error)
    raise AssertionError(f"expected {args!r} to be rejected")


def assert_clear(message: str) -> None:
    """One short line, no traceback, no Python internals."""
    assert message and len(message) <= MAX_MESSAGE_CHARS, message
    assert "\n" not in message and "Traceback" not in message and 'File "' not in message, message
    assert "upstream Gradio app has raised an exception" not in message, message  # Gradio's generic text


def emoji_prompt_over_context(engine, new_tokens: int) -> str:
    """A prompt under the UI's character limit whose tokens plus `new_tokens` exceed the model's context."""
    for unit in ("\U0001f600", "\u00e9\u4e2d\U0001f3b2", "\u05e9\u05dc\u05d5\u05dd "):
        prompt = unit * (MAX_PROMPT_CHARS // len(unit))
        if engine.encode_prompt(prompt, raw=True).shape[1] + new_tokens > engine.context_limit:
            return prompt
    pytest.skip("this tokenizer packs every candidate prompt below the context limit")


# -- the validation functions directly -------------------------------------------------------------------------------
BAD_PROMPTS = [
    ("", "prompt is empty"), ("   ", "prompt is empty"),
    ("\n\t \r\n", "prompt is empty"), ("\u3000", "prompt is empty"),
    (None, "prompt is empty"), (123, "prompt must be text"), (["a"], "prompt must be text"),
    ({"text": "a"}, "prompt must be text"), (b"bytes", "prompt must be text"),
    ("x" * (MAX_PROMPT_CHARS + 1), f"the limit here is {MAX_PROMPT_CHARS:,}"),
]


@pytest.mark.parametrize("prompt, message", BAD_PROMPTS, ids=[f"p{i}" for i in range(len(BAD_PROMPTS))])
def test_bad_prompts_are_rejected_with_a_clear_message(prompt, message):
    note_bad("prompt", prompt)
    with pytest.raises(ValueError) as info:
        check_prompt(prompt)
    assert message in str(info.value)
    assert_clear(str(info.value))


def test_prompt_over_the_model_context_names_the_limit(engine):
    hub = Hub(engine)
    limit = f"{engine.context_limit:,}"
    with pytest.raises(ValueError, match=f"context of {limit} tokens") as info:
        engine.check_budget(engine.context_limit, DiffusionSettings(max_new_tokens=1))
    assert_clear(str(info.value))
    prompt = emoji_prompt_over_context(engine, 64)
    note_bad("prompt", prompt)
    parse_run(by_name([prompt, *GOOD[1:]]), ui_limits=True)  # under the character limit: passes the UI check
    with pytest.raises(ValueError, match=f"context of {limit} tokens") as info:
        hub.request(by_name([prompt, *GOOD[1:]]), ui_limits=True)
    assert_clear(str(info.value))
    with pytest.raises(gr.Error, match=f"context of {limit} tokens"):  # the live UI says the same
        PlaygroundTab(hub).request_run(None, prompt, *GOOD[1:])


def bad_setting_values() -> list[tuple[str, object]]:
    """(setting, value) pairs that are invalid for the API and the UI alike."""
    pairs = []
    junk = [None, "", "  ", "lots", "1,5", "0x10", True, False, [64], {"v": 1}, float("nan"), float("inf"),
            float("-inf"), "nan", "inf", "-Infinity", "1e400", 10**400, -(10**400), "9" * 5000]
    for name in SETTING_NAMES:
        low, high, low_inclusive, integer = RANGES[name]
        pairs += [(name, value) for value in junk]
        pairs += [(name, high + 1), (name, high * 10 + 0.5), (name, -1), (name, low - 1e-9)]
        if not low_inclusive:
            pairs.append((name, low))
        if integer:
            pairs += [(name, low + 0.5), (name, "2.5")]
    return pairs


BAD_SETTINGS = bad_setting_values()


def test_bad_settings_are_rejected_naming_the_setting():
    good = dict(zip(SETTING_NAMES, GOOD[2:9]), adaptive_stopping=True)
    for name, value in BAD_SETTINGS:
        note_bad(name, value)
        with pytest.raises(ValueError) as info:
            build_settings({**good, name: value}, ui_limits=False)
        assert str(info.value).startswith(name), (name, value, str(info.value))
        assert_clear(str(info.value))
    assert len(BAD_SETTINGS) > 150


@pytest.mark.parametrize("t_min, t_max", [(0.8, 0.8), (0.9, 0.8), (2.0, 0.01), ("0.5", "0.5")])
def test_t_min_must_be_below_t_max(t_min, t_max):
    note_bad("t_min/t_max", (t_min, t_max))
    values = dict(zip(SETTING_NAMES, GOOD[2:9]), adaptive_stopping=True, t_min=t_min, t_max=t_max)
    with pytest.raises(ValueError, match="t_min must be below t_max"):
        build_settings(values)


def test_ui_caps_apply_to_the_live_ui_only():
    values = dict(zip(SETTING_NAMES, GOOD[2:9]), adaptive_stopping=True)
    for name, cap in (("max_new_tokens", UI_MAX_NEW_TOKENS), ("max_denoising_steps", UI_MAX_DENOISING_STEPS)):
        note_bad(f"{name} (UI)", cap + 1)
        with pytest.raises(ValueError, match=f"{name} must be at most {cap} here"):
            build_settings({**values, name: cap + 1})
        assert getattr(build_settings({**values, name: cap + 1}, ui_limits=False), name) == cap + 1


BAD_FLAGS = [None, "maybe", "yes", "1.0", 2, -1, 0.5, [True], {}]


def test_bad_flags():
    for value in BAD_FLAGS:
        note_bad("raw/adaptive_stopping", value)
        with pytest.raises(ValueError, match="raw must be true or false"):
            parse_flag("raw", value)


BAD_SEEDS = [-2, -7, 2.5, -1.5, "-1.5", 2**63, 2**64, 10**400, "abc", "1e3", "0x10", True, False, [1], {"s": 1},
             float("nan"), float("inf"), float("-inf"), "nan", "inf", "x" * 100_000]


def test_bad_seeds_are_rejected_with_a_short_message():
    for seed in BAD_SEEDS:
        note_bad("seed", seed)
        with pytest.raises(ValueError) as info:
            parse_seed(seed)
        assert str(info.value).startswith("seed must be an integer"), (seed, str(info.value))
        assert_clear(str(info.value))  # a 100,000-character seed is echoed cut short


BAD_PRESETS = ["turbo", "", "RECOMMENDED", " fast", None, 3, ["fast"], "<script>alert(1)</script>"]


def test_unknown_presets_are_rejected_and_the_ui_keeps_its_sliders(engine):
    tab = PlaygroundTab(Hub(engine))
    for name in BAD_PRESETS:
        note_bad("preset", name)
        with pytest.raises(ValueError, match="unknown preset") as info:
            preset_values(name, engine.recommended)
        assert all(p in str(info.value) for p in PRESET_NAMES)
        with pytest.warns(UserWarning, match="unknown preset"):  # gr.Warning outside a request warns
            outputs = tab.apply_preset(name)
        assert len(outputs) == len(PRESET_FIELDS)
        assert all(isinstance(o, dict) and o.get("__type__") == "update" and len(o) == 1 for o in outputs), outputs
    for name in PRESET_NAMES:
        values = preset_values(name, engine.recommended)
        assert build_settings({"max_new_tokens": 64, **values}) is not None
        assert "max_new_tokens" not in values  # a preset never changes the answer's length
    assert all(isinstance(o, dict) and o.get("__type__") == "update" for o in tab.apply_preset("custom"))


UNUSUAL_PROMPTS = [
    "a\x00b\x01\x07\x1b[31m red \x7f",  # control characters, an ANSI escape
    "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd \u0645\u0631\u062d\u0628\u0627",  # Hebrew and Arabic (RTL)
    "\u202eevil\u202c \u2066isolate\u2069 a\u200bb\ufeff",  # bidi override/isolate, zero-width, BOM
    "\U0001f600\U0001f3b2\U0001f44d\U0001f3fd \U0001f468\u200d\U0001f469\u200d\U0001f467",  # emoji, ZWJ sequence
    "<script>alert(1)</script> <img src=x onerror=alert(1)> \"><svg onload=alert(1)> javascript:alert(1)",
    "e\u0301\u0301\u0301 Z\u0336\u0337 \r\n\t end",  # combining marks, CR LF, tab
]


@pytest.mark.parametrize("prompt", UNUSUAL_PROMPTS + ["lone \ud800 high and \udfff low surrogates"])
def test_unusual_text_is_accepted(engine, prompt):
    request = build_request(prompt, True, dict(zip(SETTING_NAMES, GOOD[2:9])), 5)
    assert request.prompt == prompt  # kept as typed
    ids = engine.encode_prompt(prompt, raw=True)  # lone surrogates become U+FFFD, nothing raises
    assert ids.shape[0] == 1 and ids.shape[1] >= 1


# -- hypothesis: the settings and seed space -------------------------------------------------------------------------
def _as_number(value):
    """What the boundary treats as a number: int/float (not bool), or a string float() accepts; else None."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, str) and value.strip():
        try:
            return float(value.strip())
        except ValueError:
            return None
    return None


def _expected_valid(values: dict, ui_limits: bool) -> bool:
    """Reference: every setting a finite number in its range (integral where required) and t_min < t_max."""
    numbers = {}
    for name in SETTING_NAMES:
        number = _as_number(values[name])
        if number is None:
            return False
        try:
            if not math.isfinite(number):
                return False
        except OverflowError:
            return False
        low, high, low_inclusive, integer = RANGES[name]
        if integer and number != int(number):
            return False
        if number > high or number < low or (number == low and not low_inclusive):
            return False
        numbers[name] = number
    if ui_limits and (numbers["max_new_tokens"] > UI_MAX_NEW_TOKENS
                      or numbers["max_denoising_steps"] > UI_MAX_DENOISING_STEPS
                      or any(numbers[name] > (spec(name).ui_high or math.inf) for name in SETTING_NAMES)):
        return False
    return numbers["t_min"] < numbers["t_max"]


def setting_value(name: str):
    """Values for one setting: mostly in and around its range, plus non-finite, huge, textual and junk values."""
    low, high, _, integer = RANGES[name]
    span = high - low
    near = (st.integers(int(low) - 3, int(high) + 3) if integer
            else st.floats(low - 0.1 * span, high + 0.1 * span, allow_nan=False))
    return st.one_of(
        near, near, near,
        st.floats(allow_nan=True, allow_infinity=True),
        st.integers(-(10**30), 10**30),
        near.map(str),
        st.sampled_from(["", " ", "abc", "nan", "-inf", "1e999", "1_0", " 7 ", "0x1"]),
        st.sampled_from([None, True, False, [], {}]),
    )


SETTINGS_SPACE = st.fixed_dictionaries({name: setting_value(name) for name in SETTING_NAMES})


@settings(max_examples=400, deadline=None)
@given(values=SETTINGS_SPACE, ui_limits=st.booleans(), adaptive=st.sampled_from([True, False, "true", 1, "x", None]))
def test_settings_space_matches_the_reference(values, ui_limits, adaptive):
    """Accepted exactly when the reference says so; a rejection is a short ValueError naming what is wrong."""
    expected = _expected_valid(values, ui_limits) and adaptive in (True, False, "true", 1)
    try:
        result = build_settings({**values, "adaptive_stopping": adaptive}, ui_limits=ui_limits)
    except ValueError as error:
        message = str(error)
        assert not expected, (values, message)
        named = message.split(" ")[0]
        assert named in (*SETTING_NAMES, "adaptive_stopping"), message
        assert_clear(message)
        note_bad(named, values.get(named, adaptive))
        return
    assert expected, (values, result)
    for name in SETTING_NAMES:
        value = getattr(result, name)
        low, high, low_inclusive, integer = RANGES[name]
        assert type(value) is (int if integer else float)
        assert (low <= value if low_inclusive else low < value) and value <= high
        assert value == pytest.approx(_as_number(values[name]))
    assert result.t_min < result.t_max and isinstance(result.adaptive_stopping, bool)


@settings(max_examples=300, deadline=None)
@given(seed=st.one_of(st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True),
                      st.integers(-5, 2**63 + 5).map(str), st.text(max_size=30),
                      st.sampled_from([None, True, False, [], "-1", -1.0, " 12 "])))
def test_seed_space(seed):
    """A seed is None (random: None, "", -1), an int in [0, 2**63 - 1] equal to the input, or a short ValueError."""
    try:
        result = parse_seed(seed)
    except ValueError as error:
        note_bad("seed", seed)
        assert str(error).startswith("seed must be an integer")
        assert_clear(str(error))
        return
    if result is None:
        assert seed is None or (isinstance(seed, str) and (not seed.strip() or float(seed) == -1)) or seed == -1
        return
    assert isinstance(result, int) and 0 <= result <= MAX_SEED
    assert result == (int(seed.strip()) if isinstance(seed, str) else seed)


# -- the served /generate API ----------------------------------------------------------------------------------------
API_BAD = (
    [("prompt", p) for p, _ in BAD_PROMPTS if not isinstance(p, bytes)]
    + [("raw", v) for v in (None, "maybe", 2, [True])]
    + [("max_new_tokens", v) for v in (0, -5, 4097, 1.5, "lots", "", None, True, [64], {}, "nan", "inf", "-inf",
                                       "1e400", 10**400, "9" * 5000)]
    + [("max_denoising_steps", v) for v in (0, 513, -1, 2.5, "x")]
    + [("entropy_bound", v) for v in (0, -1.0, 1000.5, "nan")]
    + [("t_min", v) for v in (-0.1, 10.5, "abc", 0.8, 0.9)]
    + [("t_max", v) for v in (0, 10.01, 0.4, 0.1)]
    + [("stability_threshold", v) for v in (-1, 65, 0.5)]
    + [("confidence_threshold", v) for v in (0, -0.01, 100.5)]
    + [("adaptive_stopping", v) for v in ("yes", None, 2)]
    + [("seed", v) for v in (-2, 2.5, 2**63, 2**64, "abc", "1e3", True, [1], "x" * 100_000, 10**400, "inf")]
)


def assert_api_refuses(client, hub: Hub, args) -> None:
    """`/generate` called with `args` fails with exactly the validation message of the API's own checks, clear."""
    expected = validation_message(hub, args)
    with pytest.raises(AppError) as info:
        client.predict(*args, api_name="/generate")
    assert str(info.value) == expected
    assert_clear(str(info.value))


@pytest.mark.parametrize("field, value", API_BAD, ids=[f"{f}-{i}" for i, (f, _) in enumerate(API_BAD)])
def test_api_rejects_bad_input_with_the_validation_message(client, served_app, field, value):
    note_bad(field, value)
    assert_api_refuses(client, served_app[0].hub, with_value(field, value))


def test_api_rejects_a_prompt_over_the_context_with_the_limit(client, served_app, engine):
    prompt = emoji_prompt_over_context(engine, 64)
    note_bad("prompt", prompt)
    with pytest.raises(AppError, match=f"context of {engine.context_limit:,} tokens") as info:
        client.predict(*with_value("prompt", prompt), api_name="/generate")
    assert_clear(str(info.value))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_api_bad_settings_space(client, served_app, data):
    """Hypothesis picks a setting and a value outside its range: the API answers with the validation message."""
    name = data.draw(st.sampled_from(SETTING_NAMES))
    low, high, low_inclusive, _ = RANGES[name]
    value = data.draw(st.one_of(
        st.floats(high, 1e12, exclude_min=True, allow_nan=False),
        st.floats(-1e12, low, exclude_max=low_inclusive, allow_nan=False),
        st.text(alphabet="abcxyz!?<>&", min_size=1, max_size=12),
    ))
    note_bad(name, value)
    assert_api_refuses(client, served_app[0].hub, with_value(name, value))


def call_raw(url: str, body: str, timeout: float = 120.0) -> tuple[str, object]:
    """POST a raw JSON body to Gradio's REST API for /generate; returns (event, data) from its event stream."""
    posted = httpx.post(f"{url}gradio_api/call/generate", content=body.encode("utf-8"),
                        headers={"content-type": "application/json"}, timeout=timeout)
    assert posted.status_code == 200, posted.text
    event_id = posted.json()["event_id"]
    stream = httpx.get(f"{url}gradio_api/call/generate/{event_id}", timeout=timeout).text
    event = data = None
    for line in stream.splitlines():
        if line.startswith("event:"):
            event = line.split(":", 1)[1].strip()
        elif line.startswith("data:") and event in ("complete", "error"):
            data = json.loads(line.split(":", 1)[1])
            break
    return event, data


@pytest.mark.parametrize("index, literal, message", [
    (2, "NaN", "max_new_tokens must be a finite number"),
    (4, "Infinity", "entropy_bound must be a finite number"),
    (6, "-Infinity", "t_max must be a finite number"),
    (10, "NaN", "seed must be an integer"),
])
def test_raw_http_non_finite_numbers_are_clear_errors(served_app, index, literal, message):
    """JSON extensions that gradio_client will not send (NaN, Infinity) still get the validation message."""
    note_bad(f"raw-http[{index}]", literal)
    items = [json.dumps(v) for v in GOOD]
    items[index] = literal
    event, data = call_raw(served_app[1], '{"data": [' + ", ".join(items) + "]}")
    assert event == "error" and data["error"].startswith(message), (event, data)
    assert_clear(data["error"])


def test_raw_http_lone_surrogates_are_accepted(served_app):
    """A JSON-escaped lone surrogate (invalid UTF-16 that gradio_client cannot encode) runs like any prompt."""
    body = json.dumps({"data": ["lone \ud800 and \udfff surrogates", *GOOD[1:]]}, ensure_ascii=True)
    assert "\\ud800" in body
    event, data = call_raw(served_app[1], body)
    assert event == "complete", data
    text, summary = data
    text.encode("utf-8")  # the answer is valid text
    assert summary["seed"] == GOOD[-1] and summary["token_ids"]


@pytest.mark.parametrize("prompt", UNUSUAL_PROMPTS)
def test_api_accepts_unusual_text(client, prompt):
    text, summary = client.predict(*with_value("prompt", prompt), api_name="/generate")
    assert isinstance(text, str) and text.encode("utf-8")
    assert summary["stop_reason"] in ("eos", "max_new_tokens") and summary["token_ids"]
    assert summary["prompt_tokens"] >= 1


class _Tags(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def test_a_real_run_on_hostile_text_renders_escaped(engine):
    """Frames of a real run on markup/bidi/control text render to HTML with only the view's own markup."""
    frames = list(engine.frames(UNUSUAL_PROMPTS[4] + UNUSUAL_PROMPTS[2] + UNUSUAL_PROMPTS[0], DiffusionSettings(
        max_new_tokens=64, max_denoising_steps=2), raw=True, seed=3))
    html = canvas_html([frames[-1]], frames[0]) + meter.meter_html(frames[-1])
    parser = _Tags()
    parser.feed(html)
    assert {tag for tag, _ in parser.tags} <= {"div", "section", "header", "span", "p", "b", "wbr"}
    assert not any(name.startswith("on") or name in ("href", "src") for _, attrs in parser.tags for name in attrs)
