"""The Compare tab: the verdict view, A and B run one after the other with one seed and give each setting's own
tokens, and the tab in Chromium. Screenshots go to artifacts/compare/."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import gradio as gr
import pytest

from diffgemma_ui.compare_tab import (DIFFUSERS_PREFIX, ENGINE_SAMPLER, SIDE_SETTINGS, CompareHandlers, CompareState,
                                      PipelineJob, b_controls, pipeline_source, side_html, verdict_html)
from diffgemma_ui.hub import RUN_INPUT_NAMES, Hub, Job
from diffgemma_ui.tab import stop_run
from engine import DiffusionSettings
from engine.diffusers_sampler import PipelineRun, check_pipeline_settings, pipeline_frames, turn_end_id
from pages import open_page
from synthetic import parse_html, synthetic_frame

SHOTS = Path(__file__).resolve().parent.parent / "artifacts" / "compare"


def finished(forwards: int, tokens: int, seconds: float, ids: list[int]):
    return synthetic_frame(4, ["a"] * 4, forward_index=forwards - 1, done=True, block_done=True,
                           committed_ids=ids, committed_tokens=tokens, elapsed_s=seconds,
                           tokens_per_forward=tokens / forwards, tokens_per_second=tokens / seconds,
                           stop_reason="eos")


def test_verdict_compares_b_with_a():
    a = finished(8, 16, 2.0, [5, 6, 7])
    b = finished(4, 16, 0.5, [5, 9, 7])
    html = verdict_html(a, b)
    cells = [t.strip() for t in parse_html(html).text if t.strip()]
    assert cells[cells.index("decoder forwards") + 1: cells.index("decoder forwards") + 4] == ["8", "4", "0.50×"]
    assert cells[cells.index("tokens per forward") + 1: cells.index("tokens per forward") + 4] == ["2.00", "4.00",
                                                                                                 "2.00×"]
    assert 'data-same="false"' in html and "different tokens from token 2" in html
    assert 'data-same="true"' in verdict_html(a, finished(3, 16, 1.0, [5, 6, 7]))
    assert 'data-state="pending"' in verdict_html(a, None)
    assert "entropy bound 0.5" in side_html("B", DiffusionSettings(entropy_bound=0.5), b, "done")
    idle = side_html("A", None, None, "waiting")  # the tab's own button, not the Playground's Generate
    assert "press Compare A and B to start" in idle and "press Generate" not in idle


@pytest.mark.slow
def test_compare_runs_a_then_b_with_one_seed(engine):
    hub = Hub(engine)
    started = []
    start_job = hub.start_job

    def recording_start_job(job, *args, **kwargs):
        assert all(not worker.running for worker in started), "B started while A was running"
        started.append(start_job(job, *args, **kwargs))
        return started[-1]

    hub.start_job = recording_start_job
    views = list(CompareHandlers(hub).compare(None, None, "In the beginning", True, -1, 128, 0.5, 3, False,
                                                     2.0, 2, True))
    assert len(started) == 2
    card_a, card_b, verdict, text_a, text_b, heatmap_a, heatmap_b = views[-1]
    assert 'data-state="done"' in card_a and 'data-state="done"' in card_b and 'data-state="done"' in verdict
    seeds = {worker.snapshot().latest.seed for worker in started}
    assert len(seeds) == 1  # one drawn seed for both
    seed = seeds.pop()
    rec = engine.recommended
    for worker, (bound, steps, adaptive), text in zip(started, ((0.5, 3, False), (2.0, 2, True)), (text_a, text_b)):
        settings = rec.replace(max_new_tokens=128, entropy_bound=bound, max_denoising_steps=steps,
                               adaptive_stopping=adaptive)
        direct = engine.generate("In the beginning", settings, raw=True, seed=seed)
        assert worker.snapshot().latest.committed_ids == direct.token_ids
        assert text == direct.text
    forwards_a = started[0].snapshot().latest.forwards_per_block
    assert forwards_a and set(forwards_a) == {3}, forwards_a  # A: adaptive stopping off (blocks: as the seed writes)
    assert heatmap_a["data"] and heatmap_b["data"]


# the meter tiles of both cards whose value is wider than the tile shows (cut off with an ellipsis)
CUT_TILES = """() => [...document.querySelectorAll('.dg-compare-side .dg-stat-value')]
  .filter(e => e.scrollWidth > e.clientWidth).map(e => `${e.innerText}: ${e.scrollWidth} px in ${e.clientWidth} px`)"""


@pytest.mark.slow
def test_compare_tab_in_the_browser(browser, served_app):
    page, problems = open_page(browser, served_app[1])
    try:
        page.click("#dg-tab-compare-button, button[role=tab]:has-text('Compare')")
        page.fill("#dg-compare-prompt textarea", "In the beginning")
        page.check("#dg-compare-raw input[type=checkbox]")
        page.locator("#dg-compare-max-new input[type=number]").fill("64")
        page.locator("#dg-compare-max-new input[type=number]").press("Enter")
        assert not page.locator("#dg-compare-stop").is_enabled()  # nothing to stop yet
        bound_b = "document.querySelector('#dg-compare-entropy-bound-B input[type=number]').disabled === "
        for sampler, disabled in ((DIFFUSERS_PREFIX + "BlockRefinementScheduler", "true"), (ENGINE_SAMPLER, "false")):
            page.click("#dg-compare-sampler input")
            page.locator("ul[role=listbox] li", has_text=sampler).first.click()
            page.wait_for_function(bound_b + disabled, timeout=10_000)  # B's scheduler ignores the bound
        assert page.locator("#dg-compare-entropy-bound-A input[type=number]").is_enabled()
        page.click("#dg-compare-run")
        page.wait_for_function("document.querySelector('#dg-compare-stop').disabled === false", timeout=30_000)
        page.wait_for_selector("#dg-compare-verdict [data-state=done]", timeout=180_000)
        page.wait_for_function("document.querySelector('#dg-compare-stop').disabled === true", timeout=10_000)
        assert page.locator("#dg-compare-run").is_enabled()
        assert page.locator("#dg-compare-heatmap-A .main-svg").count() > 0
        assert page.locator("#dg-compare-heatmap-B .main-svg").count() > 0
        assert page.locator("#dg-compare-card-A .dg-compare-side[data-state=done]").count() == 1
        assert page.input_value("#dg-compare-text-A textarea") != ""
        assert page.evaluate(CUT_TILES) == []  # every meter tile's value shown whole at 1280 px
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / "compare.png"), full_page=True)
        page.fill("#dg-compare-prompt textarea", "   ")  # refused: the cards stay, marked as the previous run's
        page.click("#dg-compare-run")
        page.wait_for_selector("#dg-compare-verdict [data-state=refused] .dg-meter-notice", timeout=30_000)
        assert page.locator("#dg-compare-card-A .dg-compare-side[data-state=done]").count() == 1
        assert page.locator("#dg-compare-card-A .error, #dg-compare-card-B .error").count() == 0
        page.screenshot(path=str(SHOTS / "compare-refused.png"), full_page=True)
        assert problems == []
    finally:
        page.close()


@pytest.mark.slow
def test_diffusers_scheduler_as_side_b(engine):
    pytest.importorskip("diffusers")
    settings = engine.recommended.replace(max_new_tokens=128, max_denoising_steps=3)
    frames = pipeline_frames(engine, "Tell me about the flood.", settings, "BlockRefinementScheduler", 4)
    last = frames[-1]
    assert last.done and len(frames) == sum(last.forwards_per_block) and all(1 <= f <= 3 for f in
                                                                               last.forwards_per_block)
    assert [f.forward_index for f in frames] == list(range(len(frames)))
    assert all(len(f.draft_ids) == engine.canvas_length and len(f.accepted) == engine.canvas_length for f in frames)
    assert turn_end_id(engine.tokenizer, engine.model.generation_config.eos_token_id) == 4  # <end_of_turn>
    ended = pipeline_frames(engine, "Tell me what happened after the flood.", settings.replace(max_new_tokens=256),
                            "DiscreteDDIMScheduler", 0)[-1]
    assert ended.stop_reason == "eos" and ended.committed_ids[-1] == 4
    assert len(ended.forwards_per_block) == (len(ended.committed_ids) - 1) // engine.canvas_length + 1  # no more
    again = pipeline_frames(engine, "Tell me about the flood.", settings, "BlockRefinementScheduler", 4)
    assert again[-1].committed_ids == last.committed_ids  # the pipeline's generator is seeded
    views = list(CompareHandlers(Hub(engine)).compare(
        None, None, "Tell me about the flood.", False, 4, 128, 0.5, 3, True, 0.5, 3, True,
        DIFFUSERS_PREFIX + "EntropyBoundScheduler"))
    card_a, card_b, verdict, _, text_b, _, heatmap_b = views[-1]
    assert "EntropyBoundScheduler" in card_b and 'data-state="done"' in verdict and heatmap_b["data"]
    hub = Hub(engine, max_run_s=0.3)  # a first canvas of 64 forwards takes longer
    CompareHandlers(hub)
    inputs = ("Tell me about the flood.", False, 1024, 64, 0.5, 0.05, 0.1, 1, 0.05, False, 4)
    request = hub.checked_request(dict(zip(RUN_INPUT_NAMES, inputs)), ui_limits=True)
    exact = []  # side B is the runs' "pipeline" job: the time limit, Stop and closing are the run mechanism's
    worker = hub.start_job(Job("pipeline", PipelineJob(request, "BlockRefinementScheduler"), request.settings),
                                  keep_history=False, receive=exact.extend)
    snaps = list(worker.updates(20.0, reader_budget=None))
    with pytest.raises(Exception, match="limit of 0.3 s per run"):
        raise snaps[-1].error
    live = [snap.latest for snap in snaps[:-1] if snap.latest is not None]
    assert live and not live[-1].done  # frames were shown while the pipeline ran
    assert exact and exact[-1].stop_reason == "cancelled" and snaps[-1].latest == exact[-1]
    stopped = threading.Event()
    stopped.set()  # Stop before the first forward: the side ends with no frame and no error
    assert list(pipeline_source(engine, PipelineJob(request, "BlockRefinementScheduler"), stopped)) == []


@pytest.mark.slow
def test_a_pipeline_run_is_read_while_it_runs_and_stops_within_a_step(engine):
    pytest.importorskip("diffusers")
    settings = engine.recommended.replace(max_new_tokens=1024, max_denoising_steps=8, adaptive_stopping=False)
    run = PipelineRun(engine, "Tell me about the flood.", settings, "BlockRefinementScheduler", 4).start()
    while len(run.frames()) < 3 and not run.finished:
        time.sleep(0.01)
    frames = run.frames()
    assert not frames[-1].done and not frames[-1].block_done  # the newest block is still being denoised
    assert [f.forward_index for f in frames] == list(range(len(frames)))
    run.stop()
    assert run.wait(30) and run.error is None
    last = run.frames()[-1]
    assert last.done and last.stop_reason == "cancelled" and last.forward_index < 31  # 4 blocks x 8 steps
    assert run.latest() == last and run.forwards == last.forward_index + 1


@pytest.mark.slow
def test_diffusers_side_b_refuses_raw_prompts(engine):
    pytest.importorskip("diffusers")
    with pytest.raises(Exception, match="always applies the chat template"):
        list(CompareHandlers(Hub(engine)).compare(None, None, "In the beginning", True, 4, 64, 0.5, 3, True,
                                                         0.5, 3, True, DIFFUSERS_PREFIX + "DiscreteDDIMScheduler"))


def test_a_stability_threshold_of_zero_is_refused_for_diffusers():
    """The engine reads stability_threshold 0 as stable at once, diffusers' pipeline as 1: refused, not run."""
    zero = DiffusionSettings(stability_threshold=0, confidence_threshold=100.0)
    with pytest.raises(ValueError, match="reads 0 as 1"):
        PipelineRun(None, "Tell me about the flood.", zero, "BlockRefinementScheduler", 0)
    assert check_pipeline_settings(zero.replace(adaptive_stopping=False)).stability_threshold == 0  # not read
    assert check_pipeline_settings(zero.replace(stability_threshold=1)).stability_threshold == 1


