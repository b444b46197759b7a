"""The management API's one route table (RabbitMQ's rabbit_mgmt_dispatcher):
method and path pattern -> handler, in match order (server.Router takes the
first pattern that matches). `{name}` segments are path parameters; every
route authenticates (app.ManagementApi). The handlers live in resources/,
one module per resource family. docs/management-api.md compares this table
with RabbitMQ 4.3's dispatcher."""
from __future__ import annotations

from node.http.context import Handler
from node.http.resources import (
    bindings,
    channels,
    connections,
    consumers,
    definitions,
    exchanges,
    feature_flags,
    health,
    limits,
    members,
    nodes,
    operator_policies,
    overview,
    parameters,
    permissions,
    policies,
    queues,
    topic_permissions,
    users,
    vhosts,
)

ROUTES: tuple[tuple[str, str, Handler], ...] = (
    ("GET", "/api/overview",     overview.overview),
    ("GET", "/api/cluster-name", overview.cluster_name),

    ("GET", "/api/nodes",        nodes.nodes),
    ("GET", "/api/nodes/{node}", nodes.node),

    ("GET", "/api/whoami",     overview.whoami),
    ("GET", "/api/extensions", overview.extensions),
    ("GET", "/api/version",    overview.version),

    ("GET", "/api/feature-flags",             feature_flags.feature_flags),
    ("GET", "/api/deprecated-features",       feature_flags.deprecated_features),
    ("GET", "/api/deprecated-features/used",  feature_flags.deprecated_features),

    ("GET", "/api/parameters",                              parameters.parameters),
    ("GET", "/api/parameters/{component}",                  parameters.parameters),
    ("GET", "/api/parameters/{component}/{vhost}",          parameters.parameters),
    ("GET", "/api/parameters/{component}/{vhost}/{name}",   parameters.parameter),
    ("GET", "/api/global-parameters",                       parameters.global_parameters),
    ("GET", "/api/global-parameters/{name}",                parameters.global_parameter),

    ("GET", "/api/queues",                            queues.queues),
    ("GET", "/api/queues/detailed",                   queues.queues),  # before {vhost}
    ("GET", "/api/queues/{vhost}",                    queues.queues),
    ("GET", "/api/queues/{vhost}/{name}",             queues.queue),
    ("PUT", "/api/queues/{vhost}/{name}",             queues.queue_put),
    ("DELETE", "/api/queues/{vhost}/{name}",          queues.queue_delete),
    ("DELETE", "/api/queues/{vhost}/{name}/contents", queues.queue_purge),
    ("POST", "/api/queues/{vhost}/{name}/get",        queues.queue_get),
    ("GET", "/api/queues/{vhost}/{name}/bindings",    queues.queue_bindings),

    ("GET", "/api/exchanges",                                     exchanges.exchanges),
    ("GET", "/api/exchanges/{vhost}",                             exchanges.exchanges),
    ("GET", "/api/exchanges/{vhost}/{name}",                      exchanges.exchange),
    ("PUT", "/api/exchanges/{vhost}/{name}",                      exchanges.exchange_put),
    ("DELETE", "/api/exchanges/{vhost}/{name}",                   exchanges.exchange_delete),
    ("POST", "/api/exchanges/{vhost}/{name}/publish",             exchanges.publish),
    ("GET", "/api/exchanges/{vhost}/{name}/bindings/source",      exchanges.exchange_source),
    ("GET", "/api/exchanges/{vhost}/{name}/bindings/destination", exchanges.exchange_dest),

    ("GET", "/api/bindings",                                        bindings.bindings),
    ("GET", "/api/bindings/{vhost}",                                bindings.bindings),
    ("GET", "/api/bindings/{vhost}/e/{source}/q/{dest}",            bindings.binding_list("q")),
    ("POST", "/api/bindings/{vhost}/e/{source}/q/{dest}",           bindings.binding_post("q")),
    ("GET", "/api/bindings/{vhost}/e/{source}/q/{dest}/{props}",    bindings.binding_get("q")),
    ("DELETE", "/api/bindings/{vhost}/e/{source}/q/{dest}/{props}", bindings.binding_delete("q")),
    ("GET", "/api/bindings/{vhost}/e/{source}/e/{dest}",            bindings.binding_list("e")),
    ("POST", "/api/bindings/{vhost}/e/{source}/e/{dest}",           bindings.binding_post("e")),
    ("GET", "/api/bindings/{vhost}/e/{source}/e/{dest}/{props}",    bindings.binding_get("e")),
    ("DELETE", "/api/bindings/{vhost}/e/{source}/e/{dest}/{props}", bindings.binding_delete("e")),

    ("GET", "/api/connections",                 connections.connections),
    ("GET", "/api/connections/username/{username}", connections.user_connections),
    ("GET", "/api/connections/{name}",          connections.connection),
    ("DELETE", "/api/connections/{name}",       connections.connection_delete),
    ("GET", "/api/connections/{name}/channels", connections.connection_channels),
    ("GET", "/api/vhosts/{vhost}/connections",  connections.vhost_connections),

    ("GET", "/api/channels",                channels.channels),
    ("GET", "/api/vhosts/{vhost}/channels", channels.vhost_channels),

    ("GET", "/api/consumers",         consumers.consumers),
    ("GET", "/api/consumers/{vhost}", consumers.consumers),

    ("GET", "/api/vhosts",            vhosts.vhosts),
    ("GET", "/api/vhosts/{vhost}",    vhosts.vhost),
    ("PUT", "/api/vhosts/{vhost}",    vhosts.vhost_put),
    ("DELETE", "/api/vhosts/{vhost}", vhosts.vhost_delete),

    ("GET", "/api/vhosts/{vhost}/permissions", permissions.vhost_permissions),

    ("GET", "/api/users",                     users.users),
    ("GET", "/api/users/without-permissions", users.users_without_permissions),
    ("POST", "/api/users/bulk-delete",        users.users_bulk_delete),
    ("GET", "/api/auth/hash_password/{password}", users.hash_password),
    ("GET", "/api/users/{user}",              users.user),
    ("PUT", "/api/users/{user}",              users.user_put),
    ("DELETE", "/api/users/{user}",           users.user_delete),

    ("GET", "/api/users/{user}/permissions",      permissions.user_permissions),
    ("GET", "/api/permissions",                   permissions.permissions),
    ("GET", "/api/permissions/{vhost}/{user}",    permissions.permission),
    ("PUT", "/api/permissions/{vhost}/{user}",    permissions.permission_put),
    ("DELETE", "/api/permissions/{vhost}/{user}", permissions.permission_delete),

    ("GET", "/api/policies",                   policies.policies),
    ("GET", "/api/policies/{vhost}",           policies.policies),
    ("GET", "/api/policies/{vhost}/{name}",    policies.policy),
    ("PUT", "/api/policies/{vhost}/{name}",    policies.policy_put),
    ("DELETE", "/api/policies/{vhost}/{name}", policies.policy_delete),

    ("GET", "/api/operator-policies",                   operator_policies.operator_policies),
    ("GET", "/api/operator-policies/{vhost}",           operator_policies.operator_policies),
    ("GET", "/api/operator-policies/{vhost}/{name}",    operator_policies.operator_policy),
    ("PUT", "/api/operator-policies/{vhost}/{name}",    operator_policies.operator_policy_put),
    ("DELETE", "/api/operator-policies/{vhost}/{name}",
     operator_policies.operator_policy_delete),

    ("GET", "/api/vhost-limits",                   limits.vhost_limits),
    ("GET", "/api/vhost-limits/{vhost}",           limits.vhost_limits),
    ("PUT", "/api/vhost-limits/{vhost}/{name}",    limits.vhost_limit_put),
    ("DELETE", "/api/vhost-limits/{vhost}/{name}", limits.vhost_limit_delete),
    ("GET", "/api/user-limits",                    limits.user_limits),
    ("GET", "/api/user-limits/{user}",             limits.user_limits),
    ("PUT", "/api/user-limits/{user}/{name}",      limits.user_limit_put),
    ("DELETE", "/api/user-limits/{user}/{name}",   limits.user_limit_delete),

    ("GET", "/api/topic-permissions",                             topic_permissions.topic_permissions),
    ("GET", "/api/topic-permissions/{vhost}/{user}",              topic_permissions.topic_permission),
    ("PUT", "/api/topic-permissions/{vhost}/{user}",              topic_permissions.topic_permission_put),
    ("DELETE", "/api/topic-permissions/{vhost}/{user}",           topic_permissions.topic_permission_delete),
    ("GET", "/api/topic-permissions/{vhost}/{user}/{exchange}",   topic_permissions.topic_permission),
    ("DELETE", "/api/topic-permissions/{vhost}/{user}/{exchange}",
     topic_permissions.topic_permission_delete),
    ("GET", "/api/users/{user}/topic-permissions",   topic_permissions.user_topic_permissions),
    ("GET", "/api/vhosts/{vhost}/topic-permissions", topic_permissions.vhost_topic_permissions),

    ("GET", "/api/definitions",         definitions.definitions_get),
    ("POST", "/api/definitions",        definitions.definitions_post),
    ("GET", "/api/definitions/{vhost}", definitions.definitions_get),
    ("POST", "/api/definitions/{vhost}", definitions.definitions_vhost_post),
    ("GET", "/api/all-configuration",    definitions.definitions_get),  # RabbitMQ's old name
    ("POST", "/api/all-configuration",   definitions.definitions_post),

    ("GET", "/api/health/checks/alarms",                       health.health_alarms),
    ("GET", "/api/health/checks/local-alarms",                 health.health_alarms),
    ("GET", "/api/health/checks/node-is-quorum-critical",      health.health_quorum),
    ("GET", "/api/health/checks/node-is-mirror-sync-critical", health.health_quorum),
    ("GET", "/api/health/checks/virtual-hosts",                health.health_vhosts),
    ("GET", "/api/health/checks/port-listener/{port}",         health.health_port_listener),
    ("GET", "/api/health/checks/protocol-listener/{protocols}", health.health_protocol_listener),
    ("GET", "/api/health/checks/is-in-service",                health.health_is_in_service),
    ("GET", "/api/health/checks/ready-to-serve-clients",       health.health_ready),
    ("GET", "/api/health/checks/below-node-connection-limit",  health.health_connection_limit),
    ("GET", "/api/health/checks/metadata-store/initialized",   health.health_metadata_store),
    ("GET", "/api/health/checks/metadata-store/initialized/with-data",
     health.health_metadata_store_data),
    ("GET", "/api/health/checks/quorum-queues-without-elected-leaders/all-vhosts",
     health.health_quorum_leaders),
    ("GET", "/api/health/checks/quorum-queues-without-elected-leaders/all-vhosts/pattern/{pattern}",
     health.health_quorum_leaders),
    ("GET", "/api/health/checks/quorum-queues-without-elected-leaders/vhost/{vhost}",
     health.health_quorum_leaders),
    ("GET", "/api/health/checks/quorum-queues-without-elected-leaders/vhost/{vhost}/pattern/{pattern}",
     health.health_quorum_leaders),
    ("GET", "/api/aliveness-test/{vhost}",                     health.aliveness),
    ("GET", "/api/healthchecks/node",                          health.healthchecks_node),
    ("GET", "/api/healthchecks/node/{node}",                   health.healthchecks_node),

    ("POST", "/api/rebalance/queues", members.rebalance_queues),

    ("GET", "/api/mirrorq/cluster",           members.mirrorq_cluster),
    ("PUT", "/api/mirrorq/members/{name}",    members.member_add),
    ("POST", "/api/mirrorq/members/{name}",   members.member_add),
    ("DELETE", "/api/mirrorq/members/{name}", members.member_remove),
)
