"""/api/operator-policies (all, a vhost's, one): RabbitMQ's
rabbit_mgmt_wm_operator_policies / _operator_policy, administrators only.
The handlers are policies.py's for the operator family."""
from __future__ import annotations

from node.http.resources.policies import handlers

_H = handlers(operator=True)
operator_policies, operator_policy = _H["list"], _H["show"]
operator_policy_put, operator_policy_delete = _H["put"], _H["delete"]
