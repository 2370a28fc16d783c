"""Many users at once: no cross-talk between runs, queue positions, and clients that leave free their worker.

Runs go through the served app (`served_app`) with `gradio_client`, one `Client` (one Gradio session) per user.
A run's tokens depend only on its own seed (the engine keeps a per-run RNG state), so every concurrent result must
equal the same request run alone. When more runs arrive than the queue's concurrency limit, the waiting jobs report
their position (`Job.status().rank`). A client that cancels its job, closes, is killed, or a browser page that
closes, must free its worker within about one decoder forward: that is measured on the app's own state (the run
registry and the worker threads) and printed.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from gradio_client import Client
from gradio_client.utils import Status

from benchmarks import load as load_bench
from diffgemma_ui.hub import RUN_INPUT_NAMES
from diffgemma_ui.validation import parse_run
from pages import open_page, set_up_a_long_run

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parent.parent
# raw, max_new_tokens, max_denoising_steps, entropy_bound, t_min, t_max, stability_threshold, confidence_threshold,
# adaptive_stopping (seed follows)
SMALL = (True, 128, 3, 0.5, 0.4, 0.8, 1, 0.05, True)
LONG = (True, 1024, 64, 0.5, 0.4, 0.8, 1, 0.05, False)  # 1,024 forwards: minutes; every test cancels it
PROMPTS = [
    "In the beginning", "The Lord is my shepherd", "Blessed are the", "And it came to pass",
    "Let there be light", "In my father's house", "The word of the Lord came", "Now these are the names",
    "A wise son maketh", "Vanity of vanities",
]


def run_threads() -> list[threading.Thread]:
    """The live worker threads of runs (`RunWorker` names them diffgemma-run)."""
    return [t for t in threading.enumerate() if t.name == "diffgemma-run" and t.is_alive()]


def wait_until(predicate, timeout: float, interval: float = 0.01) -> bool:
    """Poll `predicate` until it is true or `timeout` seconds pass; returns its last value."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)
    return True


def solo_token_ids(engine, prompt: str, seed: int, params=SMALL) -> list[int]:
    """The token ids of the request run alone, straight on the engine, validated exactly as the API does."""
    request = parse_run(dict(zip(RUN_INPUT_NAMES, (prompt, *params, seed))), ui_limits=False)
    return engine.generate(request.prompt, request.settings, raw=request.raw, seed=request.seed).token_ids


@pytest.fixture(scope="module")
def forward_s(engine) -> float:
    """Seconds per decoder forward on this machine right now (a warm solo run; the machine may be loaded)."""
    solo_token_ids(engine, PROMPTS[0], 0)
    started = time.perf_counter()
    request = parse_run(dict(zip(RUN_INPUT_NAMES, (PROMPTS[0], True, 64, 8, 0.5, 0.4, 0.8, 1, 0.05, False, 0))),
                        ui_limits=False)
    result = engine.generate(request.prompt, request.settings, raw=True, seed=0)
    seconds = (time.perf_counter() - started) / result.frames
    print(f"\n[concurrency] one decoder forward takes {seconds * 1000:.0f} ms here")
    return seconds


@pytest.fixture
def app(served_app):
    """The served app; afterwards every run it still has is stopped and its thread awaited."""
    app, _ = served_app
    yield app
    registry = app.hub.runs
    for key in list(registry._runs):
        registry.stop(key)
    assert wait_until(lambda: not run_threads(), 30), "runs still alive after the test"


def new_client(url: str):
    return Client(url, verbose=False)


def freed_bound(forward_s: float, runs: int = 1) -> float:
    """How long freeing `runs` workers may take: the in-flight forwards (up to one per run, each as slow as the runs
    sharing the cores make it), tripled for a loaded machine, plus two seconds of request and polling latency.
    Without the fix a cancelled run went on for its whole length (minutes here)."""
    return 2.0 + 3 * runs * forward_s


