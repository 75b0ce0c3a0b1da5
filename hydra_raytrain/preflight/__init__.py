"""The driver's preflight: every check a config can fail before Ray starts, reported together.

    validate.py   validate(cfg, cwd) -> Resolved: each section, then the checks across sections, then a rehearsal
    targets.py    every _target_ imports and takes its arguments; path arguments made absolute
    typecheck.py  a value of a plainly wrong type for an argument's annotation
    rehearsal.py  the dataset, models and task built, and one validation step run on a few samples
    replaced.py   a _target_ set on the command line starts its node afresh
    resolvers.py  ${run_name:} (the run dir's identity of a composed config) and the dataset resolvers

It stands above what it builds (``data``, ``models``, ``tasks``, ``recipe``) and below the driver, which adds the
resource checks (``driver/plan.py``). ``python -m hydra_raytrain.check`` runs the same checks without Ray.

Nothing is imported here: ``hydra_raytrain.conf`` imports ``resolvers.py`` (which loads neither torch nor Ray) to
register them, and ``from hydra_raytrain.preflight.validate import validate`` names the function, not a module.
"""
