"""NVCF's scope names (reference auth §3.1, control-plane §5)."""

from __future__ import annotations

# Functions (account admin and user)
AUTHORIZE_CLIENTS = "authorize_clients"
REGISTER_FUNCTION = "register_function"
UPDATE_FUNCTION = "update_function"
DELETE_FUNCTION = "delete_function"
DEPLOY_FUNCTION = "deploy_function"
LIST_FUNCTIONS = "list_functions"
LIST_FUNCTIONS_DETAILS = "list_functions_details"
INVOKE_FUNCTION = "invoke_function"
QUEUE_DETAILS = "queue_details"
UPDATE_SECRETS = "update_secrets"
MANAGE_TELEMETRIES = "manage_telemetries"
MANAGE_REGISTRY_CREDENTIALS = "manage_registry_credentials"
LIST_CLUSTER_GROUPS = "list_cluster_groups"
# Super admin
ACCOUNT_SETUP = "account_setup"
# Tasks
LAUNCH_TASK = "launch_task"
LIST_TASKS = "list_tasks"
TASK_DETAILS = "task_details"
CANCEL_TASK = "cancel_task"
DELETE_TASK = "delete_task"
LIST_EVENTS = "list_events"
LIST_RESULTS = "list_results"
# Clusters (ICMS)
CLUSTER_MANAGEMENT = "cluster-management"
CLUSTER_LISTING = "cluster_listing"
INSTANCE_TYPES = "instance_types"
GPU_LISTING = "gpu_listing"
REGIONS_LISTING = "regions_listing"
CLUSTERS_LISTING = "clusters_listing"
ATTRIBUTES_LISTING = "attributes_listing"

ACCOUNT_ADMIN_SCOPES = frozenset(
    {
        AUTHORIZE_CLIENTS,
        REGISTER_FUNCTION,
        UPDATE_FUNCTION,
        DELETE_FUNCTION,
        DEPLOY_FUNCTION,
        LIST_FUNCTIONS,
        LIST_FUNCTIONS_DETAILS,
        INVOKE_FUNCTION,
        QUEUE_DETAILS,
        UPDATE_SECRETS,
        MANAGE_TELEMETRIES,
        MANAGE_REGISTRY_CREDENTIALS,
        LIST_CLUSTER_GROUPS,
        CLUSTER_LISTING,
        INSTANCE_TYPES,
        GPU_LISTING,
        REGIONS_LISTING,
        CLUSTERS_LISTING,
        ATTRIBUTES_LISTING,
    }
)
#: What ``nvcf-cli api-key generate`` gives a function key.
FUNCTION_KEY_SCOPES = frozenset({INVOKE_FUNCTION, LIST_FUNCTIONS, QUEUE_DETAILS, LIST_FUNCTIONS_DETAILS})
#: The eight scopes of a task key.
TASK_KEY_SCOPES = frozenset(
    {LAUNCH_TASK, LIST_TASKS, TASK_DETAILS, CANCEL_TASK, DELETE_TASK, LIST_EVENTS, LIST_RESULTS, UPDATE_SECRETS}
)
SUPER_ADMIN_SCOPES = frozenset(
    {ACCOUNT_SETUP, CLUSTER_MANAGEMENT} | {f"admin:{s}" for s in ACCOUNT_ADMIN_SCOPES | TASK_KEY_SCOPES}
)
#: Every scope this platform checks.
ALL_SCOPES = ACCOUNT_ADMIN_SCOPES | TASK_KEY_SCOPES | SUPER_ADMIN_SCOPES
