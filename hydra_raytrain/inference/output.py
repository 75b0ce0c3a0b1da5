"""Where ``predict`` writes: an output folder that must not exist yet (a path, or an ``s3://`` prefix with nothing
under it), written complete or not at all (``writing``: a local one beside its target, renamed into place and
marked ``_SUCCESS``; one predict at a time, ``storage/locks.py``)."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator

from hydra_raytrain.config.errors import ConfigError, one_line
from hydra_raytrain.data.files import absolute_location, filesystem_of
from hydra_raytrain.storage import locks


def check_output(output: str) -> str:
    """The output's location, which must not exist yet (a path, or an ``s3://`` prefix with nothing under it)."""
    import pyarrow.fs

    location = absolute_location(output)
    try:
        fs, inside = filesystem_of(location)
        taken = fs.get_file_info(inside).type != pyarrow.fs.FileType.NotFound
        if not taken and "://" in location:  # a prefix with objects under it, which S3 lists but does not "have"
            taken = bool(fs.get_file_info(pyarrow.fs.FileSelector(inside, allow_not_found=True)))
    except OSError as error:
        raise ConfigError("--output", output, f"cannot be checked: {one_line(error)}", "a reachable location") from None
    if taken:
        raise ConfigError("--output", output, "exists: predictions go to a new folder.", "a path that does not exist")
    return location


SUCCESS = "_SUCCESS"  # the marker of a complete output, as Spark's and Hadoop's jobs write it


@contextlib.contextmanager
def writing(location: str) -> Iterator[str]:
    """The folder to write predictions into, so that ``location`` is complete or absent: a local output is written
    into ``.<name>.partial`` beside it (held by this predict: another one writing it is refused, naming it; a killed
    one's leftovers are cleared), marked ``_SUCCESS`` and renamed into place; an object store's prefix (no rename
    there) is written in place and marked ``_SUCCESS`` last."""
    if "://" in location:
        yield location
        fs, inside = filesystem_of(location)
        with fs.open_output_stream(f"{inside.rstrip('/')}/{SUCCESS}"):
            pass
        return
    parent, name = os.path.split(location.rstrip("/"))
    partial = os.path.join(parent, f".{name}.partial")
    with locks.holding(partial, "a predict writes it", "Wait for it to end, or write to another --output."):
        check_output(location)  # again, held: a predict that finished while this one waited is seen
        _clear(partial)  # what a killed predict wrote
        try:
            yield partial
            open(os.path.join(partial, SUCCESS), "w").close()
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        try:
            os.rename(partial, location)  # an output another command wrote meanwhile is not replaced
        except OSError as error:
            raise ConfigError(
                "--output",
                location,
                f"was written meanwhile by another command ({error.strerror}); these predictions are in {partial}.",
                "a path that does not exist",
            ) from None
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(location, locks.LOCK_FILE))


def _clear(folder: str) -> None:
    for entry in os.scandir(folder):
        if entry.name != locks.LOCK_FILE:
            shutil.rmtree(entry.path) if entry.is_dir() else os.remove(entry.path)
