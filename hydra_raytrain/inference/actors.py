"""The process of a model actor (predict's pool): its environment (the import path, the memory allocator) and
which allocator it runs on."""

from __future__ import annotations

import os

# jemalloc's setting for the actors: no separate arena for allocations of 8 MiB and more (which returns their pages
# at once), so a model's big activations are reused from batch to batch like the rest (and purged after its decay)
JEMALLOC_CONF = "oversize_threshold:0"
ALLOCATORS = ("jemalloc", "tcmalloc", "mimalloc")


def model_actor_env(import_path: str) -> dict[str, str]:
    """The environment of a model actor's process (predict's pool): the driver's import path (Ray's processes do
    not inherit its folder: the run's own modules import from it), and its memory allocator: the environment's
    ``LD_PRELOAD`` (even empty: the C library's malloc) and ``MALLOC_CONF`` where it sets them (passed on, as a
    joined cluster's processes do not inherit them), else the jemalloc in Ray's wheel (``RAY_JEMALLOC_LIB_PATH``
    where set; the one Ray's raylet runs on), preloaded.

    Why not glibc's malloc: Ray Data calls the model in a thread of its own, and there glibc neither reused nor
    returned a big model's freed activations: every batch got fresh pages (an MLP 64-2,048-2,048-10, batches of
    1,024: ~30 MB more per batch, 9 GiB resident after 300 batches, a sixth of the actor's time in page faults).
    On jemalloc the actor's memory stays flat, and beyond its start it predicts as fast as a plain loop."""
    from hydra_raytrain.runtime.internals import ray_jemalloc

    env = {"PYTHONPATH": import_path}
    env.update({name: os.environ[name] for name in ("LD_PRELOAD", "MALLOC_CONF") if name in os.environ})
    library = ray_jemalloc()
    if "LD_PRELOAD" not in env and library and os.path.isfile(library):
        env.setdefault("MALLOC_CONF", JEMALLOC_CONF)
        env["LD_PRELOAD"] = library
    return env


def allocator() -> str:
    """This process's memory allocator: "jemalloc" (or tcmalloc, mimalloc) where ``LD_PRELOAD`` put one in it, else
    "malloc" (the C library's), saying which preloaded one is missing here (Ray at another path on this node)."""
    preloaded = [
        library
        for library in os.environ.get("LD_PRELOAD", "").replace(":", " ").split()
        if any(name in os.path.basename(library) for name in ALLOCATORS)
    ]
    try:
        with open("/proc/self/maps") as maps:
            mapped = maps.read()
    except OSError:  # not Linux
        return "malloc"
    for library in preloaded:
        if os.path.realpath(library) in mapped or library in mapped:
            return next(name for name in ALLOCATORS if name in os.path.basename(library))
    return f"malloc ({', '.join(preloaded)}: not found on this node)" if preloaded else "malloc"
