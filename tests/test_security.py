"""Safety: no remote code, the operator alone picks the model, no web-supplied path is opened, model text is escaped.

- `load_model` passes `trust_remote_code=False` to every transformers loader, and no source file sets it otherwise.
- The served app takes no model, path or file from the web: `/generate` is the only public endpoint and has none
  of those parameters, no component accepts files, and extra request fields change nothing.
- A Python audit hook watches every file-system event while path-like values travel through the API and Gradio's
  file route: the sentinel file they name is never touched.
- Every model-produced string is escaped before it reaches HTML or a Plotly label: hostile tokens go through every
  view builder (canvas, stack, chips, meter, plots' hover text and titles, status line, header, Chat's live
  render); the Playground's feed carries them as JSON data with no markup, and in the real page in Chromium no markup
  from a token becomes an element or runs.
"""

from __future__ import annotations

import dataclasses
import html
import json
import re
import sys
import threading
import uuid
from pathlib import Path

import httpx
import pytest
import transformers
from gradio_client import Client
from gradio_client.exceptions import AppError

from diffgemma_ui import canvas_view, meter, plots
from diffgemma_ui.blocks import header_html
from diffgemma_ui.canvas_view import thought_html
from diffgemma_ui.hub import Hub
from diffgemma_ui.live_view import render, status_text
from diffgemma_ui.playground_tab import PlaygroundTab
from diffgemma_ui.runs import RunRecord
from diffgemma_ui.session import SessionState
from diffgemma_ui.text import plain_text, visible_token
from diffgemma_ui.validation import RunRequest
from engine import DEFAULT_MODEL, DiffusionSettings, Frame, GenerationResult, ModelLoadError, load_model
from pages import set_number
from synthetic import ListTokenText, StubModel, canvas_html, parse_html, synthetic_frame

REPO = Path(__file__).resolve().parent.parent
HOSTILE = [
    "<script>alert(1)</script>",
    "<img src=x onerror=alert(1)>",
    '"><svg onload=alert(1)>',
    "javascript:alert(1)",
    "'><iframe src=javascript:alert(1)></iframe>",
    '<a href="javascript:alert(1)">x</a>',
    "</span></div><script>alert(2)</script>",
    "<style>*{display:none}</style>",
    "${alert(3)}",
    "{{7*7}}",
    "&lt;script&gt;",
    "<br><b>bold</b><extra>x</extra>",
    "%{x}",
    "\u202e<img src=y onerror=alert(4)>",
    "\x00<script>",
    "`backtick`",
]
N = len(HOSTILE)  # canvas length of the synthetic frames: one position per hostile token
VIEW_TAGS = {"div", "section", "header", "span", "p", "b", "wbr", "h1"}  # the views' own markup
URL_ATTRIBUTES = {"href", "src", "action", "formaction", "srcdoc", "xlink:href", "data", "poster", "background"}


# -- remote code -----------------------------------------------------------------------------------------------------
def test_load_model_never_trusts_remote_code(monkeypatch):
    """Every transformers loader `load_model` calls gets trust_remote_code=False (for a folder and for a hub id)."""
    calls = []

    def spy(owner, name):
        original = getattr(owner, name)

        def loader(*args, **kwargs):
            calls.append((f"{owner.__name__}.{name}", kwargs.get("trust_remote_code", "<not passed>")))
            return original(*args, **kwargs)

        monkeypatch.setattr(owner, name, loader)

    for owner in (transformers.AutoConfig, transformers.AutoTokenizer, transformers.DiffusionGemmaForBlockDiffusion):
        spy(owner, "from_pretrained")
    load_model(DEFAULT_MODEL, device="cpu")
    assert {name for name, _ in calls} == {"AutoConfig.from_pretrained", "AutoTokenizer.from_pretrained",
                                           "DiffusionGemmaForBlockDiffusion.from_pretrained"}
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError):
        load_model("no-such-org/no-such-model", device="cpu")  # a hub id: same flags, then fails offline
    assert len(calls) >= 4 and all(value is False for _, value in calls), calls


