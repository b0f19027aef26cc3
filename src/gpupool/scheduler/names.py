"""The policy names and the one check of a name (no numpy: the CLI imports it for its help).

`gpupool serve --policy`, `gpupool k8s extender --policy` and `gpupool sim --policy` all take
these names and check them here, so an unknown name gets the same line everywhere;
scheduler/registry.py makes the policy of each name.
"""

from __future__ import annotations

from gpupool.core.errors import InvalidRequest

#: the default everywhere: the policy the trace benchmark measures best
DEFAULT_POLICY = "gpupool"

POLICY_NAMES: tuple[str, ...] = (
    "random",
    "dotprod",
    "clustering",
    "packing",
    "bestfit",
    "fgd",
    "binpack",
    "spread",
    "gpupool",
)


def check_policy(name: str) -> str:
    """`name` if it is a policy; InvalidRequest listing the valid names if not."""
    if name not in POLICY_NAMES:
        raise InvalidRequest(f"unknown policy {name!r}; valid policies: {', '.join(POLICY_NAMES)}")
    return name
