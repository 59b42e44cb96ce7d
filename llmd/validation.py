"""msgspec's validation messages, split into where and what, for both of llmd's strict parsers.

msgspec says "Expected `int`, got `str` - at `$.messages[0].content`"; the request parser
(`api/chat.py`) and the settings loader (`config.py`) both name the field in their errors.
"""

from __future__ import annotations

import re

_MESSAGE = re.compile(r"(?P<problem>.*?)(?: - at `\$\.?(?P<path>[^`]*)`)?", re.DOTALL)


def split_validation_error(message: str) -> tuple[str, str]:
    """`(path, problem)` of a msgspec ValidationError message: ("port", "Expected `int`, got `str`").

    The path is "" for the document itself (or when msgspec gave none).
    """
    match = _MESSAGE.fullmatch(message)
    assert match is not None  # every part of the pattern is optional
    return match["path"] or "", match["problem"]
