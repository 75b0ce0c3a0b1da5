"""Hydra multirun mapped onto Ray Tune: each job of a sweep is a Tune trial that runs a whole Ray Train run.

    space.py    Hydra's sweep grammar -> the trials' override lists (grid x sampled values, seeded), or a search space
    search.py   a search algorithm's (Optuna's) suggestions -> composed Hydra jobs, earlier trials replayed
    trial.py    the Tune function trainable: one trial = hydra_raytrain.train() on the trial's config
    results.py  sweep_summary.json / .csv, best_config.yaml, sweep.png, the summary table
    tuner.py    the sweep itself: compose and check every trial, size the cluster, run the Tuner
The Hydra plugin (hydra_plugins/hydra_raytrain_sweeper) is a thin shell around tuner.py; its settings,
hydra.sweeper.* (SweepSettings), are typed in config/sweeper.py.
"""
