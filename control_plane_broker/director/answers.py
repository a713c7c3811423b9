"""Typed Director data at the boundary (pydantic), parsed from GraphQL `data`.

Director's answers are input like any other: an ID ends up in a Kubernetes label and the token
and URL in a runtime's Secret, so each field is held to the shape it must have there."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints


class _Model(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore", frozen=True)


# Compass IDs are UUIDs; the broker writes them into a label value (≤ 63, alphanumeric ends).
CompassID = Annotated[
    str, StringConstraints(pattern=r"^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")
]


class DirectorRuntime(_Model):
    id: CompassID
    name: str = Field(max_length=256)
    labels: dict[str, Any] | None = None


class PageInfo(_Model):
    has_next_page: bool = Field(alias="hasNextPage")
    end_cursor: str | None = Field(default=None, alias="endCursor")


class RuntimePage(_Model):
    data: list[DirectorRuntime]
    page_info: PageInfo = Field(alias="pageInfo")


class OneTimeToken(_Model):
    token: str = Field(repr=False, min_length=1, max_length=8192, pattern=r"^[\x21-\x7e]+$")
    connector_url: str = Field(alias="connectorURL", max_length=2048, pattern=r"^https?://\S+$")
    used: bool = False
    expires_at: Any = Field(default=None, alias="expiresAt")


class RuntimeRegisterInput(_Model):
    name: str
    description: str | None = None
    labels: dict[str, Any] = Field(default_factory=dict)


class GraphQLError(_Model):
    message: str = ""
    extensions: dict[str, Any] | None = None
    path: list[str | int] | None = None

    @property
    def code(self) -> int | None:
        value = (self.extensions or {}).get("error_code")
        return value if isinstance(value, int) else None
