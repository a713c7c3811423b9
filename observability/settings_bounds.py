"""The bounds a settings field declares (pydantic's `ge`, `gt`, `le`, `lt`), read back from the
field, so that help texts and checks show the one declaration instead of repeating it; and the
forms of the Kubernetes names settings give (DNS-1123), which both components declare alike."""

from __future__ import annotations

import annotated_types as at
from pydantic.fields import FieldInfo

# A name the API server would refuse is refused at start, naming the variable, instead of failing
# every request to that object later.
NAMESPACE_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
NAMESPACE_MAX_LENGTH = 63
OBJECT_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
OBJECT_NAME_MAX_LENGTH = 253

_OPERATORS = ((at.Ge, "ge", ">="), (at.Gt, "gt", ">"), (at.Le, "le", "<="), (at.Lt, "lt", "<"))


def bounds_text(field: FieldInfo) -> str:
    """`>= 1, <= 1000`, or "" for a field without bounds."""
    parts: list[str] = []
    for kind, attribute, operator in _OPERATORS:
        for item in field.metadata:
            if isinstance(item, kind):
                parts.append(f"{operator} {_number(getattr(item, attribute))}")
    return ", ".join(parts)


def _number(value: float) -> str:
    """As an operator would write it: 2419200, not 2.4192e+06 or 2419200.0."""
    return str(int(value)) if float(value).is_integer() else str(value)
