"""The table of top-level commands: enough to list them in ``--help`` without importing any of them.

A command's module is imported only when that command runs, so ``nvcf-mono --help`` and the API
commands never load the host, the planes or the bus. Keep this module free of heavy imports.
"""

from __future__ import annotations

from typing import NamedTuple


class Command(NamedTuple):
    """One top-level command: its name, the module whose ``register(subparsers)`` adds it, its help line."""

    name: str
    module: str
    help: str


#: In help order. A module that registers several commands lists them next to each other.
COMMANDS = (
    Command("up", "nvcf_mono.cli.host_cmds", "start the all-in-one platform (embedded NATS, local compute)"),
    Command("run", "nvcf_mono.cli.host_cmds", "run any role from config files"),
    Command(
        "up-split",
        "nvcf_mono.cli.split_cmds",
        "run the control, invocation and compute roles as separate processes on this machine",
    ),
    Command("config", "nvcf_mono.cli.config_cmds", "show, check or document the configuration"),
    Command(
        "plugins", "nvcf_mono.cli.plugins_cmds", "list installed plugins and whether the configuration enables them"
    ),
    Command("function", "nvcf_mono.cli.function_cmds", "create, list, read, update and delete functions"),
    Command("deploy", "nvcf_mono.cli.deploy_cmds", "deploy function versions on GPUs, rescale and remove them"),
    Command("task", "nvcf_mono.cli.task_cmds", "launch GPU tasks that run to completion, follow and manage them"),
    Command("api-key", "nvcf_mono.cli.key_cmds", "generate, list and revoke API keys; mint delegation tokens"),
    Command("cluster", "nvcf_mono.cli.cluster_cmds", "list clusters and cluster groups"),
    Command("instance", "nvcf_mono.cli.instance_cmds", "list function instances and read their logs"),
    Command("secret", "nvcf_mono.cli.secret_cmds", "the platform secret shared by every node"),
    Command(
        "account-secret",
        "nvcf_mono.cli.account_secret_cmds",
        "set, list and delete the account's secrets (read by all its instances and tasks)",
    ),
    Command(
        "registry-credential",
        "nvcf_mono.cli.registry_cmds",
        "add, list, update and delete the account's credentials for private registries",
    ),
    Command(
        "telemetry",
        "nvcf_mono.cli.telemetry_cmds",
        "add, list and delete the account's telemetry endpoints (where functions send traces, metrics, logs)",
    ),
    Command("helm", "nvcf_mono.cli.helm_cmds", "render Helm charts the way the platform does"),
    Command(
        "worker",
        "nvcf_mono.cli.worker_cmds",
        "serve one instance's inference server (the sidecar; configured by the instance environment)",
    ),
    Command("invoke", "nvcf_mono.cli.invoke_cmds", "invoke a function and print its response"),
    Command("example", "nvcf_mono.cli.example_cmds", "serve an example function (echo, sse, llm, grpc-echo)"),
)

_HELP = {command.name: command.help for command in COMMANDS}


def help_of(name: str) -> str:
    """The help line of a top-level command, for its module's ``add_parser(name, help=...)``."""
    return _HELP[name]
