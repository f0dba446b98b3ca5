"""Settings given as text (environment variables, ``KEY=VALUE`` flags) or TOML values, converted to a
dataclass field's type with an error that names the setting."""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any

TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")
NONE = ("none", "null", "")


def parse_bool(value: object) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in TRUE:
        return True
    if text in FALSE:
        return False
    raise ValueError(f"{value!r} is not a boolean ({'/'.join(TRUE)} or {'/'.join(FALSE)})")


def convert(key: str, value: object, hint: Any, secret: bool = False) -> Any:
    """``value`` as the type ``hint`` names (bool, int, float, str, or one of them or None); a
    ``secret`` value is not shown in the error."""
    options = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    optional = type(None) in options
    kind = next(o for o in options if o is not type(None))
    try:
        if optional and (value is None or (isinstance(value, str) and value.strip().lower() in NONE)):
            return None
        if kind is bool:
            return parse_bool(value)
        if kind in (int, float) and isinstance(value, bool):
            raise ValueError(value)  # TOML's true is no number
        if kind is int and isinstance(value, float) and not value.is_integer():
            raise ValueError(value)  # int() would drop the fraction
        if kind is str and not isinstance(value, str):
            raise ValueError(value)  # str() would turn a TOML list or table into its Python spelling
        return kind(value)
    except (TypeError, ValueError):
        wanted = {int: "an int", str: "a string"}.get(kind, f"a {kind.__name__}") + (" or none" if optional else "")
        shown = "(hidden)" if secret else repr(value)
        raise ValueError(f"setting {key}={shown} is not {wanted}") from None


def dataclass_values(
    cls: type, values: Mapping[str, object], where: str, refused: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """``values`` (names with ``-`` or ``_``) converted to the fields of dataclass ``cls``; an unknown
    name, one in ``refused`` (name: where it is set instead) or a value of the wrong type is an error
    naming it and ``where``."""
    hints = typing.get_type_hints(cls)
    refused = refused or {}
    known = [name for name in cls.__dataclass_fields__ if name not in refused]  # type: ignore[attr-defined]
    out = {}
    for key, value in values.items():
        name = key.replace("-", "_")
        if name in refused:
            raise ValueError(f"{where}: {key!r} is not set here: {refused[name]}")
        if name not in known:
            raise ValueError(f"{where}: unknown setting {key!r}; known: {', '.join(known)}")
        try:
            secret = not cls.__dataclass_fields__[name].repr  # type: ignore[attr-defined]
            out[name] = convert(name, value, hints[name], secret)
        except ValueError as error:
            raise ValueError(f"{where}: {error}") from None
    return out


def key_values(texts: Sequence[str] | None, flag: str) -> dict[str, str]:
    """``["a=1", "b=x"]`` (repeated ``flag KEY=VALUE`` arguments) -> ``{"a": "1", "b": "x"}``."""
    out = {}
    for text in texts or ():
        name, equals, value = text.partition("=")
        if not equals or not name.strip():
            raise ValueError(f"{flag} {text!r}: expected KEY=VALUE, e.g. estimate_percentile=90")
        out[name.strip()] = value.strip()
    return out