REMOTE_CODE = re.compile(r"""trust_remote_code["']?\s*(?:=|:)\s*([^,)\s}\]`'"]+)""")
REMOTE_CODE_KEY = "trust_remote_" + "code"  # spelled so that this file's own hostile request is not a finding


def remote_code_settings(text: str) -> list[str]:
    """Every value assigned to trust_remote_code in `text` (keyword argument or mapping entry)."""
    return REMOTE_CODE.findall(text)


def test_the_scanner_finds_any_setting_but_false():
    key = "trust_remote_code"
    assert remote_code_settings(f"f(x, {key}=True)") == ["True"]
    assert remote_code_settings(f'{{"{key}": 1}}') == ["1"]
    assert remote_code_settings(f"f({key} = flag)") == ["flag"]
    assert remote_code_settings(f"f({key}=False, y=1)") == ["False"]


def test_no_source_file_enables_remote_code():
    sources = [p for p in REPO.rglob("*.py") if ".git" not in p.parts and "site-packages" not in p.parts]
    assert len(sources) > 20
    offenders = {}
    for path in sources:
        values = [v for v in remote_code_settings(path.read_text(encoding="utf-8", errors="replace")) if v != "False"]
        if values:
            offenders[str(path.relative_to(REPO))] = values
    assert not offenders, f"trust_remote_code set to something other than False: {offenders}"


# -- the model is the operator's choice ------------------------------------------------------------------------------
FORBIDDEN_PARAMETER = re.compile(r"model|path|file|dir|url|checkpoint|source|repo|weights|device", re.I)
FILE_COMPONENTS = {"file", "uploadbutton", "image", "audio", "video", "model3d", "gallery", "fileexplorer",
                   "imageeditor", "simpleimage", "annotatedimage", "multimodaltextbox", "dataframe"}


@pytest.fixture(scope="module")
def client(served_app):
    api_client = Client(served_app[1], verbose=False)
    yield api_client
    api_client.close()


def test_the_api_offers_no_model_path_or_file(client, served_app):
    app, _ = served_app
    api = client.view_api(return_format="dict", print_info=False)
    assert set(api["named_endpoints"]) == {"/generate", "/race", "/export", "/chat", "/infill"}
    assert not api["unnamed_endpoints"]
    assert len(api["named_endpoints"]["/generate"]["parameters"]) == 11
    for endpoint in api["named_endpoints"].values():
        for parameter in endpoint["parameters"]:
            assert not FORBIDDEN_PARAMETER.search(parameter["parameter_name"]), parameter
            assert parameter["python_type"]["type"] in ("str", "bool", "int", "float"), parameter
    config = app.get_config_file()
    # The one component that takes a file is the trace upload (its content is checked by engine.trace.load_trace;
    # no path a user types is ever opened), and no API endpoint takes one
    takes_files = [c for c in config["components"] if c["type"] in FILE_COMPONENTS]
    assert [c["props"].get("elem_id") for c in takes_files] == ["dg-upload-trace"], takes_files
    assert takes_files[0]["props"].get("file_types") == [".json"]
    public = [d for d in config["dependencies"] if d["api_visibility"] == "public"]
    assert sorted(d["api_name"] for d in public) == ["chat", "export", "generate", "infill", "race"]


def test_extra_request_fields_cannot_change_the_model(served_app, engine):
    app, url = served_app
    before = (app.hub.engine, engine.source, engine.model)
    body = {"data": ["In the beginning", True, 64, 2, 0.5, 0.4, 0.8, 1, 0.05, True, 3, "/tmp/evil-model", "org/x"],
            "model": "/tmp/evil-model", "model_path": "org/evil", REMOTE_CODE_KEY: True, "fn_index": 0}
    posted = httpx.post(f"{url}gradio_api/call/generate", json=body, timeout=60)
    assert posted.status_code == 200
    answer = httpx.get(f"{url}gradio_api/call/generate/{posted.json()['event_id']}", timeout=120).text
    assert "event: complete" in answer, answer
    assert (app.hub.engine, engine.source, engine.model) == before
    assert Path(engine.source).resolve() == DEFAULT_MODEL.resolve()


