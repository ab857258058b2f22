"""The base of every contract section's model: strict (an unknown key is an error with its key path),
frozen (a loaded contract is data), and strict in types (issue 39): no bool where a number is
expected, no string for a number (`repetitions: '5'`), no float for an int (`tensor_parallel_size:
4.0`); an int is still a float's value."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


# Seeds in the range of what takes them (issue 39): a negative seed or one past the range is refused
# here, not by numpy or torch mid-run (or, for vLLM's sampling, read as "no seed": seed -1 is None).
TORCH_SEED_MAX = 2**63 - 1  # a torch.Generator seed that is also an int64 (vLLM's sampling seed)
NUMPY_LEGACY_SEED_MAX = 2**32 - 1  # np.random.seed, which vLLM's set_random_seed calls with engine.seed
SamplingSeed = Annotated[int, Field(ge=0, le=TORCH_SEED_MAX)]
EngineSeed = Annotated[int, Field(ge=0, le=NUMPY_LEGACY_SEED_MAX)]
# numpy's default_rng (the statistics) and random.Random (the prompt; it seeds with abs(), so -n would
# give n's prompt) take any non-negative int.
NonNegativeSeed = Annotated[int, Field(ge=0)]
