"""The shape JSON takes on relayq's wire: field names in camelCase (`runId`), read in either
case. Every model that crosses a process boundary as JSON (the API's bodies, the store's
listings, requests and answers) builds on `CamelModel`, so the rule is written once."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

__all__ = ["CamelModel"]


class CamelModel(BaseModel):
    """Fields named in camelCase on the wire and read by either name; a subclass adds its
    own configuration (`frozen`, `extra="forbid"`) beside this."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
    )
