"""Markers on builder parameters that hold filesystem paths.

Validation resolves such arguments against the driver's working directory (workers run elsewhere) and, for
``ExistingDir``, checks the folder exists before any worker starts::

    def imagefolder(root: ExistingDir, ...): ...
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated


@dataclass(frozen=True)
class PathArg:
    must_exist: bool = False


LocalPath = Annotated[str, PathArg()]
ExistingDir = Annotated[str, PathArg(must_exist=True)]
OptionalPath = Annotated[str | None, PathArg()]  # made absolute against the driver's folder, as LocalPath
