"""``hydra.sweeper.*`` of ``hydra/sweeper=ray_tune``: the one place its settings and defaults live. The Hydra
plugin's config node extends this dataclass, so this module stays import-light (Hydra imports the plugin on every
start-up) and, like the plugin, has no ``from __future__ import annotations`` (OmegaConf reads the field types).
"""

from dataclasses import dataclass

SCHEDULERS = ("fifo", "asha", "hyperband", "pbt", "pb2")
EVOLVING = ("pbt", "pb2")  # Population Based Training, and its bandit variant
PAUSING = ("hyperband", *EVOLVING)  # their trials report checkpoints to Tune, which stops and restarts them
SEARCH_ALGS = ("basic", "optuna", "bohb")
EXTRAS = {"optuna": ("optuna",), "bohb": ("hpbandster", "ConfigSpace")}  # what each search needs installed


@dataclass
class SweepSettings:
    metric: str | None = None  # None: the task's monitor (val_accuracy for classification, val_loss for regression)
    mode: str | None = None  # "max" / "min"; None: the task's
    # basic: the grid x num_samples seeded draws (Tune's BasicVariantGenerator); optuna: TPE; bohb: BOHB's
    # model-based search inside HyperBand's brackets (scheduler=hyperband)
    search_alg: str = "basic"
    num_samples: int = 1  # basic: repeats of the grid, with new draws of interval() parameters; optuna: trials in all
    seed: int = 0  # of those draws (and of the ASHA start order): the same command gives the same trials
    max_concurrent_trials: int | None = None  # None: as many as the cluster holds
    # fifo; asha (stops weak trials at epoch boundaries; the grid starts in a seeded random order); hyperband
    # (synchronous successive halving in brackets: trials pause at each milestone, the best continue); pbt
    # (Population Based Training: every perturbation_interval epochs, weak trials continue a strong one with
    # perturbed settings); pb2 (the same, new values from a bandit over the intervals' bounds)
    scheduler: str = "fifo"
    grace_period: int = 1  # ASHA: epochs every trial gets before it can be stopped
    reduction_factor: float = 4.0  # ASHA, HyperBand: keep 1/reduction_factor of the trials at each rung
    keep_checkpoints: int | None = None  # keep only the best K trials' checkpoints (None: all)
    perturbation_interval: int = 2  # PBT: epochs between a trial's exploit / explore decisions
    quantile_fraction: float = 0.25  # PBT: the bottom fraction of trials continue one of the top fraction
    resample_probability: float = 0.25  # PBT: chance a perturbed setting is drawn anew instead of nudged
    # PBT: run a population the cluster cannot hold alive together anyway (warned) instead of refusing it
    allow_partial_population: bool = False

    def check(self) -> None:
        from hydra_raytrain.config import ConfigError

        if self.scheduler not in SCHEDULERS:
            raise ConfigError("hydra.sweeper.scheduler", self.scheduler, "unknown scheduler.", ", ".join(SCHEDULERS))
        if self.search_alg not in SEARCH_ALGS:
            raise ConfigError(
                "hydra.sweeper.search_alg", self.search_alg, "unknown search algorithm.", ", ".join(SEARCH_ALGS)
            )
        self._check_installed()
        if self.mode not in (None, "max", "min"):
            raise ConfigError("hydra.sweeper.mode", self.mode, "unknown mode.", "max, min")
        counts = ("num_samples", "grace_period", "max_concurrent_trials", "keep_checkpoints", "perturbation_interval")
        for key in counts:
            value = getattr(self, key)
            if value is not None and value < 1:
                raise ConfigError(f"hydra.sweeper.{key}", value, "must be >= 1.")
        if self.scheduler in ("asha", "hyperband") and not self.reduction_factor > 1:
            raise ConfigError(
                "hydra.sweeper.reduction_factor",
                self.reduction_factor,
                f"{self.scheduler} keeps 1/reduction_factor of the trials at each rung: it must be > 1.",
                "e.g. 2, 3 or 4",
            )
        if self.scheduler in PAUSING:
            self._check_pausing()

    def _check_installed(self) -> None:
        """A search algorithm's own packages (an extra of this package)."""
        import importlib.util

        from hydra_raytrain.config import ConfigError

        missing = [name for name in EXTRAS.get(self.search_alg, ()) if importlib.util.find_spec(name) is None]
        if missing:
            raise ConfigError(
                "hydra.sweeper.search_alg",
                self.search_alg,
                f"needs {' and '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} not installed.",
                f"pip install 'hydra_raytrain[{self.search_alg}]', or search_alg=basic",
            )
        if self.search_alg == "bohb" and self.scheduler != "hyperband":
            raise ConfigError(
                "hydra.sweeper.search_alg",
                "bohb",
                f"is BOHB's model-based search inside HyperBand's brackets, not under scheduler={self.scheduler}.",
                "hydra.sweeper.scheduler=hyperband hydra.sweeper.search_alg=bohb",
            )

    def _check_pausing(self) -> None:
        from hydra_raytrain.config import ConfigError

        if self.search_alg == "optuna" and self.scheduler == "hyperband":
            raise ConfigError(
                "hydra.sweeper.search_alg",
                self.search_alg,
                "cannot suggest trials under hyperband: a model-based search inside HyperBand's brackets is BOHB.",
                "search_alg=bohb (or basic) with scheduler=hyperband, or scheduler=asha with search_alg=optuna",
            )
        if self.search_alg != "basic" and self.scheduler in EVOLVING:
            raise ConfigError(
                "hydra.sweeper.search_alg",
                self.search_alg,
                f"cannot suggest trials under {self.scheduler}: it explores by perturbing the trials it has.",
                f"search_alg=basic with scheduler={self.scheduler} (a grid, or interval() draws with num_samples)",
            )
        if self.scheduler in EVOLVING:
            self._check_pbt()

    def _check_pbt(self) -> None:
        from hydra_raytrain.config import ConfigError

        if self.scheduler == "pb2":
            try:
                import sklearn  # noqa: F401
            except ImportError:
                raise ConfigError(
                    "hydra.sweeper.scheduler",
                    "pb2",
                    "needs scikit-learn, which is not installed.",
                    "pip install scikit-learn",
                ) from None
        if not 0 < self.quantile_fraction <= 0.5:
            raise ConfigError(
                "hydra.sweeper.quantile_fraction",
                self.quantile_fraction,
                "the bottom fraction of trials that continue one of the top fraction: it must be in (0, 0.5].",
            )
        if not 0 <= self.resample_probability <= 1:
            raise ConfigError(
                "hydra.sweeper.resample_probability", self.resample_probability, "is a probability: 0 to 1."
            )
