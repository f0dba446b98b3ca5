"""A model's two names, and the one place they are mapped: the name clients use (a repository folder's,
``resnet18``) and the key the policy, the workers and the actions know one load of it by. The key is
the name itself, except for a model reloaded in place: while its previous load drains, the new one is
served beside it under ``name@n``, a key no repository folder can have."""

from __future__ import annotations

import re

MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
MODEL_KEY = re.compile(MODEL_NAME.pattern + r"(@[0-9]{1,18})?")
_RELOAD_MARK = "@"


def client_name(key: str) -> str:
    """The name clients use for the model loaded under ``key`` (``resnet18@2`` -> ``resnet18``)."""
    return key.partition(_RELOAD_MARK)[0]


def reload_key(name: str, generation: int) -> str:
    """The key of reload ``generation`` of model ``name``, served beside its previous load."""
    return f"{name}{_RELOAD_MARK}{generation}"
