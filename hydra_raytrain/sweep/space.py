"""Hydra's sweep grammar as trials: pure functions, no Ray.

    a=1,2  a=choice(1,2)  a=range(1,4)     categorical / grid: every value, crossed with the other grids
    a=interval(0,1)                        uniform (Hydra parses interval ends as floats)
    a=tag(log,interval(1e-4,1e-1))         log-uniform
``num_samples`` repeats the grid, drawing new values of the sampled parameters each time (Tune's
semantics). Draws come from a seeded generator, so the same command gives the same trials: that is what
lets an interrupted sweep resume.
"""

from __future__ import annotations

import itertools
import math
import random
from typing import List, Sequence

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import IntervalSweep, Override


def trial_overrides(arguments: Sequence[str], num_samples: int = 1, seed: int = 0) -> List[List[str]]:
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
    interval: IntervalSweep = override.value()
    low, high = interval.start, interval.end
    if "log" in interval.tags:
        return repr(math.exp(generator.uniform(math.log(low), math.log(high))))
    return repr(generator.uniform(low, high))