def test_eight_clients_at_once_match_their_solo_runs(app, engine, served_app):
    """Eight Gradio sessions submit at the same moment: all complete, runs overlap, no result depends on another."""
    url = served_app[1]
    limit = app.queue_plan.concurrency
    if limit < 2:
        pytest.skip("this app's queue runs one run at a time (torch threads x 2 > CPUs): run with OMP_NUM_THREADS=1")
    users = [(PROMPTS[i], 100 + 7 * i) for i in range(8)]
    solo = [solo_token_ids(engine, prompt, seed) for prompt, seed in users]
    clients = [new_client(url) for _ in users]
    barrier = threading.Barrier(len(users))
    results: list = [None] * len(users)
    most_active = 0
    done = threading.Event()

    def watch():
        nonlocal most_active
        while not done.is_set():
            most_active = max(most_active, app.hub.runs.active())
            time.sleep(0.01)

    def user(i):
        prompt, seed = users[i]
        barrier.wait()
        started = time.perf_counter()
        try:
            _, summary = clients[i].predict(prompt, *SMALL, seed, api_name="/generate")
            results[i] = (summary, time.perf_counter() - started)
        except Exception as error:  # noqa: BLE001 - reported below
            results[i] = (error, time.perf_counter() - started)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    threads = [threading.Thread(target=user, args=(i,)) for i in range(len(users))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(240)
    done.set()
    for client in clients:
        client.close()
    failures = [r for r in results if r is None or isinstance(r[0], Exception)]
    assert not failures, failures
    for (prompt, seed), expected, (summary, _) in zip(users, solo, results):
        assert summary["seed"] == seed
        assert summary["token_ids"] == expected, f"cross-talk: {prompt!r} seed {seed} differs from its solo run"
    latencies = sorted(r[1] for r in results)
    print(f"\n[concurrency] 8 clients: latency min {latencies[0]:.2f} s, max {latencies[-1]:.2f} s; "
          f"at most {most_active} runs at once (limit {limit})")
    assert most_active >= 2, "the runs never overlapped: this test did not exercise concurrency"
    assert most_active <= limit


def test_saturated_queue_reports_positions_and_cancelling_frees_the_slots(app, engine, served_app, forward_s):
    """With every slot busy, waiting jobs report their queue position; cancelling the busy jobs lets them run."""
    url = served_app[1]
    limit = app.queue_plan.concurrency
    busy_clients = [new_client(url) for _ in range(limit)]
    busy = [c.submit(PROMPTS[i], *LONG, i, api_name="/generate") for i, c in enumerate(busy_clients)]
    assert wait_until(lambda: app.hub.runs.active() == limit, 60), "the long runs did not all start"
    long_threads = run_threads()
    assert len(long_threads) == limit

    waiting_users = [(PROMPTS[8], 801), (PROMPTS[9], 902)]
    waiting_clients = [new_client(url) for _ in waiting_users]
    waiting = [c.submit(p, *SMALL, s, api_name="/generate") for c, (p, s) in zip(waiting_clients, waiting_users)]
    seen: list[dict] = [{} for _ in waiting]

    def queued_with_rank():
        for job, ranks in zip(waiting, seen):
            status = job.status()
            if status.code == Status.IN_QUEUE and status.rank is not None:
                ranks[status.rank] = status.queue_size
        return all(seen)

    assert wait_until(queued_with_rank, 30), f"no queue position reported: {[j.status() for j in waiting]}"
    time.sleep(0.3)
    queued_with_rank()
    assert app.hub.runs.active() == limit  # nothing jumped the queue
    ranks = [sorted(r) for r in seen]
    print(f"\n[concurrency] queued jobs reported positions (rank: queue size) {seen}")
    assert all(isinstance(rank, int) and rank >= 0 for r in ranks for rank in r)
    assert {r[-1] for r in ranks} == {0, 1}, ranks  # two waiting jobs: positions 0 and 1

    cancelled = time.monotonic()
    for job in busy:
        job.cancel()
    assert wait_until(lambda: not any(t.is_alive() for t in long_threads), 30)
    freed = time.monotonic() - cancelled
    print(f"[concurrency] {limit} cancelled runs freed their workers in {freed:.2f} s")
    assert freed <= freed_bound(forward_s, limit), f"{freed:.2f} s to free {limit} workers"
    for job, (prompt, seed) in zip(waiting, waiting_users):
        _, summary = job.result(timeout=120)
        assert summary["token_ids"] == solo_token_ids(engine, prompt, seed)
    for client in busy_clients + waiting_clients:
        client.close()


def start_long_run(app, client):
    """Submit a long run and wait until its worker is busy with decoder forwards; returns (job, worker thread)."""
    job = client.submit(PROMPTS[1], *LONG, 5, api_name="/generate")
    assert wait_until(lambda: app.hub.runs.active() == 1, 60), "the run did not start"
    thread = run_threads()[0]
    time.sleep(0.5)  # a few forwards in
    assert thread.is_alive() and app.hub.runs.active() == 1
    return job, thread


def assert_freed(app, thread, since: float, bound: float, what: str) -> float:
    """Wait for the worker to end and the registry to forget it; returns the seconds it took (checked < bound)."""
    assert wait_until(lambda: not thread.is_alive() and app.hub.runs.active() == 0, 45), f"{what}: busy"
    freed = time.monotonic() - since
    print(f"\n[concurrency] {what}: worker freed {freed:.2f} s later (bound {bound:.2f} s)")
    assert freed <= bound, f"{what}: worker freed only after {freed:.2f} s"
    return freed


def test_a_cancelled_job_frees_its_worker_within_a_forward_and_the_next_run_starts(app, engine, served_app,
                                                                                    forward_s):
    client = new_client(served_app[1])
    job, thread = start_long_run(app, client)
    cancelled = time.monotonic()
    job.cancel()
    assert_freed(app, thread, cancelled, freed_bound(forward_s), "job cancelled")
    started = time.perf_counter()
    _, summary = client.predict(PROMPTS[2], *SMALL, 9, api_name="/generate")
    took = time.perf_counter() - started
    print(f"[concurrency] the next run took {took:.2f} s ({summary['forwards']} forwards)")
    assert summary["token_ids"] == solo_token_ids(engine, PROMPTS[2], 9)
    assert took <= 5.0 + 4 * summary["forwards"] * forward_s  # not stuck behind the cancelled run
    client.close()


def test_a_closed_client_frees_its_worker(app, served_app, forward_s, monkeypatch):
    """`Client.close()` ends its heartbeat connection at the next heartbeat; the server's unload stops the run."""
    heartbeat = 0.5
    monkeypatch.setenv("GRADIO_HEARTBEAT_INTERVAL", str(heartbeat))  # read per connection by the in-process server
    client = new_client(served_app[1])
    _, thread = start_long_run(app, client)
    closed = time.monotonic()
    client.close()
    assert_freed(app, thread, closed, heartbeat + freed_bound(forward_s), "client closed")


CLIENT_SCRIPT = """
import sys, time
from gradio_client import Client
client = Client(sys.argv[1], verbose=False)
client.submit("The Lord is my shepherd", True, 1024, 64, 0.5, 0.4, 0.8, 1, 0.05, False, 5, api_name="/generate")
print("submitted", flush=True)
time.sleep(600)
"""


def test_a_killed_client_process_frees_its_worker(app, served_app, forward_s):
    """A client process that dies mid-run (its sockets close): the server notices and stops the run."""
    process = subprocess.Popen([sys.executable, "-c", CLIENT_SCRIPT, served_app[1]], stdout=subprocess.PIPE,
                               text=True, cwd=REPO)
    try:
        assert process.stdout.readline().strip() == "submitted"
        assert wait_until(lambda: app.hub.runs.active() == 1, 60), "the run did not start"
        thread = run_threads()[0]
        time.sleep(0.5)
        killed = time.monotonic()
        process.kill()
        process.wait(10)
        assert_freed(app, thread, killed, 3.0 + freed_bound(forward_s), "client process killed")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)


