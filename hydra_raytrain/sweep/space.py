"""Hydra's sweep grammar as trials: pure functions, no Ray.

    a=1,2  a=choice(1,2)  a=range(1,4)     categorical / grid: every value, crossed with the other grids
    a=interval(0,1)                        uniform (Hydra parses interval ends as floats)
    a=tag(log,interval(1e-4,1e-1))         log-uniform
``num_samples`` repeats the grid, drawing new values of the sampled parameters each time (Tune's
semantics). Draws come from a seeded generator, so the same command gives the same trials: that is what
lets an interrupted sweep resume.

For a search algorithm (``hydra.sweeper.search_alg=optuna``) the same grammar is a search space instead:
``parameter_space`` gives the fixed overrides and one ``Parameter`` per swept key, nothing crossed.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import IntervalSweep, Override


def start_order(indices: Sequence[int], shuffle: bool, seed: int = 0) -> list[int]:
    """The order trials start in: as given, or (for ASHA) a seeded shuffle. Asynchronous halving can only stop
    a trial that is worse than the trials already seen at its rung, so a list written in order of quality (a
    learning rate grid written ascending: each trial better than the last) would stop none; in a random order
    it stops about as many as halving promises, and the same seed gives the same order (a re-run resumes)."""
    order = list(indices)
    if shuffle:
        random.Random(seed).shuffle(order)
    return order


def trial_overrides(arguments: Sequence[str], num_samples: int = 1, seed: int = 0) -> list[list[str]]:
    """Each trial's overrides, in a stable order: samples outermost, then the grid (last key fastest)."""
    overrides = OverridesParser.create().parse_overrides(list(arguments))
    grid, sampled = [], []
    for override in overrides:
        key = override.get_key_element()
        if not override.is_sweep_override():
            grid.append([f"{key}={override.get_value_element_as_str()}"])
        elif override.is_discrete_sweep():
            grid.append([f"{key}={value}" for value in override.sweep_string_iterator()])
        else:
            sampled.append(override)
    generator = random.Random(seed)
    trials = []
    for _ in range(num_samples if sampled else 1):
        draws = [f"{o.get_key_element()}={_draw(o, generator)}" for o in sampled]
        trials += [list(combination) + draws for combination in itertools.product(*grid)]
    return trials


def _draw(override: Override, generator: random.Random) -> str:
    interval = override.value()
    assert isinstance(interval, IntervalSweep) and interval.start is not None and interval.end is not None
    low, high = interval.start, interval.end
    if "log" in interval.tags:
        return repr(math.exp(generator.uniform(math.log(low), math.log(high))))
    return repr(generator.uniform(low, high))


@dataclass(frozen=True)
class Parameter:
    """One swept key as a search algorithm sees it: categorical choices (Hydra's value strings) or a float range."""

    choices: tuple[str, ...] | None = None
    low: float | None = None
    high: float | None = None
    log: bool = False

    @property
    def bounds(self) -> tuple[float, float]:
        """(low, high) of a range."""
        assert self.low is not None and self.high is not None, "a range, not choices"
        return self.low, self.high

    def override(self, key: str, value) -> str:
        return f"{key}={value}" if self.choices is not None else f"{key}={float(value)!r}"


def parameter_space(arguments: Sequence[str]) -> tuple[list[str], dict[str, Parameter]]:
    """(the overrides every trial shares, the swept keys' parameters)."""
    fixed, space = [], {}
    for override in OverridesParser.create().parse_overrides(list(arguments)):
        key = override.get_key_element()
        if not override.is_sweep_override():
            fixed.append(f"{key}={override.get_value_element_as_str()}")
        elif override.is_discrete_sweep():
            space[key] = Parameter(choices=tuple(override.sweep_string_iterator()))
        else:
            interval = override.value()
            assert isinstance(interval, IntervalSweep) and interval.start is not None and interval.end is not None
            space[key] = Parameter(low=float(interval.start), high=float(interval.end), log="log" in interval.tags)
    return fixed, space
