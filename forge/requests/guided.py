"""The node's own check of a guided output, whatever the backend (engines guarantee it by
construction)."""
from __future__ import annotations

import json
from typing import Optional

from forge.engines.interface import Guide


def guided_output_problem(text: str, guide: Guide) -> Optional[str]:
    """Why a guided output does not honour its guide, or None. Engines guarantee it by construction;
    this check makes sure nothing unparseable is ever handed out, whatever the backend."""
    if guide.choice is not None:
        return None if text in guide.choice else f"{text[:80]!r} is not one of the choices"
    if guide.json_schema is not None:
        import jsonschema

        try:
            value = json.loads(text)
        except ValueError as e:
            return f"the output is not JSON ({e})"
        err = jsonschema.exceptions.best_match(
            jsonschema.validators.validator_for(guide.json_schema)(guide.json_schema).iter_errors(
                value
            )
        )
        return None if err is None else f"the output does not match the schema: {err.message}"
    return None