def test_b_disables_the_controls_its_scheduler_ignores():
    bound, steps, adaptive = b_controls(DIFFUSERS_PREFIX + "BlockRefinementScheduler")
    assert bound["interactive"] is False
    assert bound["info"] == "ignored: BlockRefinementScheduler samples with its own defaults"
    assert steps["interactive"] is adaptive["interactive"] is True
    for sampler in (ENGINE_SAMPLER, DIFFUSERS_PREFIX + "EntropyBoundScheduler"):
        updates = b_controls(sampler)
        assert all(u["interactive"] for u in updates)
        assert [u["info"] for u in updates] == list(SIDE_SETTINGS.values())


@pytest.mark.slow
def test_compare_refuses_a_stability_threshold_diffusers_reads_otherwise(engine, monkeypatch):
    pytest.importorskip("diffusers")
    monkeypatch.setattr(engine, "recommended", engine.recommended.replace(stability_threshold=0))
    compare = CompareHandlers(Hub(engine))
    args = (None, "Tell me about the flood.", False, 4, 64, 0.5, 3, True, 0.5, 3)
    with pytest.raises(gr.Error, match="reads 0 as 1"):
        compare.request(*args, True, DIFFUSERS_PREFIX + "BlockRefinementScheduler")
    compare.request(*args, False, DIFFUSERS_PREFIX + "BlockRefinementScheduler")  # stability is not read
    compare.request(*args, True, ENGINE_SAMPLER)