# -- no path from a web user is ever opened --------------------------------------------------------------------------
_WATCH = {"token": None, "events": []}
_WATCH_LOCK = threading.Lock()
_FS_EVENTS = ("open", "os.", "shutil.", "glob.", "pathlib.", "io.open")


def _audit(event: str, args: tuple) -> None:
    token = _WATCH["token"]
    if token is None or not event.startswith(_FS_EVENTS):
        return
    try:
        text = " ".join(a.decode("utf-8", "replace") if isinstance(a, bytes) else str(a) for a in args)
    except Exception:  # noqa: BLE001 - an audit hook must never raise
        return
    if token in text:
        with _WATCH_LOCK:
            _WATCH["events"].append((event, text[:200]))


_HOOKED = []


def watch_file_system(token: str) -> None:
    """Record every file-system audit event whose arguments mention `token` (one hook per process, gated)."""
    if not _HOOKED:
        sys.addaudithook(_audit)
        _HOOKED.append(True)
    _WATCH["events"] = []
    _WATCH["token"] = token


def test_no_file_path_from_a_web_user_is_ever_opened(client, served_app, tmp_path):
    _, url = served_app
    token = f"sentinel-{uuid.uuid4().hex}"
    secret = tmp_path / f"{token}.txt"
    secret.write_text("TOP SECRET " + token)
    folder = tmp_path / f"{token}-model"
    folder.mkdir()
    good = ["In the beginning", True, 64, 2, 0.5, 0.4, 0.8, 1, 0.05, True, 3]
    paths = [str(secret), f"file://{secret}", str(folder), f"{secret}/../{secret.name}"]
    watch_file_system(token)
    try:
        answers = []
        for path in paths:
            answers.append(client.predict(path, *good[1:], api_name="/generate")[0])  # a path as the prompt: text
            for index in (1, 2, 4, 10):  # a path where a flag, a number or the seed belongs: rejected
                args = list(good)
                args[index] = path
                with pytest.raises(AppError):
                    client.predict(*args, api_name="/generate")
        # A Gradio FileData naming the file, sent raw (gradio_client would upload it from this, its own, process)
        file_data = {"path": str(secret), "orig_name": secret.name, "meta": {"_type": "gradio.FileData"}}
        posted = httpx.post(f"{url}gradio_api/call/generate", json={"data": [file_data, *good[1:]]}, timeout=30)
        if posted.status_code == 200:
            stream = httpx.get(f"{url}gradio_api/call/generate/{posted.json()['event_id']}", timeout=60).text
            assert "event: error" in stream and token not in stream, stream
        for path in paths[:1]:
            response = httpx.get(f"{url}gradio_api/file={path}", timeout=30)
            assert response.status_code in (403, 404) and "TOP SECRET" not in response.text
        events = list(_WATCH["events"])
    finally:
        _WATCH["token"] = None
    assert not events, f"the server touched a path a web user sent: {events}"
    assert all("TOP SECRET" not in answer for answer in answers)


def test_the_audit_hook_sees_opens():
    """The watch above can fail: it records an open of the watched path."""
    token = f"sentinel-{uuid.uuid4().hex}"
    watch_file_system(token)
    try:
        with pytest.raises(FileNotFoundError):
            open(f"/nonexistent/{token}")  # noqa: SIM115
        events = list(_WATCH["events"])
    finally:
        _WATCH["token"] = None
    assert events and events[0][0] == "open"


