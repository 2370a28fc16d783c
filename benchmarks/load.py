"""Load test of the playground's /generate API: N concurrent gradio_client users, each its own Gradio session.

    python -m benchmarks.load                      # launches app.py on a free loopback port (embedded model)
    python -m benchmarks.load --url http://127.0.0.1:7860/ --clients 8 --requests 2 --json

Every client sends `--requests` requests one after another, each with its own prompt and seed, within
`--time-limit` (unfinished jobs are cancelled); queue positions are polled meanwhile. Afterwards each completed
(prompt, seed) runs again alone and its token ids must equal the concurrent result (per-run random state). Reports
completed runs, errors, latency p50/p95/max (queue wait included), throughput, the largest queue position and the
solo check. Only loopback URLs are accepted. Exit status 0 when every request completed and matched. Server memory
per browser visitor: `python -m benchmarks.browser sessions`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import threading
import time
import urllib.parse
from dataclasses import asdict, dataclass, field

from gradio_client import Client
from gradio_client.utils import Status

from benchmarks.bench import launched_app

LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}
PROMPTS = [
    "In the beginning", "The Lord is my shepherd", "Blessed are the", "And it came to pass",
    "Let there be light", "In my father's house", "The word of the Lord came", "Now these are the names",
    "A wise son maketh", "Vanity of vanities", "Hear, O Israel", "For unto us a child",
]


@dataclass
class Outcome:
    """One request: who sent it, what it asked, how long it took (seconds), and its token ids or error."""

    client: int
    prompt: str
    seed: int
    latency_s: float = math.nan
    token_ids: list[int] | None = None
    error: str | None = None
    max_rank: int | None = None
    matched_solo: bool | None = None


@dataclass
class Report:
    """The load test's figures (see the module docstring)."""

    url: str
    clients: int
    requests_per_client: int
    settings: dict
    sent: int = 0
    completed: int = 0
    errors: int = 0
    error_messages: list[str] = field(default_factory=list)
    p50_s: float = math.nan
    p95_s: float = math.nan
    max_s: float = math.nan
    wall_s: float = math.nan
    runs_per_s: float = math.nan
    max_queue_position: int | None = None
    solo_checked: int = 0
    solo_matched: int = 0
    all_matched: bool = False
    load_average_1m: float | None = None


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile `q` (0-100) of `values` (NaN when empty)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def check_loopback(url: str) -> str:
    """Return `url` (with a trailing slash) if its host is a loopback address; raise SystemExit otherwise."""
    host = urllib.parse.urlparse(url).hostname or ""
    if host not in LOOPBACK and f"[{host}]" not in LOOPBACK:
        raise SystemExit(f"error: the load test only targets loopback URLs (127.0.0.1, localhost, ::1), got {url!r}")
    return url if url.endswith("/") else url + "/"


def api_arguments(settings: dict, prompt: str, seed: int) -> list:
    """The eleven /generate arguments, in the API's order."""
    return [prompt, settings["raw"], settings["max_new_tokens"], settings["max_denoising_steps"],
            settings["entropy_bound"], settings["t_min"], settings["t_max"], settings["stability_threshold"],
            settings["confidence_threshold"], settings["adaptive_stopping"], seed]


def run_client(url: str, index: int, requests: int, settings: dict, deadline: float, start: threading.Barrier,
               outcomes: list[Outcome], lock: threading.Lock) -> None:
    """One user: its own `Client` (Gradio session) sends `requests` requests one after another until `deadline`."""

    client = Client(url, verbose=False)
    try:
        start.wait()
        for r in range(requests):
            if time.monotonic() >= deadline:
                break
            number = index * requests + r
            outcome = Outcome(client=index, prompt=PROMPTS[number % len(PROMPTS)], seed=1000 + number)
            sent = time.perf_counter()
            job = client.submit(*api_arguments(settings, outcome.prompt, outcome.seed), api_name="/generate")
            while not job.done() and time.monotonic() < deadline:
                status = job.status()
                if status.code == Status.IN_QUEUE and status.rank is not None:
                    outcome.max_rank = max(outcome.max_rank or 0, status.rank)
                time.sleep(0.05)
            if not job.done():
                job.cancel()
                outcome.error = "not finished within the time limit (cancelled)"
            else:
                try:
                    _, summary = job.result(timeout=5)
                    outcome.token_ids = summary["token_ids"]
                except Exception as error:  # noqa: BLE001 - counted and reported
                    outcome.error = f"{type(error).__name__}: {error}"
            outcome.latency_s = time.perf_counter() - sent
            with lock:
                outcomes.append(outcome)
    finally:
        client.close()


def verify_solo(url: str, settings: dict, outcomes: list[Outcome], deadline: float) -> None:
    """Run each completed (prompt, seed) again alone and set `matched_solo` (None when out of time)."""

    client = Client(url, verbose=False)
    try:
        for outcome in outcomes:
            if outcome.token_ids is None or time.monotonic() >= deadline:
                continue
            _, summary = client.predict(*api_arguments(settings, outcome.prompt, outcome.seed), api_name="/generate")
            outcome.matched_solo = summary["token_ids"] == outcome.token_ids
    finally:
        client.close()