def test_closing_the_browser_page_frees_its_worker(app, served_app, forward_s, browser):
    page, _ = open_page(browser, served_app[1])
    set_up_a_long_run(page)
    page.click("#dg-generate")
    page.wait_for_selector(".dg-meter[data-state='running']", timeout=60_000)
    assert app.hub.runs.active() == 1
    thread = run_threads()[0]
    closed = time.monotonic()
    page.close()
    assert_freed(app, thread, closed, 2.0 + freed_bound(forward_s), "browser page closed")


def test_the_load_test_benchmark_runs_and_checks_solo_runs(app, served_app):
    """`benchmarks/load.py` in process, small: every request completes and matches its solo run."""
    load_test = load_bench
    report, outcomes = load_test.load_test(served_app[1], clients=3, requests=1, time_limit_s=120,
                                           settings=dict(raw=True, max_new_tokens=64, max_denoising_steps=2,
                                                         entropy_bound=0.5, t_min=0.4, t_max=0.8,
                                                         stability_threshold=1, confidence_threshold=0.05,
                                                         adaptive_stopping=True))
    assert (report.sent, report.completed, report.errors) == (3, 3, 0), report
    assert report.all_matched and report.solo_matched == 3
    assert (report.solo.clients, report.solo.completed, report.concurrent.clients) == (1, 3, 3)
    for phase in (report.solo, report.concurrent):
        assert phase.p50_s <= phase.p95_s <= phase.max_s <= phase.wall_s
        assert phase.runs_per_s == pytest.approx(phase.completed / phase.wall_s)
    assert report.speedup == pytest.approx(report.concurrent.runs_per_s / report.solo.runs_per_s)
    assert len({(o.prompt, o.seed) for o in outcomes}) == 3
    table = load_test.format_table(report)
    assert "matched the solo run" in table and f"{report.speedup:.2f}x" in table
    with pytest.raises(SystemExit, match="loopback"):
        load_test.check_loopback("http://example.com:7860/")
    assert load_test.percentile([3.0, 1.0, 2.0, 4.0], 50) == 2.0
