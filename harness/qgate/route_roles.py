"""The contract's `routes:` section: which roles (vLLM module names) each route takes.

    routes:
      fp16_gemv:
        roles: [out_proj, qkv_proj, o_proj, gate_up_proj, down_proj, gate, shared_expert_gate, lm_head]

A role is the last name of a vLLM module of the loaded model (Qwen4ExpForCausalLM's, docs/routes.md).
The list reaches every vLLM process of both arms as the JSON env var QGATE_ROUTE_ROLES: the plugin
routes exactly the listed layers, fails the engine start in one line on a role that matches no layer of
the model, and `routes.<route>.ran` fails when a listed role has no hits. Without the section the GEMV
route takes `route_env.GEMV_DEFAULT_ROLES` (and the HC projections while the HC route is off) unchecked.
"""

from __future__ import annotations

import json

from pydantic import BaseModel, ConfigDict, Field, field_validator

from qgate_route_env import ROLES_ENV, listed_roles


class RouteRoles(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    roles: list[str] = Field(
        min_length=1,
        description="vLLM module names (the last name, e.g. out_proj, lm_head) the route takes; each must "
        "match a layer of the model at engine start and show hits in the candidate",
    )

    @field_validator("roles")
    @classmethod
    def _names(cls, roles: list[str]) -> list[str]:
        listed_roles({ROLES_ENV: json.dumps({"fp16_gemv": roles})})  # one rule for both sides
        return roles


class Routes(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    fp16_gemv: RouteRoles | None = None


def roles_env(routes: Routes | None) -> dict[str, str]:
    """The env that carries the listed roles to every vLLM process (both arms alike); {} when none."""
    listed = {} if routes is None else {r: v.roles for r, v in routes if v is not None}
    return {ROLES_ENV: json.dumps(listed, separators=(",", ":"))} if listed else {}
