"""Per-run random streams: the draws of `torch.manual_seed(seed)`, from this thread only, the global RNG untouched."""

import threading

import pytest
import torch

from engine.randomness import DRAWING_FUNCTIONS, RunRandomState, draw_device


def every_kind_of_draw() -> list[torch.Tensor]:
    """One direct call of each random torch function and tensor method, on the CPU."""
    probs = torch.softmax(torch.arange(40.0).view(4, 10) / 7, dim=-1)
    t = torch.empty(6)
    return [
        torch.randint(0, 4096, (1, 64)), torch.randint(9, (5,)), torch.rand(3, 2), torch.randn(4), torch.randperm(12),
        torch.multinomial(probs, 1), probs.multinomial(2), torch.normal(torch.zeros(5), 1.0),
        torch.normal(0.0, 1.0, (3,)), torch.bernoulli(torch.full((8,), 0.5)), torch.poisson(torch.full((4,), 3.0)),
        torch.rand_like(t), torch.randn_like(t), torch.randint_like(t, 10), t.clone().uniform_(), t.clone().normal_(),
        t.clone().exponential_(), t.clone().random_(0, 100), t.clone().bernoulli_(0.3), t.clone().cauchy_(),
        t.clone().geometric_(0.4), t.clone().log_normal_(),
    ]


def test_a_run_draws_what_manual_seed_draws_and_leaves_the_global_rng_alone():
    torch.manual_seed(42)
    expected = every_kind_of_draw()
    torch.manual_seed(7)
    before = torch.get_rng_state()
    with RunRandomState(42).active():
        got = every_kind_of_draw()
    assert all(torch.equal(a, b) for a, b in zip(expected, got, strict=True))
    assert torch.equal(torch.get_rng_state(), before)


def test_a_stream_goes_on_across_sections_and_a_reseed_restarts_it_as_manual_seed_would():
    torch.manual_seed(3)
    first, second = torch.rand(4), torch.rand(4)
    torch.manual_seed(9)
    after_reseed = torch.rand(4)
    run = RunRandomState(3)
    with run.active():
        got_first = torch.rand(4)
    with run.active():
        got_second = torch.rand(4)
        run.reseed(9)
        got_after = torch.rand(4)
    assert torch.equal(first, got_first) and torch.equal(second, got_second) and torch.equal(after_reseed, got_after)


def test_a_given_generator_is_used_as_given():
    with RunRandomState(1).active():
        got = torch.rand(3, generator=torch.Generator().manual_seed(5))
    assert torch.equal(got, torch.rand(3, generator=torch.Generator().manual_seed(5)))


def test_the_streams_are_this_threads_only():
    """While one thread is inside its run's `active()`, another thread draws from torch's global RNG as ever, and
    each gets its own numbers, whatever the interleaving."""
    torch.manual_seed(11)
    run_expected = [torch.rand(2) for _ in range(3)]
    torch.manual_seed(5)
    global_expected = [torch.rand(2) for _ in range(3)]
    inside, drawn = threading.Event(), threading.Event()
    got: dict[str, list] = {"run": [], "global": []}

    def run():
        with RunRandomState(11).active():
            got["run"].append(torch.rand(2))
            inside.set()
            assert drawn.wait(10)
            got["run"] += [torch.rand(2), torch.rand(2)]

    torch.manual_seed(5)
    worker = threading.Thread(target=run)
    worker.start()
    assert inside.wait(10)
    got["global"] = [torch.rand(2) for _ in range(3)]  # this thread, while the run's streams are active there
    drawn.set()
    worker.join(10)
    assert all(torch.equal(a, b) for a, b in zip(got["run"], run_expected, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(got["global"], global_expected, strict=True))


def test_without_draws_sets_the_streams_aside_only_for_the_call():
    run = RunRandomState(2)
    torch.manual_seed(2)
    expected = torch.rand(2)
    torch.manual_seed(0)
    global_draw = torch.rand(2)
    torch.manual_seed(0)
    with run.active():
        aside = run.without_draws(torch.rand)(2)  # a forward would draw nothing: this one shows where it would go
        again = torch.rand(2)
    assert torch.equal(aside, global_draw) and torch.equal(again, expected)


def test_on_global_generators_loads_the_run_into_torchs_generator_and_saves_it_back():
    """The compiled path: the body draws through the global generator, which holds the run's stream, and gets its own
    state back afterwards; the run's stream goes on where the body left it."""
    torch.manual_seed(8)
    expected = [torch.rand(3), torch.rand(3)]
    torch.manual_seed(1)
    before = torch.get_rng_state()
    run = RunRandomState(8)
    with run.on_global_generators(torch.device("cpu")):
        first = torch.rand(3)
    assert torch.equal(torch.get_rng_state(), before)
    with run.active():
        second = torch.rand(3)
    assert torch.equal(first, expected[0]) and torch.equal(second, expected[1])


def test_every_random_torch_function_is_given_the_runs_generator():
    """Every public torch function and tensor method whose operator takes a generator is in `DRAWING_FUNCTIONS`, so a
    library's random call cannot slip past a run onto the global RNG."""
    taking = {schema.name.split("::")[1] for schema in torch._C._jit_get_all_schemas()
              if any(argument.name == "generator" for argument in schema.arguments)}
    public = {getattr(torch, name) for name in taking if callable(getattr(torch, name, None))
              and not name.startswith("_")} - {torch.random}
    methods = {getattr(torch.Tensor, name) for name in taking if hasattr(torch.Tensor, name)}
    assert public | methods <= DRAWING_FUNCTIONS


@pytest.mark.parametrize(("args", "kwargs", "device"), [
    ((0, 5, (2,)), {}, "cpu"), ((0, 5, (2,)), {"device": "meta"}, "meta"), ((torch.empty(2, device="meta"),), {},
                                                                            "meta"),
    ((1.0,), {"out": torch.empty(2, device="meta")}, "meta"),
])
def test_a_draw_is_on_its_device_argument_output_or_first_tensor(args, kwargs, device):
    assert draw_device(args, kwargs) == torch.device(device)
