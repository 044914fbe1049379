"""fastjson's JSON dialect: object keys may be bare integers (``{0:120,1:98}``).

RocketMQ serialises its config files (``consumerOffset.json``, ``delayOffset.json``)
and NameServer route answers with fastjson, which writes integer map keys without
quotes, so they are not strict JSON. :func:`loads_lenient` reads them (and strict
JSON); :func:`dumps_fastjson` writes integer keys bare again, compactly.
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["dumps_fastjson", "loads_lenient"]

# One pass over the text: a string literal is matched whole (and kept), so a
# "{0:" inside a string is never touched; outside strings, a number right after
# "{" or "," and right before ":" is an object key and gets quoted.
_STRING_OR_BARE_KEY = re.compile(r'"(?:[^"\\]|\\.)*"|([{,]\s*)(-?\d+)(?=\s*:)', re.DOTALL)


def _quote_bare_key(m: re.Match[str]) -> str:
    if m.group(2) is None:
        return m.group(0)
    return f'{m.group(1)}"{m.group(2)}"'


def loads_lenient(text: str) -> Any:
    """Parse fastjson output: JSON whose object keys may be bare integers.

    Bare keys come back as strings, as quoted ones do. Strict JSON parses
    unchanged. Raises ValueError (json.JSONDecodeError) on anything else.
    """
    return json.loads(_STRING_OR_BARE_KEY.sub(_quote_bare_key, text))


def dumps_fastjson(obj: Any, *, bare_int_keys: bool = True) -> str:
    """Serialise compactly, writing ``int`` dict keys bare like fastjson (``{0:120}``).

    With ``bare_int_keys=False`` the output is strict JSON. Keys must be
    ``str`` or ``int``; non-ASCII text is written as UTF-8, not escaped.
    """
    if isinstance(obj, dict):
        parts = []
        for key, value in obj.items():
            if isinstance(key, str):
                name = json.dumps(key, ensure_ascii=False)
            elif isinstance(key, int) and not isinstance(key, bool):
                name = str(key) if bare_int_keys else f'"{key}"'
            else:
                raise TypeError(f"JSON object keys must be str or int, got {key!r}")
            parts.append(f"{name}:{dumps_fastjson(value, bare_int_keys=bare_int_keys)}")
        return "{" + ",".join(parts) + "}"
    if isinstance(obj, (list, tuple)):
        return "[" + ",".join(dumps_fastjson(v, bare_int_keys=bare_int_keys) for v in obj) + "]"
    return json.dumps(obj, ensure_ascii=False, allow_nan=False)
