"""The live speed meter as HTML stat cards, every figure from the newest frame's engine clock (never the UI's)."""

from engine import Frame

from .canvas_view import STOP_REASONS, finite_number
from .text import escape_html, plural, prose

IDLE_NOTE = "engine clock \u00b7 press Generate to start"
STARTING_NOTE = "starting: encoding the prompt, then the first decoder forward"
REFUSED_NOTICE = "Refused (the box under the buttons says why). Everything below is from the previous run."


def format_number(value: float, digits: int = 1, unit: str = "") -> str:
    """`value` with `digits` decimals, thousands separated, and `unit`; "–" if missing or non-finite."""
    value = finite_number(value)
    return "\u2013" if value is None else f"{value:,.{digits}f}{unit}"


def meter_values(frame: Frame | None, committed: Frame | None = None) -> dict[str, str]:
    """The meter's figures by label, unescaped (None: dashes); rates from `committed` (the newest finished block)."""
    if frame is None:
        return dict.fromkeys(("tokens/s", "tokens/forward", "forwards/block", "ms/forward", "forwards used", "elapsed",
                              "first frame", "tokens", "progress"), "\u2013")
    fpb = frame.forwards_per_block
    rates = committed or frame
    counting = not fpb
    forwards_per_block = f"\u2265 {frame.step_index + 1}"
    if fpb:
        mean = sum(fpb) / len(fpb)
        forwards_per_block = format_number(mean, 0 if mean.is_integer() else 1)
    if frame.done:
        progress = STOP_REASONS.get(frame.stop_reason, frame.stop_reason) or "done"
    else:
        progress = f"block {frame.block_index + 1} \u00b7 step {frame.step_index + 1}/{frame.max_denoising_steps}"
        if counting:
            progress += " \u00b7 tokens/s from the first committed block"
    none = "\u2013" if frame.done else "\u2026"
    per_forward_ms = frame.time_to_first_frame_s * 1000  # then the mean of the forwards after the first
    if frame.forward_index >= 1:
        per_forward_ms = (frame.elapsed_s - frame.time_to_first_frame_s) / frame.forward_index * 1000
    return {
        "tokens/s": none if counting else format_number(rates.tokens_per_second, 1),
        "tokens/forward": none if counting else format_number(rates.tokens_per_forward, 2),
        "forwards/block": forwards_per_block,
        "ms/forward": format_number(per_forward_ms, 0 if per_forward_ms >= 10 else 1),
        f"forwards used of {(frame.block_index + 1) * frame.max_denoising_steps:,}": f"{frame.forward_index + 1:,}",
        "elapsed": format_number(frame.elapsed_s, 2, " s"),
        "first frame": format_number(frame.time_to_first_frame_s * 1000, 0, " ms"),
        "tokens": f"{frame.committed_tokens:,}",
        "progress": progress,
    }


def stat_cards_html(values: dict[str, str]) -> str:
    """One stat card per `label: value` (escaped here)."""
    return "".join(f'<div class="dg-stat"><span class="dg-stat-value">{escape_html(v)}</span>'
                   f'<span class="dg-stat-label">{escape_html(k).replace("/", "/<wbr>")}</span></div>'
                   for k, v in values.items())


def meter_html(frame: Frame | None, *, committed: Frame | None = None, note: str | None = None,
               state: str | None = None, notice: str | None = None) -> str:
    """The meter's cards and note (`note`: instead of the idle one), `state`, `notice` above; raw figures in data-."""
    values = meter_values(frame, committed)
    progress = values.pop("progress")
    rates = committed or frame
    tps = 0.0 if rates is None or not rates.forwards_per_block else finite_number(rates.tokens_per_second) or 0.0
    ttff = 0.0 if frame is None else finite_number(frame.time_to_first_frame_s) or 0.0
    state = state or ("idle" if frame is None else ("done" if frame.done else "running"))
    footer = f'<div class="dg-meter-note">{escape_html(note or IDLE_NOTE)}</div>'
    if frame is not None:
        footer = (f'<div class="dg-meter-note"><span class="dg-progress">{escape_html(progress)}</span> engine clock'
                  f" \u00b7 seed {escape_html(str(frame.seed))} \u00b7 prompt {plural(frame.prompt_tokens, 'token')}"
                  f" \u00b7 {plural(frame.forward_index + 1, 'forward')}"
                  f' <span class="dg-rate-note">{escape_html(prose("rate-note"))}</span></div>')
        positions = (frame.block_index + 1) * frame.canvas_length
        if frame.done and frame.stop_reason == "eos" and 2 * frame.committed_tokens < positions:
            short = (f"a {frame.committed_tokens:,}-token answer paid for {positions:,} canvas positions: every "
                     "forward denoises the whole canvas, so tokens/s counts only the answer")
            footer += f'<div class="dg-meter-note dg-short-answer">{escape_html(short)}</div>'
    banner = f'<div class="dg-meter-notice" role="status">{escape_html(notice)}</div>' if notice else ""
    return (f'<div class="dg-meter" data-state="{state}" data-tps="{tps:.6g}" data-ttff="{ttff:.6g}">'
            f"{banner}{stat_cards_html(values)}{footer}</div>")


def run_meter_html(frame: Frame | None, *, committed: Frame | None = None, final: bool) -> str:
    """A started run's meter (`final`: its last view); "starting" before its first frame."""
    if frame is None and not final:
        return meter_html(None, note=STARTING_NOTE, state="running")
    return meter_html(frame, committed=committed)


def waiting_meter_html(replacing: bool = False) -> str:
    """A queued run's meter (`replacing`: it stopped the session's run); the browser fills in its place."""
    html = meter_html(None, note="\u0000", state="queued")
    replaced = "Replaced the run in progress (stopped) \u00b7 " if replacing else ""
    return html.replace("\u0000", f'{replaced}Queued: <span class="dg-queue-position">waiting for a place</span> in '
                        "the queue for the engine \u00b7 Stop leaves the queue")