def load_test(url: str, *, clients: int = 8, requests: int = 2, settings: dict | None = None,
              time_limit_s: float = 300.0, verify: bool = True) -> tuple[Report, list[Outcome]]:
    """Run the load test against the app at `url` (loopback only); returns the report and every request's outcome."""
    url = check_loopback(url)
    settings = settings or dict(raw=True, max_new_tokens=64, max_denoising_steps=4, entropy_bound=0.5, t_min=0.4,
                                t_max=0.8, stability_threshold=1, confidence_threshold=0.05, adaptive_stopping=True)
    outcomes: list[Outcome] = []
    lock = threading.Lock()
    started = time.monotonic()
    deadline = started + time_limit_s
    barrier = threading.Barrier(clients)
    threads = [threading.Thread(target=run_client, args=(url, i, requests, settings, deadline, barrier, outcomes,
                                                         lock), daemon=True) for i in range(clients)]
    wall_start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(1.0, deadline - time.monotonic() + 30))
    wall = time.perf_counter() - wall_start
    outcomes.sort(key=lambda o: (o.client, o.seed))
    if verify:
        verify_solo(url, settings, outcomes, started + 2 * time_limit_s)

    done = [o for o in outcomes if o.token_ids is not None]
    latencies = [o.latency_s for o in done]
    checked = [o for o in done if o.matched_solo is not None]
    ranks = [o.max_rank for o in outcomes if o.max_rank is not None]
    report = Report(
        url=url, clients=clients, requests_per_client=requests, settings=settings, sent=len(outcomes),
        completed=len(done), errors=len(outcomes) - len(done),
        error_messages=sorted({o.error for o in outcomes if o.error})[:5],
        p50_s=percentile(latencies, 50), p95_s=percentile(latencies, 95), max_s=max(latencies, default=math.nan),
        wall_s=wall, runs_per_s=len(done) / wall if wall > 0 else math.nan,
        max_queue_position=max(ranks) if ranks else None,
        solo_checked=len(checked), solo_matched=sum(1 for o in checked if o.matched_solo),
        load_average_1m=os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    )
    report.all_matched = (report.completed == clients * requests and report.solo_checked == report.completed
                          and report.solo_matched == report.completed)
    return report, outcomes


def format_table(report: Report) -> str:
    """The report as an aligned two-column text table."""
    s = report.settings
    rows = [
        ("target", report.url),
        ("clients x requests", f"{report.clients} x {report.requests_per_client}"),
        ("settings", f"max_new_tokens {s['max_new_tokens']}, steps {s['max_denoising_steps']}, "
                     f"adaptive {s['adaptive_stopping']}"),
        ("sent / completed / errors", f"{report.sent} / {report.completed} / {report.errors}"),
        ("latency p50 / p95 / max", f"{report.p50_s:.2f} s / {report.p95_s:.2f} s / {report.max_s:.2f} s"),
        ("wall time, throughput", f"{report.wall_s:.1f} s, {report.runs_per_s:.2f} runs/s"),
        ("largest queue position seen", "-" if report.max_queue_position is None else str(report.max_queue_position)),
        ("matched the solo run", f"{report.solo_matched} / {report.solo_checked} checked"
                                 f" ({'all' if report.all_matched else 'NOT all'})"),
        ("load average (1 min)", "-" if report.load_average_1m is None else f"{report.load_average_1m:.2f}"),
    ]
    rows += [("error", message) for message in report.error_messages]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.load", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a running playground (loopback only); default: launch app.py on a free port")
    parser.add_argument("--model", help="model for the launched app (default: the embedded diffgemma-tiny)")
    parser.add_argument("--device", default="auto", help="device for the launched app (default: auto)")
    parser.add_argument("--clients", type=int, default=8, help="concurrent gradio_client users (default 8)")
    parser.add_argument("--requests", type=int, default=2, help="requests per client, one after another (default 2)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="per request (default 64)")
    parser.add_argument("--steps", type=int, default=4, help="max_denoising_steps per request (default 4)")
    parser.add_argument("--time-limit", type=float, default=300.0,
                        help="seconds for the concurrent phase; unfinished jobs are cancelled (default 300)")
    parser.add_argument("--no-verify", action="store_true", help="skip re-running each request alone")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse options, launch or target the app, run the load test, print the report; 0 if all completed and
    matched their solo runs."""
    args = build_parser().parse_args(argv)
    if args.clients < 1 or args.requests < 1 or args.time_limit <= 0:
        raise SystemExit("error: --clients and --requests must be at least 1, --time-limit positive")
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    settings = dict(raw=True, max_new_tokens=args.max_new_tokens, max_denoising_steps=args.steps, entropy_bound=0.5,
                    t_min=0.4, t_max=0.8, stability_threshold=1, confidence_threshold=0.05, adaptive_stopping=True)
    with contextlib.nullcontext((args.url, None)) if args.url else launched_app(args.model, args.device) as (url, _):
        report, _ = load_test(url, clients=args.clients, requests=args.requests, settings=settings,
                              time_limit_s=args.time_limit, verify=not args.no_verify)
    if args.json:
        print(json.dumps(json_safe(asdict(report))))
    else:
        print(format_table(report))
    complete = report.completed == report.sent == args.clients * args.requests
    return 0 if complete and (report.all_matched or args.no_verify) else 1


def json_safe(value):
    """`value` with NaN and infinities replaced by None (strict JSON)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_safe(v) for v in value]
    return value


if __name__ == "__main__":
    sys.exit(main())
