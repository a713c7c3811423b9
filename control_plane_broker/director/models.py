"""Typed Director data at the boundary (pydantic), parsed from GraphQL `data`."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class _Model(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore", frozen=True)


class DirectorRuntime(_Model):
    id: str
    name: str
    labels: dict[str, Any] | None = None


class PageInfo(_Model):
    has_next_page: bool = Field(alias="hasNextPage")
    end_cursor: str | None = Field(default=None, alias="endCursor")


class RuntimePage(_Model):
    data: list[DirectorRuntime]
    page_info: PageInfo = Field(alias="pageInfo")


class OneTimeToken(_Model):
    token: str = Field(repr=False)
    connector_url: str = Field(alias="connectorURL")
    used: bool = False
    expires_at: Any = Field(default=None, alias="expiresAt")


class RuntimeRegisterInput(_Model):
    name: str
    description: str | None = None
    labels: dict[str, Any] = Field(default_factory=dict)


class GraphQLError(_Model):
    message: str = ""
    extensions: dict[str, Any] | None = None

    @property
    def code(self) -> int | None:
        value = (self.extensions or {}).get("error_code")
        return value if isinstance(value, int) else None
