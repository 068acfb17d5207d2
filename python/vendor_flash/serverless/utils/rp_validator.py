"""``validate(raw_input, schema)``: check a job's input against a simple schema.

A stand-in for ``runpod.serverless.utils.rp_validator.validate`` with its documented behaviour.
``schema`` maps each accepted input key to its rules::

    schema = {
        "text": {"type": str, "required": True},
        "max_length": {"type": int, "required": False, "default": 100,
                       "constraints": lambda x: x > 0},
    }

* ``type`` (required): the expected type (or a tuple of types). An ``int`` is accepted where a
  ``float`` is expected and becomes a float. ``True``/``False`` are not accepted as numbers.
* ``required`` (default ``False``): a missing required key is an error.
* ``default`` (default ``None``): the value used when an optional key is missing.
* ``constraints`` (optional): a callable; a falsy answer (or an exception) is an error.

Keys of the input that the schema does not list are errors. The answer is
``{"validated_input": {...}}`` (the input with defaults filled in) or ``{"errors": [...]}``
listing every problem found.
"""

from __future__ import annotations

from typing import Any, Dict, List


def _type_name(expected: Any) -> str:
    if isinstance(expected, tuple):
        return " or ".join(_type_name(t) for t in expected)
    return getattr(expected, "__name__", repr(expected))


def _matches(value: Any, expected: Any) -> bool:
    types = expected if isinstance(expected, tuple) else (expected,)
    for kind in types:
        if kind in (int, float) and isinstance(value, bool):
            continue  # a JSON true/false is not a number
        if kind is float and isinstance(value, int):
            return True
        if isinstance(value, kind):
            return True
    return False


def validate(raw_input: Dict[str, Any], schema: Dict[str, Dict[str, Any]]) -> Dict[str, Any]:
    """Validate ``raw_input`` against ``schema``; see the module documentation."""
    errors: List[str] = []
    if not isinstance(raw_input, dict):
        return {"errors": [f"Input must be an object, not {type(raw_input).__name__}."]}
    validated: Dict[str, Any] = {}

    for key in raw_input:
        if key not in schema:
            errors.append(f"Unexpected input. {key} is not a valid input option.")

    for key, rules in schema.items():
        if not isinstance(rules, dict) or "type" not in rules:
            errors.append(f"Schema error: {key} has no 'type'.")
            continue
        if key not in raw_input:
            if rules.get("required", False):
                errors.append(f"{key} is a required input.")
            else:
                validated[key] = rules.get("default")
            continue
        value = raw_input[key]
        expected = rules["type"]
        try:
            ok = _matches(value, expected)
        except TypeError:  # the schema's type is not a type
            errors.append(f"Schema error: the type of {key} is not a type: {expected!r}.")
            continue
        if not ok and value is not None:  # runpod-python lets None/null through the type check
            errors.append(f"{key} should be {_type_name(expected)}, not {type(value).__name__}.")
            continue
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        constraint = rules.get("constraints")
        if constraint is not None:
            try:
                passed = constraint(value)
            except Exception as exc:  # noqa: BLE001 - a failing check is a validation error
                errors.append(f"{key} does not meet the constraints ({type(exc).__name__}: {exc}).")
                continue
            if not passed:
                errors.append(f"{key} does not meet the constraints.")
                continue
        validated[key] = value

    if errors:
        return {"errors": errors}
    return {"validated_input": validated}