def test_compare_reads_its_seed_as_every_tab_does(engine):
    compare = CompareHandlers(Hub(engine))
    for seed in ("abc", "1e30", 2.5, -5, 2**63):
        with pytest.raises(gr.Error, match=r"seed must be an integer in \[0, "):
            compare.request(None, "In the beginning", True, seed, 64, 0.5, 3, True, 0.5, 3, True)
    for seed in ("7", 7, " 7 ", "", None, "-1", -1):
        compare.request(None, "In the beginning", True, seed, 64, 0.5, 3, True, 0.5, 3, True)


def test_a_sampler_that_ignores_the_bound_is_not_shown_with_one():
    settings = DiffusionSettings(entropy_bound=10.0, max_denoising_steps=5)
    card = side_html("B", settings, None, "waiting", sampler="DiscreteDDIMScheduler", bound_and_t=False)
    assert "DiscreteDDIMScheduler" in card and "max 5 steps" in card
    assert "entropy bound" not in card and "t 0." not in card
    assert "entropy bound 10" in side_html("A", settings, None, "waiting")


@pytest.mark.slow
def test_stop_ends_the_running_side_and_b_never_starts(engine):
    handlers, state = CompareHandlers(Hub(engine)), CompareState()
    views = handlers.compare(state, None, "In the beginning", True, 0, 1024, 0.5, 64, False, 0.5, 64, False)
    first = next(views)
    assert 'data-side="A" data-state="running"' in first[0]
    stop_run(state)  # the Stop button
    card_a, card_b, verdict, text_a, *_ = list(views)[-1]
    assert 'data-state="stopped"' in card_a and "Stopped" not in card_b and 'data-state="not run"' in card_b
    assert "press Compare A and B to start" not in card_b and "Stop came before this side" in card_b
    assert 'data-state="pending"' in verdict


