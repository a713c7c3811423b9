"""Whether a Kyma may receive a token: pure, on a `KymaView`.

Holds: a token is only for a Kyma that exists, is not being deleted, has a tenant, and (when the
module policy is `required`) lists the module in spec.modules or status.modules.
"""

from __future__ import annotations

import re

from control_plane_broker.errors import (
    KymaDeleting,
    KymaIncomplete,
    MalformedRequest,
    ModuleNotEnabled,
    RuntimeNotFound,
)
from control_plane_broker.kyma import KymaView

# A Kyma name is the lower-cased runtime ID, so a runtime ID must be a valid DNS label; this also
# keeps quotes and JSON out of the Director label filter it ends up in.
RUNTIME_ID_PATTERN = r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?$"
RUNTIME_ID_RULE = "runtime ID must be 1-63 letters, digits or '-', alphanumeric ends"
_RUNTIME_ID = re.compile(RUNTIME_ID_PATTERN)


def validate_runtime_id(runtime_id: str) -> str:
    """Returns the Kyma name for a runtime ID, or raises `MalformedRequest`."""
    if not _RUNTIME_ID.fullmatch(runtime_id):
        raise MalformedRequest(RUNTIME_ID_RULE)
    return runtime_id.lower()


def module_enabled(kyma: KymaView, module: str) -> bool:
    return module in kyma.spec_modules or module in kyma.status_modules


def check_token_allowed(kyma: KymaView | None, *, module: str, module_required: bool) -> KymaView:
    if kyma is None:
        raise RuntimeNotFound("no Kyma for this runtime")
    if kyma.deleting:
        raise KymaDeleting("the Kyma is being deleted")
    if module_required and not module_enabled(kyma, module):
        raise ModuleNotEnabled(f"module {module} is not enabled for this runtime")
    if not kyma.tenant:
        raise KymaIncomplete("the Kyma has no global account label")
    return kyma
