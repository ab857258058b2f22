"""The base of every contract section's model: strict (an unknown key is an error with its key path)
and frozen (a loaded contract is data)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)