# -- every model-produced string is escaped --------------------------------------------------------------------------
def hostile_frame(step=0, block=0, *, accepted=None, **changes) -> Frame:
    """A synthetic frame whose every token (input and draft) is hostile text."""
    accepted = accepted if accepted is not None else [i % 2 == 0 for i in range(N)]
    return synthetic_frame(
        N, list(HOSTILE), step=step, block=block, accepted=accepted, input_tokens=list(reversed(HOSTILE)),
        committed=list(range(N * block + N // 2)), max_denoising_steps=4, forwards_per_block=[4] * block, **changes)


def assert_inert_html(fragment: str, *, shows: list[str] = ()) -> None:
    """`fragment` has only the views' own tags, no event handler or URL attribute, no script-like style, and the
    hostile strings in `shows` appear as text (escaped, not dropped)."""
    lower = fragment.lower()
    for raw in ("<script", "<img", "<svg", "<iframe", "<a ", "<style", "<extra", "${", "{{"):
        assert raw not in lower, (raw, fragment[:300])
    collected = parse_html(fragment)
    for tag, attrs in collected.tags:
        assert tag in VIEW_TAGS, (tag, attrs)
        for name, value in attrs.items():
            assert not name.startswith("on") and name not in URL_ATTRIBUTES, (tag, name, value)
            if name == "style":
                assert re.fullmatch(r"[\w\s:;#(),.%-]*", value or "") and "url(" not in value, value
    text = "".join(collected.text + collected.attribute_values)
    for token in shows:
        assert visible_token(token) in text, token


PLOTLY_OWN_MARKUP = ("<br>", "<extra></extra>")


def plot_strings(value) -> list[str]:
    """Every string inside a Plotly figure dict."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in plot_strings(v)]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in plot_strings(v)]
    return []


def assert_inert_plot(figure, *, shows: list[str] = ()) -> None:
    """No markup but Plotly's own line breaks and <extra>; hostile tokens appear (escaped) in the hover text."""
    json.loads(figure.to_json())  # valid JSON, as sent to the browser
    strings = plot_strings(dict(figure))
    for s in strings:
        stripped = s
        for own in PLOTLY_OWN_MARKUP:
            stripped = stripped.replace(own, "")
        assert "<" not in stripped and ">" not in stripped, s
    decoded = html.unescape("\n".join(s.replace("<br>", "\n") for s in strings))
    for token in shows:  # hover texts show tokens with visible whitespace; titles show text as it is
        assert visible_token(token) in decoded or token in decoded, token


def test_chips_escape_every_hostile_token_in_text_and_tooltip():
    for token in HOSTILE:
        for kind in ("accepted", "noisy", "committed", "pad"):
            chip = canvas_view.chip_html(token, kind=kind, position=3, confidence=0.5, entropy=1.0,
                                         first_accepted_step=1, draft=token)
            assert_inert_html(chip, shows=[token])


def test_canvas_blocks_stack_and_status_are_inert():
    live = hostile_frame(step=2, block=1)
    finished = [hostile_frame(step=3, block=0, block_done=True),
                hostile_frame(step=1, block=1, block_done=True, accepted=[True] * N)]
    status = status_text(None, RuntimeError(HOSTILE[0] + HOSTILE[2]))
    assert_inert_html(canvas_view.block_html(live, live=True), shows=HOSTILE)
    assert_inert_html(canvas_view.block_html(finished[0], live=False), shows=HOSTILE)
    assert_inert_html(canvas_html(finished, live, status=status), shows=HOSTILE + [HOSTILE[0]])
    cancelled = hostile_frame(step=2, done=True, stop_reason="cancelled")
    assert_inert_html(canvas_html([], cancelled, status=status_text(cancelled)))
    for name in ("stack_html", "live_html"):  # newer split views, where present
        builder = getattr(canvas_view, name, None)
        if builder is None:
            continue
        out = builder(finished) if name == "stack_html" else builder(live, status=status)
        assert_inert_html(out, shows=HOSTILE)


def test_meter_and_header_are_inert():
    for frame in (hostile_frame(), hostile_frame(done=True, stop_reason=HOSTILE[1]),
                  hostile_frame(done=True, stop_reason="eos")):
        assert_inert_html(meter.meter_html(frame))
    assert_inert_html(meter.meter_html(hostile_frame(done=True, stop_reason=HOSTILE[0])), shows=[HOSTILE[0]])

    class HostileEngine:
        source = "/models/" + HOSTILE[1]
        device = HOSTILE[0]
        canvas_length = 64
        model = __import__("torch").nn.Linear(4, 4)  # the header shows its weights' memory

    assert_inert_html(header_html(HostileEngine()), shows=[HOSTILE[0]])


def test_plots_escape_hover_texts_and_titles():
    frames = [hostile_frame(step=s, accepted=[(i + s) % 3 == 0 for i in range(N)]) for s in range(4)]
    frames[-1] = dataclasses.replace(frames[-1], block_done=True)
    for animate in (True, False):
        for hover in (True, False):
            figure = plots.confidence_heatmap(frames, animate=animate, hover=hover)
            assert_inert_plot(figure, shows=HOSTILE if hover else [])
    assert_inert_plot(plots.unmasking_order(frames[-1]), shows=HOSTILE)
    assert_inert_plot(plots.unmasking_order(frames[0]), shows=HOSTILE)
    assert_inert_plot(plots.entropy_and_acceptance(frames))
    assert_inert_plot(plots.empty_figure(HOSTILE[0], HOSTILE[1]), shows=[HOSTILE[0], HOSTILE[1]])


class HostileSummaryEngine:
    """What the live views need of an engine (Chat's `live_view.render`, the Playground's feed); its tokens, decoded
    text and model name are hostile too."""

    canvas_length = N
    source = "/models/" + HOSTILE[1]
    token_text = ListTokenText(HOSTILE)
    model = StubModel()

    class device:  # noqa: N801
        type = "cpu"

    def summarize(self, last, frames):
        return GenerationResult(
            token_ids=list(last.committed_ids), text="".join(HOSTILE), frames=frames, forwards_per_block=[],
            seconds=1.0, tokens_per_second=1.0, tokens_per_forward=1.0, time_to_first_frame_s=0.1, prompt_tokens=4,
            seed=7, stop_reason=last.stop_reason)


def hostile_run() -> RunRecord:
    """Two blocks of four forwards of hostile frames, the run ended."""
    record = RunRecord()
    for block in range(2):
        for step in range(4):
            record.add(hostile_frame(step=step, block=block, block_done=step == 3, done=block == 1 and step == 3,
                                     stop_reason="max_new_tokens" if block == 1 and step == 3 else ""))
    return record


def test_the_chat_live_render_of_a_hostile_run_is_inert(served_app):
    """Everything `live_view.render` (Chat's view of a turn) sends to the page: HTML escaped, plots escaped, the
    text for a Textbox."""
    record = hostile_run()
    for final in (False, True):
        outputs = render(HostileSummaryEngine(), SessionState(), record.snapshot(), final=final, plots_due=True)
        for field in dataclasses.fields(outputs):
            value = getattr(outputs, field.name)
            if field.name == "text":
                assert value == plain_text("".join(HOSTILE))  # verbatim: a Textbox shows it as text
            elif isinstance(value, plots.FigureSpec):
                assert_inert_plot(value)
            elif isinstance(value, str):
                assert_inert_html(value)
    config = served_app[0].get_config_file()
    text_box = [c for c in config["components"] if c.get("props", {}).get("elem_id") == "dg-text"]
    assert [c["type"] for c in text_box] == ["textbox"]  # the generated text is never rendered as HTML


def test_the_playground_feed_of_a_hostile_run_is_data_not_markup():
    """What the Playground's run step sends of a hostile run: the feed message is JSON with no markup at all (the
    tokens, prompt and model name as data, for the page's player to draw as text: the browser test below holds
    that), the text verbatim for a Textbox, the thought and a meter inert HTML."""
    tab = PlaygroundTab(Hub(HostileSummaryEngine()))
    snap = hostile_run().snapshot()
    for final in (False, True):
        session = SessionState()
        session.request = RunRequest(prompt="".join(HOSTILE), raw=True, settings=DiffusionSettings(), seed=7)
        feed, text, thought, *_ = tab.outputs(session, snap, final=final, text=True)
        assert "<" not in feed  # no tag can start in it, even inside a <script>
        message = json.loads(feed)
        assert set(message["tokens"]) == set(HOSTILE)  # carried as they are: the player escapes them
        assert message["prompt"] == "".join(HOSTILE) and message["model"]["name"] == HostileSummaryEngine.source
        assert len(message["frames"]) == snap.frames_seen and message["final"] is final
        assert text == plain_text("".join(HOSTILE))  # verbatim: a Textbox shows it as text
        assert thought == thought_html("") and assert_inert_html(thought) is None
    session.snapshot = snap
    refused = json.loads(tab.refused(session))["meter"]  # the meter the server still draws
    assert 'data-state="refused"' in refused
    assert_inert_html(refused)


@pytest.mark.slow
def test_hostile_tokens_stay_text_in_the_browser(served_app, engine, monkeypatch, browser):
    """The real page, with every token the model produces rendered as hostile text: nothing runs, no element is
    injected, and the strings are visible as text."""
    monkeypatch.setattr(engine, "token_text", ListTokenText(HOSTILE, engine.token_text.kind))
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    try:
        page.add_init_script("window.__alerts = []; for (const f of ['alert', 'confirm', 'prompt']) "
                             "window[f] = (m) => { window.__alerts.push(String(m)); };")
        problems = []
        page.on("dialog", lambda d: (problems.append(d.message), d.dismiss()))
        page.on("pageerror", lambda e: problems.append(str(e)))
        page.goto(served_app[1])
        page.wait_for_selector("#dg-generate")
        page.check("#dg-raw input[type=checkbox]")
        set_number(page, "Max new tokens", 128)
        set_number(page, "Max denoising steps", 3)
        page.select_option("#dg-replay-pace", "live")  # the player keeps up with the engine
        page.click("#dg-generate")
        page.wait_for_selector(".dg-meter[data-state='done']", timeout=120_000)
        page.wait_for_selector("#dg-canvas [data-playing='false']", timeout=30_000)  # played to its last forward
        page.hover("#dg-heatmap .nsewdrag", timeout=10_000)  # a Plotly hover label with a hostile token
        page.wait_for_timeout(300)
        injected = page.evaluate("""() => {
            const views = ['.dg-canvas', '.dg-stack', '.dg-meter', '.dg-header'];  // the views' own roots
            const within = (roots, tags) => roots.flatMap(r => tags.map(t => `${r} ${t}`)).join(', ');
            const bad = ['script', 'img', 'iframe', 'svg', 'a[href]', 'style', 'object', 'embed'];
            const found = [...document.querySelectorAll(within(views, bad))].map(e => e.outerHTML);
            // Plotly's hover labels and titles (its modebar has a link of its own)
            const plotLayers = ['.js-plotly-plot .hoverlayer', '.js-plotly-plot .infolayer'];
            const plots = [...document.querySelectorAll(within(plotLayers,
                ['script', 'img', 'iframe', 'foreignObject', 'a[href]']))].map(e => e.outerHTML);
            const handlers = [...document.querySelectorAll('.dg-canvas *, .dg-stack *, .dg-meter *')].filter(
                e => [...e.attributes].some(a => a.name.startsWith('on'))).map(e => e.outerHTML);
            return {found, plots, handlers, alerts: window.__alerts};
        }""")
        chips = " ".join(page.locator(".dg-chip").all_inner_texts())
        titles = " ".join(t or "" for t in page.locator(".dg-chip").evaluate_all(
            "els => els.map(e => e.getAttribute('title'))"))
        hover = " ".join(page.locator("#dg-heatmap .hovertext").evaluate_all(
            "els => els.map(e => e.textContent || '')"))
    finally:
        page.close()
    print(f"\n[security] Plotly hover label under the pointer: {hover[:100]!r}")
    assert not problems, problems
    assert injected == {"found": [], "plots": [], "handlers": [], "alerts": []}, injected
    assert "<script>alert(1)</script>" in chips  # tooltips quote the raw piece, chips mark its spaces
    assert any(f"\u201c{token}\u201d" in titles for token in HOSTILE), titles  # quoted as text in the tooltips
    if hover:  # Plotly drew a hover label: the token in it is text too
        assert any(visible_token(t) in hover for t in HOSTILE), hover
