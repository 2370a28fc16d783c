"""Load test of the playground's /generate API: one client alone, then N concurrent gradio_client users.

    python -m benchmarks.load                      # launches app.py on a free loopback port (embedded model)
    python -m benchmarks.load --url http://127.0.0.1:7860/ --clients 8 --requests 2 --json

Two phases over the same requests (`--clients` x `--requests`, each with its own prompt and seed), each within
`--time-limit` (unfinished jobs are cancelled). Solo: one client sends them all one after another. Concurrent: every
client, its own Gradio session, sends its `--requests` one after another, all clients at once; queue positions are
polled meanwhile. Each concurrent result's token ids must equal its solo run's (per-run random streams). Reports, per
phase, completed runs, latency p50/p95/max (queue wait included), throughput and the mean cores busy (the server when
launched here, this load generator, every other process) with the server's CPU seconds per run; the concurrent
throughput over the solo one; the largest queue position; the solo check. Only loopback URLs are accepted. Exit
status 0 when every request completed in both phases and matched. Server memory per browser visitor:
`python -m benchmarks.browser sessions`.
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
from concurrent import futures
from dataclasses import asdict, dataclass, field

import psutil
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
class Phase:
    """One phase's figures: its runs, latency (seconds, queue wait included), throughput and mean cores busy."""

    clients: int
    sent: int = 0
    completed: int = 0
    p50_s: float = math.nan
    p95_s: float = math.nan
    max_s: float = math.nan
    wall_s: float = math.nan
    runs_per_s: float = math.nan
    server_cores: float | None = None
    client_cores: float = math.nan
    other_cores: float = math.nan
    cores: int = 0


@dataclass
class Report:
    """The load test's figures (see the module docstring)."""

    url: str
    clients: int
    requests_per_client: int
    settings: dict
    solo: Phase | None = None
    concurrent: Phase | None = None
    speedup: float = math.nan
    sent: int = 0
    completed: int = 0
    errors: int = 0
    error_messages: list[str] = field(default_factory=list)
    max_queue_position: int | None = None
    solo_checked: int = 0
    solo_matched: int = 0
    all_matched: bool = False
    load_average_1m: float | None = None


class CpuMeter:
    """Mean cores busy and wall seconds from `start()` to `stop()`: the process `server_pid` (None: not told apart),
    this process, and the rest of the machine (other processes, and time the hypervisor took)."""

    def __init__(self, server_pid: int | None = None):
        self.server = psutil.Process(server_pid) if server_pid is not None else None
        self.own = psutil.Process()

    def _sample(self) -> tuple[float, float | None, float, float]:
        machine = psutil.cpu_times()
        unused = machine.idle + getattr(machine, "iowait", 0.0)
        guests = getattr(machine, "guest", 0.0) + getattr(machine, "guest_nice", 0.0)  # already in user time
        busy = sum(machine) - guests - unused
        own = sum(self.own.cpu_times()[:2])
        server = sum(self.server.cpu_times()[:2]) if self.server is not None else None
        return time.perf_counter(), server, own, busy

    def start(self) -> None:
        self._start = self._sample()

    def stop(self) -> None:
        self._end = self._sample()

    def into(self, phase: Phase) -> None:
        """Write the wall time and the measured shares into `phase`."""
        (t0, server0, own0, busy0), (t1, server1, own1, busy1) = self._start, self._end
        phase.wall_s = wall = max(t1 - t0, 1e-9)
        server = None if server0 is None or server1 is None else (server1 - server0) / wall
        phase.server_cores, phase.client_cores = server, (own1 - own0) / wall
        phase.other_cores = (busy1 - busy0) / wall - phase.client_cores - (server or 0.0)
        phase.cores = psutil.cpu_count() or 0


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
               outcomes: list[Outcome], lock: threading.Lock, finish: threading.Barrier | None = None) -> None:
    """One user: its own `Client` (Gradio session) sends `requests` requests one after another until `deadline`,
    between the `start` barrier and the `finish` one (both waited for by every user)."""

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
                futures.wait([job.future], timeout=0.05)  # back at once when it ends
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
        if finish is not None:
            finish.wait()
        client.close()


def run_phase(url: str, clients: int, requests: int, settings: dict, time_limit_s: float,
              server_pid: int | None) -> tuple[Phase, list[Outcome]]:
    """`clients` users at once, `requests` each, within `time_limit_s`: the phase's figures and its outcomes (sorted
    by client and seed)."""
    outcomes: list[Outcome] = []
    lock = threading.Lock()
    deadline = time.monotonic() + time_limit_s
    meter = CpuMeter(server_pid)
    # timed from every client connected to every client done (closing a client takes about a second)
    start, finish = threading.Barrier(clients, action=meter.start), threading.Barrier(clients, action=meter.stop)
    threads = [threading.Thread(target=run_client, args=(url, i, requests, settings, deadline, start, outcomes,
                                                         lock, finish), daemon=True) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(1.0, deadline - time.monotonic() + 30))
    outcomes.sort(key=lambda o: (o.client, o.seed))
    latencies = [o.latency_s for o in outcomes if o.token_ids is not None]
    phase = Phase(clients=clients, sent=len(outcomes), completed=len(latencies), p50_s=percentile(latencies, 50),
                  p95_s=percentile(latencies, 95), max_s=max(latencies, default=math.nan))
    meter.into(phase)
    phase.runs_per_s = len(latencies) / phase.wall_s
    return phase, outcomes


