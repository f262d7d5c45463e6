"""A model's source checked before Ray ever sees it: a folder that does not exist, a config that does not
parse or a shape that differs from the catalogue's would otherwise fail every engine start of the
deployment (and, on a live deployment, replace what serves with what cannot).

Only local folders are checked (an absolute path); a hub id or URL is the engines' to resolve.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from baton.core import models as m


def _shape(cfg: dict[str, Any]) -> dict[str, int | None]:
    nested = cfg.get("text_config")
    text: dict[str, Any] = nested if isinstance(nested, dict) else cfg
    heads = text.get("num_attention_heads")
    head_dim = text.get("head_dim") or (text["hidden_size"] // heads if heads and text.get("hidden_size") else None)
    return {"num_layers": text.get("num_hidden_layers"),
            "num_kv_heads": text.get("num_key_value_heads") or heads,
            "head_dim": head_dim}


def source_problem(model: m.Model) -> str | None:
    """Why the model's source cannot serve, in a sentence for the operator; None when it can (or when it is
    not a local folder, which this host cannot check)."""
    source = model.source or ""
    if not source.startswith("/"):
        return None
    path = Path(source)
    if not path.is_dir():
        return f"The model {model.name}'s source {source} is not a folder on this host."
    config = path / "config.json"
    try:
        cfg = json.loads(config.read_text())
    except OSError:
        return f"The model {model.name}'s source {source} has no readable config.json."
    except ValueError:
        return f"The model {model.name}'s config.json ({config}) does not parse."
    if not isinstance(cfg, dict):
        return f"The model {model.name}'s config.json ({config}) is not an object."
    found = _shape(cfg)
    wrong = [f"{k} {found[k]} (the catalogue says {getattr(model, k)})" for k in ("num_layers", "num_kv_heads",
                                                                              "head_dim")
             if found[k] is not None and found[k] != getattr(model, k)]
    if wrong:
        return f"The model {model.name}'s config.json does not match the catalogue: " + ", ".join(wrong) + "."
    return None
