"""Per-run random streams: each run draws from its own `torch.Generator`s, seeded as `torch.manual_seed(seed)` seeds
torch's global ones, so that runs in different threads draw in parallel and a seed gives `generate()`'s tokens
(docs/engine-notes.md: `RunRandomState`)."""

import threading
from collections.abc import Callable
from contextlib import contextmanager

import torch
from torch.overrides import TorchFunctionMode

from .settings import draw_seed

_GLOBAL_RNG_LOCK = threading.RLock()  # only for `RunRandomState.on_global_generators`
DRAWING_FUNCTIONS = frozenset(
    [getattr(torch, name) for name in ("bernoulli", "binomial", "multinomial", "normal", "poisson", "rand",
                                       "rand_like", "randint", "randint_like", "randn", "randn_like", "randperm",
                                       "rrelu", "rrelu_")]
    + [getattr(torch.Tensor, name) for name in ("bernoulli", "bernoulli_", "cauchy_", "exponential_", "geometric_",
                                                "log_normal_", "multinomial", "normal_", "random_", "uniform_")])


class RunRandomState:
    """One run's random streams, one `torch.Generator` per device, each seeded like `torch.manual_seed(seed)` seeds
    that device's global generator (None: a drawn seed); torch's global generators are never touched."""

    def __init__(self, seed: int | None):
        self.seed = draw_seed() if seed is None else seed
        self._stream_seed = self.seed
        self._generators: dict[torch.device, torch.Generator] = {}
        self._mode = _RunDraws(self)

    def generator(self, device: torch.device | str) -> torch.Generator:
        """This run's generator on `device` (made and seeded at first use)."""
        device = _concrete(torch.device(device))
        if device not in self._generators:
            self._generators[device] = torch.Generator(device).manual_seed(self._stream_seed)
        return self._generators[device]

    def reseed(self, seed: int) -> None:
        """Restart every stream of this run from `seed`, as `torch.manual_seed(seed)` would mid-run."""
        self._stream_seed = seed
        for generator in self._generators.values():
            generator.manual_seed(seed)

    def active(self) -> "_RunDraws":
        """A context in which torch's random calls made by this thread (any library's) draw from this run's
        streams, unless given a generator; other threads are unaffected and no lock is taken."""
        return self._mode

    def without_draws(self, function: Callable) -> Callable:
        """`function` run with this run's streams set aside (call it inside `active()`): for a forward, which draws
        nothing, so that its torch calls skip the per-call dispatch of `active()`."""
        mode = self._mode

        def undrawn(*args, **kwargs):
            mode.__exit__(None, None, None)
            try:
                return function(*args, **kwargs)
            finally:
                mode.__enter__()

        return undrawn

    @contextmanager
    def on_global_generators(self, device: torch.device):
        """The body draws from torch's global generators of the CPU and `device`, loaded with this run's streams and
        saved back after it, under a process-wide lock: for `torch.compile`d code, which cannot take a generator."""
        devices = list(dict.fromkeys([torch.device("cpu"), _concrete(torch.device(device))]))
        with _GLOBAL_RNG_LOCK:
            globals_ = [_global_generator(d) for d in devices]
            saved = [g.get_state() for g in globals_]
            for d, g in zip(devices, globals_):
                g.set_state(self.generator(d).get_state())
            try:
                yield
            finally:
                for d, g, state in zip(devices, globals_, saved):
                    self.generator(d).set_state(g.get_state())
                    g.set_state(state)


class _RunDraws(TorchFunctionMode):
    """Gives every random torch call without a generator its run's generator on the call's device."""

    def __init__(self, state: RunRandomState):
        super().__init__()
        self.state = state

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in DRAWING_FUNCTIONS and kwargs.get("generator") is None:
            kwargs = {**kwargs, "generator": self.state.generator(draw_device(args, kwargs))}
        return func(*args, **kwargs)


def draw_device(args: tuple, kwargs: dict) -> torch.device:
    """The device a random torch call draws on: its `device`, its `out`, its first tensor argument, else the
    default device."""
    if kwargs.get("device") is not None:
        return torch.device(kwargs["device"])
    tensor = kwargs.get("out")
    if not isinstance(tensor, torch.Tensor):
        tensor = next((arg for arg in args if isinstance(arg, torch.Tensor)), None)
    return tensor.device if tensor is not None else torch.get_default_device()


def _concrete(device: torch.device) -> torch.device:
    """`device` with the current CUDA index where it names none (a generator is bound to one device)."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def _global_generator(device: torch.device) -> torch.Generator:
    """torch's global generator of a concrete CPU or CUDA `device`; `ValueError` for another device type."""
    if device.type == "cuda":
        torch.cuda.init()  # fills `default_generators`
        return torch.cuda.default_generators[device.index]
    if device.type == "cpu":
        return torch.default_generator
    raise ValueError(f"compiled runs draw on the CPU or CUDA, not on {device.type}")
