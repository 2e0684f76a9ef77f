"""A folder W&B's SDK can be given whatever the bytes of its name.

The SDK sends every path to its service process as protobuf text, which must be UTF-8: a folder
named ``r\\xe9sultats`` (what a Latin-1 system writes; ``os.fsdecode`` holds the byte as a lone
surrogate) fails ``wandb.init`` outright. Such a folder is given to the SDK through a link with a
UTF-8 name, in a private temporary folder that lives while the W&B run is open: the run's files
land in the real folder, under its real name.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def is_utf8(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is text a UTF-8 encoder takes (no undecodable byte held as a surrogate)."""
    try:
        os.fspath(path).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class SdkFolder:
    """``folder`` as the SDK can take it (:attr:`path`): the folder itself when its name is UTF-8,
    else a link to it in a private temporary folder, removed by :meth:`close`."""

    def __init__(self, folder: Path) -> None:
        self._alias: tempfile.TemporaryDirectory[str] | None = None
        if is_utf8(folder):
            self.path = str(folder)
            return
        self._alias = tempfile.TemporaryDirectory(prefix="gym-artifacts-wandb-dir-")
        link = os.path.join(self._alias.name, "dir")
        os.symlink(os.path.abspath(folder), link, target_is_directory=True)
        self.path = link

    def real(self, path: str) -> Path:
        """A path the SDK reports (under :attr:`path`) under the folder's real name."""
        return Path(os.path.realpath(path)) if self._alias is not None else Path(path)

    def close(self) -> None:
        """Remove the link (never what it points to); the folder itself is left as it is."""
        if self._alias is not None:
            self._alias.cleanup()  # rmtree removes a link, never follows it
            self._alias = None
