"""The teaching views of a frame: "why this token?" alternatives, re-melt marks and the canvas-aware meter."""

from __future__ import annotations

from diffgemma_ui import meter, plots
from diffgemma_ui.canvas_view import block_html
from synthetic import parse_html, synthetic_frame


def _chips(html: str) -> list[dict]:
    return [attrs for tag, attrs in parse_html(html).tags if tag == "span" and "dg-chip" in attrs.get("class", "")]


def test_a_chip_lists_its_alternatives_escaped_with_the_draft_first():
    n = 4
    tokens = ["the", "<script>", "a", "b"]
    frame = synthetic_frame(n, tokens, accepted=[True] * n,
                            top_tokens=[[t, "<img src=x>", "of"] for t in tokens],
                            top_probs=[[0.62, 0.2, 0.1]] * n, top_ids=[[i, 900, 901] for i in range(n)])
    html = block_html(frame, live=True)
    assert "<img" not in html and "<script>" not in html
    titles = [chip["title"] for chip in _chips(html)]
    assert titles[0].endswith("why this token? \u201cthe\u201d 62% \u00b7 \u201c<img\u00b7src=x>\u201d 20% \u00b7 "
                              "\u201cof\u201d 10%")
    assert "\u201c<script>\u201d 62%" in titles[1]


def test_frames_without_alternatives_show_no_why_line():
    frame = synthetic_frame(3, ["x", "y", "z"])
    assert all("why this token" not in chip["title"] for chip in _chips(block_html(frame, live=True)))


def test_remelted_positions_are_marked_and_the_block_header_counts_them():
    n = 6
    remelted = [False, True, False, False, True, False]
    frame = synthetic_frame(n, list("abcdef"), step=3, accepted=[True, False, True, False, False, True],
                            remelted=remelted, block_remelts=5)
    html = block_html(frame, live=True)
    chips = _chips(html)
    assert ["dg-remelt" in chip["class"] for chip in chips] == remelted
    assert "re-melted: accepted at an earlier step" in chips[1]["title"]
    assert "5 re-melted" in html
    done = synthetic_frame(n, list("abcdef"), step=3, block_done=True, committed=list(range(n)), block_remelts=2)
    assert "2 re-melted" in block_html(done, live=False)
    assert "re-melted" not in block_html(synthetic_frame(n, list("abcdef")), live=True)


def test_the_meter_shows_milliseconds_per_forward_and_forwards_used_of_the_budget():
    frame = synthetic_frame(4, list("abcd"), block=1, step=2, forward_index=9, elapsed_s=1.15,
                            time_to_first_frame_s=0.25, max_denoising_steps=16, forwards_per_block=[7])
    values = meter.meter_values(frame)
    assert values["ms/forward"] == "100"  # (1.15 - 0.25) s over the 9 forwards after the first
    assert values["forwards used of 32"] == "10"  # two canvases started, 16 steps each at most
    first = synthetic_frame(4, list("abcd"), forward_index=0, elapsed_s=0.004, time_to_first_frame_s=0.004)
    assert meter.meter_values(first)["ms/forward"] == "4.0"


def test_a_short_answer_that_paid_for_a_whole_canvas_is_called_out():
    short = synthetic_frame(64, ["t"] * 64, step=5, block_done=True, done=True, stop_reason="eos",
                            committed=list(range(12)), forwards_per_block=[6])
    html = meter.meter_html(short)
    assert "a 12-token answer paid for 64 canvas positions" in html
    full = synthetic_frame(64, ["t"] * 64, step=5, block_done=True, done=True, stop_reason="eos",
                           committed=list(range(40)), forwards_per_block=[6])
    assert "paid for" not in meter.meter_html(full)
    budget = synthetic_frame(64, ["t"] * 64, step=5, block_done=True, done=True, stop_reason="max_new_tokens",
                             committed=list(range(12)), forwards_per_block=[6])
    assert "paid for" not in meter.meter_html(budget)  # a token budget cut the answer, not the model


def test_the_heatmap_crosses_the_cells_that_re_melted_at_each_step():
    n = 4
    frames = [synthetic_frame(n, list("abcd"), step=0, accepted=[True, True, False, False]),
              synthetic_frame(n, list("abcd"), step=1, accepted=[False, True, True, False],
                              remelted=[True, False, False, False], block_remelts=1),
              synthetic_frame(n, list("abcd"), step=2, accepted=[True, False, False, False],
                              remelted=[False, True, True, False], block_remelts=3)]
    heat, dots, melts = plots.confidence_heatmap(frames, animate=False)["data"]
    assert list(zip(melts["x"], melts["y"])) == [(0, 2), (1, 3), (2, 3)]  # (position, 1-based step)
    assert not set(zip(melts["x"], melts["y"])) & set(zip(dots["x"], dots["y"]))


def test_the_heatmap_dots_the_step_a_position_is_accepted_and_drops_cell_gaps_at_scale():
    n = 4
    frames = [synthetic_frame(n, list("abcd"), step=0, accepted=[True, False, False, False]),
              synthetic_frame(n, list("abcd"), step=1, accepted=[True, True, False, False]),
              synthetic_frame(n, list("abcd"), step=2, accepted=[False, True, True, False],
                              remelted=[True, False, False, False], block_remelts=1),
              synthetic_frame(n, list("abcd"), step=3, accepted=[True, True, True, True])]
    heat, dots, melts = plots.confidence_heatmap(frames, animate=False)["data"]
    # one dot per acceptance (position 0 again after its re-melt), not one per accepted cell
    assert sorted(zip(dots["x"], dots["y"])) == [(0, 1), (0, 4), (1, 2), (2, 3), (3, 4)]
    assert list(zip(melts["x"], melts["y"])) == [(0, 3)]
    assert heat["xgap"] == heat["ygap"] == 1 and dots["marker"]["size"] == 4 and "zsmooth" not in heat
    # a 256-position block of 128 steps: cells 2-3 px tall, no gaps to hide them, dots only where accepted
    big = [synthetic_frame(256, ["t"] * 256, step=s, accepted=[p % 128 <= s for p in range(256)],
                           max_denoising_steps=128) for s in range(128)]
    heat, dots, _ = plots.confidence_heatmap(big, animate=False, hover=False)["data"]
    assert heat["xgap"] == heat["ygap"] == 0 and len(dots["x"]) == 256 and dots["marker"]["size"] == 3
    assert heat["zsmooth"] == "fast"  # drawn as one image of a pixel per cell, not 32,768 rectangles
    # and the final figure has no per-cell token text over 256 x 64 cells (the canvas popup has the tokens)
    assert "hovertext" not in plots.confidence_heatmap(big, animate=True, hover=True)["data"][0]
    assert "hovertext" in plots.confidence_heatmap(big[:64], animate=True, hover=True)["data"][0]
