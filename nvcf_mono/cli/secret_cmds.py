"""``nvcf-mono secret generate FILE``: create the platform secret every node of a split platform shares."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from nvcf_mono.auth.secret import PlatformSecret, SecretFileError
from nvcf_mono.cli.commands import help_of
from nvcf_mono.cli.context import CliContext, CliError


def register(sub: Any) -> None:
    """Add the secret commands."""
    secret = sub.add_parser("secret", help=help_of("secret"))
    commands = secret.add_subparsers(dest="secret_command", metavar="COMMAND", required=True)
    gen = commands.add_parser(
        "generate",
        help="write a new platform secret file (mode 0600)",
        description="Write a new platform secret. Give the same file to every control and invocation node "
        "(plugins.auth.secret_file); keys, tokens and sealed secrets depend on it.",
    )
    gen.add_argument("file", type=Path, help="where to write it")
    gen.add_argument("--force", action="store_true", help="replace an existing file (invalidates every key)")
    gen.set_defaults(func=_generate)
    show = commands.add_parser("fingerprint", help="print a secret's fingerprint, to compare nodes")
    show.add_argument("file", type=Path)
    show.set_defaults(func=_fingerprint)


def _generate(args: argparse.Namespace, ctx: CliContext) -> int:
    path: Path = args.file
    if path.exists() and not args.force:
        raise CliError(f"{path} exists; keep it (every key depends on it) or pass --force to replace it")
    secret = PlatformSecret.generate()
    try:
        secret.write(path)
    except OSError as err:
        raise CliError(f"cannot write {path}: {err.strerror or err}", code=1) from err
    print(f"wrote {path} (fingerprint {secret.fingerprint()})", file=ctx.stdout)
    return 0


def _fingerprint(args: argparse.Namespace, ctx: CliContext) -> int:
    try:
        secret = PlatformSecret.load(args.file)
    except SecretFileError as err:
        raise CliError(str(err), code=1) from err
    print(secret.fingerprint(), file=ctx.stdout)
    return 0