def test_a_refused_comparison_marks_the_previous_one_and_a_stop_while_queued_runs_nothing(engine):
    hub = Hub(engine)
    handlers, state = CompareHandlers(hub), CompareState()
    args = ("In the beginning", True, 0, 16, 2.0, 2, True, 2.0, 1, True)
    assert isinstance(handlers.refused(state), type(gr.skip()))  # nothing on the page to mark
    handlers.request(state, *args)
    last = list(handlers.compare(state, None, *args))[-1]
    assert 'data-state="done"' in last[2] and not state.running
    with pytest.raises(gr.Error):
        handlers.request(state, "   ", *args[1:])  # an empty prompt is refused before the queue
    marked = handlers.refused(state)
    assert 'data-state="refused"' in marked and "Everything below is from the previous run" in marked
    assert "decoder forwards" in marked  # the previous comparison's own figures stay

    started = []
    start_job = hub.start_job
    hub.start_job = lambda job, *a, **kwargs: started.append(job) or start_job(job, *a, **kwargs)
    handlers.request(state, *args)  # accepted, then Stop while it waits in the queue
    stop_run(state)
    card_a, card_b, verdict, *_ = list(handlers.compare(state, None, *args))[-1]
    assert started == [] and 'data-state="stopped"' in card_a and 'data-state="not run"' in card_b
    handlers.request(state, *args)  # the next accepted request runs again
    assert 'data-state="done"' in list(handlers.compare(state, None, *args))[-1][2] and len(started) == 2
