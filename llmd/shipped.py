"""The files llmd ships beside its code: the profiles and the systemd unit with its settings.

In a checkout they are the repository's top-level `profiles/` and `systemd/`; a wheel carries
the same folders inside the package (`llmd/profiles`, `llmd/systemd`: pyproject maps them in
as package data), so a non-editable install (`pip install .`, a wheel) finds them too.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parent.parent  # the repository, when llmd runs from one


def shipped_dir(name: str) -> Path:
    """The folder of shipped files `name` (`profiles`, `systemd`): the installed copy, else the checkout's."""
    installed = Path(str(resources.files("llmd").joinpath(name)))
    return installed if installed.is_dir() else CHECKOUT / name
