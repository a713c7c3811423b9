"""Director's input rules and label filter semantics, as pure functions.

- Runtime names (`RuntimeRegisterInput`, `RuntimeUpdateInput`): required, 1 to 256
  runes, `^[a-zA-Z0-9-._]+$`, checked in that order as current Director's ozzo-validation
  rules do, with their messages. (The lower-case DNS-1123 rule of at most 36 characters
  belonged to the retired `RuntimeInput`; compass-manager's `<shoot>-<random letters>`
  names, upper case included, pass the current rule.)
- Label keys: required, `^[a-zA-Z0-9_]*$`; `setRuntimeLabel` also checks at most 256
  characters first (the register and update inputs do not: their long keys fail in
  the database, see `director.py`). Each input field stops at its first problem.
- `setRuntimeLabel` values are "required" the way Director's validation library
  means it: null, "", false, [] and {} are rejected; numbers pass (gqlgen hands them
  over as json.Number, a string that is never empty).
- A label filter without `query` matches when the key exists; with `query` it
  matches when the label value contains the query's JSON value (PostgreSQL's
  `jsonb @>`: objects contain sub-objects, arrays contain sub-arrays, an array
  contains a scalar it has as an element, scalars must be equal). For the keys
  `runtimeType` and `scenarios` (any case) the query is a JSON path instead,
  `$[*] ? (@ == "a" || @ == "b")`, matching a value that has any of the strings
  (PostgreSQL's `?|`); a query of another form is refused as a JSON error is.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "LabelFilter",
    "contains",
    "description_problem",
    "is_blank",
    "json_path_values",
    "label_key_problem",
    "matches",
    "parse_filters",
    "runtime_name_problem",
    "uses_json_path",
]

_MAX_NAME_RUNES = 256
_MAX_DESCRIPTION = 2000
_MAX_LABEL_KEY = 256
_RUNTIME_NAME = re.compile(r"[a-zA-Z0-9._-]+")
_LABEL_KEY = re.compile(r"[a-zA-Z0-9_]*")


def runtime_name_problem(name: str) -> str | None:
    if not name:
        return "cannot be blank"
    # A Python str is counted in code points, which is what Go's runes are.
    if len(name) > _MAX_NAME_RUNES:
        return f"the length must be between 1 and {_MAX_NAME_RUNES}"
    if not _RUNTIME_NAME.fullmatch(name):
        return "must be in a valid format"
    return None


def description_problem(description: str | None) -> str | None:
    if description is not None and len(description) > _MAX_DESCRIPTION:
        return f"the length must be no more than {_MAX_DESCRIPTION}"
    return None


def label_key_problem(key: str, *, limit_length: bool = True) -> str | None:
    if not key:
        return "cannot be blank"
    if limit_length and len(key) > _MAX_LABEL_KEY:
        return f"the length must be no more than {_MAX_LABEL_KEY}"
    if not _LABEL_KEY.fullmatch(key):
        return "must be in a valid format"
    return None


def is_blank(value: Any) -> bool:
    """Director's "required" check for label values."""
    if value is None or value is False:
        return True
    if isinstance(value, str | list | dict):
        return len(value) == 0
    return False


# Director's translation of the JSON path its `scenarios` and `runtimeType` filters take.
_JSON_PATH_VALUE = re.compile(
    r'^\$\[\*\]\s*\?\s*\(\s*@\s*==\s*"([a-zA-Z0-9\-_\s]+)"\s*'
    r'|\|\|\s*@\s*==\s*"([a-zA-Z0-9\-_\s]+)"'
)
_JSON_PATH_KEYS = frozenset({"runtimeType"})


def uses_json_path(key: str) -> bool:
    return key.upper() == "SCENARIOS" or key in _JSON_PATH_KEYS


def json_path_values(query: str) -> tuple[str, ...]:
    """The strings of `$[*] ? (@ == "a" || @ == "b")`; ValueError for another form."""
    found = list(_JSON_PATH_VALUE.finditer(query))
    if not found:
        raise ValueError(f"value not found in the query parameter {query!r}")
    first, *rest = found
    return (first.group(1) or "", *(m.group(2) or "" for m in rest))


def _has_any(value: Any, strings: tuple[str, ...]) -> bool:
    """PostgreSQL `value ?| strings`: a string value, element or top-level key among them."""
    if isinstance(value, str):
        return value in strings
    if isinstance(value, list):
        return any(isinstance(e, str) and e in strings for e in value)
    if isinstance(value, dict):
        return any(k in strings for k in value)
    return False


class LabelFilter:
    """One parsed `LabelFilter` input: a key and, optionally, a JSON value to contain
    (`has_query`) or strings to have (`any_of`, from a JSON path)."""

    __slots__ = ("any_of", "has_query", "key", "query")

    def __init__(
        self,
        key: str,
        query: Any = None,
        *,
        has_query: bool = False,
        any_of: tuple[str, ...] | None = None,
    ) -> None:
        self.key = key
        self.query = query
        self.has_query = has_query
        self.any_of = any_of

    def matches(self, labels: Mapping[str, Any]) -> bool:
        if self.key not in labels:
            return False
        if self.any_of is not None:
            return _has_any(labels[self.key], self.any_of)
        return not self.has_query or contains(labels[self.key], self.query)


def parse_filters(raw: Sequence[Mapping[str, Any]] | None) -> list[LabelFilter]:
    """Parse GraphQL `[LabelFilter!]` input; raises ValueError for a query of the wrong form."""
    filters: list[LabelFilter] = []
    for item in raw or ():
        key = item["key"]
        query = item.get("query")
        if query is None:
            filters.append(LabelFilter(key))
            continue
        if uses_json_path(key):
            filters.append(LabelFilter(key, any_of=json_path_values(query)))
            continue
        try:
            value = json.loads(query)
        except json.JSONDecodeError as exc:
            raise ValueError(f"query of label filter {key!r} is not valid JSON: {exc}") from exc
        filters.append(LabelFilter(key, value, has_query=True))
    return filters


def matches(filters: Sequence[LabelFilter], labels: Mapping[str, Any]) -> bool:
    return all(f.matches(labels) for f in filters)


def _is_scalar(value: Any) -> bool:
    return not isinstance(value, dict | list)


def _scalar_equal(left: Any, right: Any) -> bool:
    # JSON keeps booleans and numbers apart, Python does not (True == 1).
    if isinstance(left, bool) or isinstance(right, bool):
        return isinstance(left, bool) and isinstance(right, bool) and left == right
    if isinstance(left, int | float) and isinstance(right, int | float):
        return left == right
    return type(left) is type(right) and left == right


def contains(value: Any, query: Any) -> bool:
    """PostgreSQL `value @> query` for JSON values."""
    if isinstance(value, list) and _is_scalar(query):
        # The one exception to "same shape", and only at the top level:
        # an array contains a scalar that is one of its elements.
        return any(_is_scalar(element) and _scalar_equal(element, query) for element in value)
    return _deep_contains(value, query)


def _deep_contains(value: Any, query: Any) -> bool:
    if isinstance(query, dict):
        return isinstance(value, dict) and all(
            key in value and _deep_contains(value[key], sub) for key, sub in query.items()
        )
    if isinstance(query, list):
        return isinstance(value, list) and all(
            any(_deep_contains(element, sub) for element in value) for sub in query
        )
    return _is_scalar(value) and _scalar_equal(value, query)