def load_test(url: str, *, clients: int = 8, requests: int = 2, settings: dict | None = None,
              time_limit_s: float = 300.0, verify: bool = True,
              server_pid: int | None = None) -> tuple[Report, list[Outcome]]:
    """Run the load test against the app at `url` (loopback only; `verify`: the solo phase too, `server_pid`: the
    server's process, for its CPU share); returns the report and every concurrent request's outcome."""
    url = check_loopback(url)
    settings = settings or dict(raw=True, max_new_tokens=64, max_denoising_steps=4, entropy_bound=0.5, t_min=0.4,
                                t_max=0.8, stability_threshold=1, confidence_threshold=0.05, adaptive_stopping=True)
    report = Report(url=url, clients=clients, requests_per_client=requests, settings=settings)
    solo_ids: dict[tuple[str, int], list[int]] = {}
    if verify:  # the same requests, numbered alike, from one client
        report.solo, solo_outcomes = run_phase(url, 1, clients * requests, settings, time_limit_s, server_pid)
        solo_ids = {(o.prompt, o.seed): o.token_ids for o in solo_outcomes if o.token_ids is not None}
    report.concurrent, outcomes = run_phase(url, clients, requests, settings, time_limit_s, server_pid)
    for outcome in outcomes:
        if outcome.token_ids is not None and (outcome.prompt, outcome.seed) in solo_ids:
            outcome.matched_solo = solo_ids[outcome.prompt, outcome.seed] == outcome.token_ids

    done = [o for o in outcomes if o.token_ids is not None]
    checked = [o for o in done if o.matched_solo is not None]
    ranks = [o.max_rank for o in outcomes if o.max_rank is not None]
    report.sent, report.completed, report.errors = len(outcomes), len(done), len(outcomes) - len(done)
    report.error_messages = sorted({o.error for o in outcomes if o.error})[:5]
    report.max_queue_position = max(ranks) if ranks else None
    report.solo_checked, report.solo_matched = len(checked), sum(1 for o in checked if o.matched_solo)
    report.load_average_1m = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    if report.solo is not None and report.solo.runs_per_s > 0:
        report.speedup = report.concurrent.runs_per_s / report.solo.runs_per_s
    report.all_matched = (report.completed == clients * requests and report.solo_checked == report.completed
                          and report.solo_matched == report.completed)
    return report, outcomes


def phase_rows(name: str, phase: Phase | None) -> list[tuple[str, str]]:
    """A phase's rows of the table (none when it did not run)."""
    if phase is None:
        return []
    server = "-" if phase.server_cores is None else f"{phase.server_cores:.2f}"
    return [
        (f"{name}: completed / sent", f"{phase.completed} / {phase.sent} ({phase.clients} client"
                                      f"{'s' * (phase.clients != 1)})"),
        (f"{name}: latency p50 / p95 / max", f"{phase.p50_s:.2f} s / {phase.p95_s:.2f} s / {phase.max_s:.2f} s"),
        (f"{name}: wall time, throughput", f"{phase.wall_s:.1f} s, {phase.runs_per_s:.2f} runs/s"),
        (f"{name}: cores busy (server, clients, others)", f"{server}, {phase.client_cores:.2f}, "
                                                          f"{phase.other_cores:.2f} of {phase.cores}"),
        (f"{name}: server CPU per run", "-" if phase.server_cores is None or not phase.completed
         else f"{phase.server_cores * phase.wall_s / phase.completed:.2f} s"),
    ]


def format_table(report: Report) -> str:
    """The report as an aligned two-column text table."""
    s = report.settings
    rows = [
        ("target", report.url),
        ("clients x requests", f"{report.clients} x {report.requests_per_client}"),
        ("settings", f"max_new_tokens {s['max_new_tokens']}, steps {s['max_denoising_steps']}, "
                     f"adaptive {s['adaptive_stopping']}"),
        *phase_rows("solo", report.solo),
        *phase_rows("concurrent", report.concurrent),
        ("throughput concurrent / solo", "-" if math.isnan(report.speedup) else f"{report.speedup:.2f}x"),
        ("sent / completed / errors", f"{report.sent} / {report.completed} / {report.errors}"),
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
                        help="seconds for each phase; unfinished jobs are cancelled (default 300)")
    parser.add_argument("--no-verify", action="store_true",
                        help="skip the solo phase (no solo throughput, no check against solo runs)")
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
    launched = contextlib.nullcontext((args.url, None)) if args.url else launched_app(args.model, args.device)
    with launched as (url, server):
        report, _ = load_test(url, clients=args.clients, requests=args.requests, settings=settings,
                              time_limit_s=args.time_limit, verify=not args.no_verify,
                              server_pid=server.pid if server is not None else None)
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
