"""What a tenant may put in an instance's environment and arguments (``containerEnvironment``,
``containerArgs`` of a function or a task).

One rule, applied where a workload enters the platform (function create, deploy, task launch: a 400
naming the variable) and again by every compute backend before it starts an instance (a launch
failure), so a version stored before the rule never runs with what it now refuses:

- a variable configures the tenant's program, never how an interpreter, the dynamic loader or a shell
  starts, and never the platform's own instance contract (:data:`RULES` lists the names and why);
- names are compared without regard to case: the OS reads ``LD_PRELOAD`` only in capitals, but some
  programs fold case, and a case variant of a refused name has no use but to probe the rule;
- a name has Kubernetes' shape (letters, digits, ``_``, ``-``, ``.``; not a digit first), so no name
  can smuggle ``=`` and set another variable; names and values hold no NUL character;
- arguments are passed to the program as written: the local backend's placeholders (``{python}``,
  ``{port}``, ``{instance_dir}``) are filled in the operator's image command and environment only,
  never in a tenant's arguments or values.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable

import attrs

from nvcf_mono.contracts import env


@attrs.frozen
class Rule:
    """Names refused for one reason."""

    why: str
    names: frozenset[str] = frozenset()
    prefixes: tuple[str, ...] = ()

    def matches(self, upper: str) -> str | None:
        """The name or pattern of this rule an upper-cased variable name matches."""
        if upper in self.names:
            return upper
        for prefix in self.prefixes:
            if upper.startswith(prefix):
                return prefix + "*"
        return None


#: Python variables that only switch the interpreter's own behaviour (buffering, hashing, encodings
#: looked up inside the ``encodings`` package): allowed although ``PYTHON*`` is refused.
PYTHON_FLAGS = frozenset(
    {
        "PYTHONUNBUFFERED",
        "PYTHONDONTWRITEBYTECODE",
        "PYTHONHASHSEED",
        "PYTHONUTF8",
        "PYTHONIOENCODING",
        "PYTHONFAULTHANDLER",
    }
)

RULES: tuple[Rule, ...] = (
    Rule(
        "these are reserved for the platform, which sets them itself (the instance contract)",
        names=frozenset(v.name for v in env.CONTRACT),
        prefixes=("NVCF_", "NVCT_"),
    ),
    Rule(
        # glibc's list of variables it ignores for set-user-id programs, less TMPDIR and TZDIR.
        "the dynamic loader and the C library read these before the program runs, and they can make it load code",
        names=frozenset(
            {
                "GCONV_PATH",
                "GETCONF_DIR",
                "GLIBC_TUNABLES",
                "HOSTALIASES",
                "LOCALDOMAIN",
                "LOCPATH",
                "NIS_PATH",
                "NLSPATH",
                "RESOLV_HOST_CONF",
                "RES_OPTIONS",
            }
        ),
        prefixes=("LD_", "MALLOC_", "_RLD"),
    ),
    Rule(
        # sudo's table of variables it never passes on.
        "shells read these when they start or run a command, and they can make them run code",
        names=frozenset(
            {"BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "PS4", "PROMPT_COMMAND", "IFS", "CDPATH", "GLOBIGNORE"}
            | {"FPATH", "ZDOTDIR", "NULLCMD", "READNULLCMD"}
        ),
        prefixes=("BASH_FUNC_",),
    ),
    Rule(
        "interpreters read these when they start, and they can make them load or run code",
        names=frozenset(
            {"PERLLIB", "PERLIO_DEBUG", "RUBYOPT", "RUBYLIB", "NODE_OPTIONS", "NODE_PATH", "CLASSPATH"}
            | {"JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "JDK_JAVA_OPTIONS", "PHPRC", "PHP_INI_SCAN_DIR", "TCLLIBPATH"}
            | {"R_PROFILE", "R_PROFILE_USER", "R_ENVIRON", "R_ENVIRON_USER"}
        ),
        prefixes=("PYTHON", "PERL5", "LUA_"),
    ),
    Rule(
        "these name commands that other programs run",
        names=frozenset({"BROWSER", "EDITOR", "VISUAL", "PAGER", "MANPAGER", "SHELL"}),
    ),
    Rule(
        "these change where programs are found or read their start-up files",
        names=frozenset({"PATH", "HOME", "TERMINFO", "TERMINFO_DIRS", "TERMCAP", "TERMPATH"}),
        prefixes=("XDG_",),
    ),
    Rule(
        "these select GPUs beyond the instance's own",
        names=frozenset({"NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES"}),
    ),
)

#: Kubernetes' rule for environment variable names.
NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")


def name_refusal(name: str) -> str | None:
    """Why a tenant may not set ``name`` (a sentence fragment naming the rule); None when it may."""
    if not name:
        return "a variable needs a name"
    if not NAME.fullmatch(name):
        return "a name holds letters, digits, '_', '-' or '.' and does not start with a digit"
    upper = name.upper()
    if upper in PYTHON_FLAGS:
        return None
    for rule in RULES:
        matched = rule.matches(upper)
        if matched is not None:
            case = "" if name == upper else " (names are compared without regard to case)"
            return f"it matches {matched} of the platform's environment rule{case}; {rule.why}"
    return None


def environment_problem(items: Iterable[tuple[str, str]]) -> str | None:
    """The first variable a tenant may not set, as a sentence that names it and the rule; None when all may."""
    for name, value in items:
        why = name_refusal(name)
        if why is not None:
            return f"containerEnvironment {name!r} is not allowed: {why}"
        if "\0" in value:
            return f"containerEnvironment {name!r} is not allowed: a value cannot hold a NUL character"
    return None


def split_args(text: str) -> list[str]:
    """``containerArgs`` split like a shell would (ValueError says why it cannot be)."""
    if "\0" in text:
        raise ValueError("containerArgs cannot hold a NUL character")
    try:
        return shlex.split(text)
    except ValueError as err:
        raise ValueError(f"containerArgs cannot be split: {err}") from err


def args_problem(text: str | None) -> str | None:
    """Why ``containerArgs`` cannot be passed to a program; None when it can."""
    if not text:
        return None
    try:
        split_args(text)
    except ValueError as err:
        return str(err)
    return None


def workload_problem(items: Iterable[tuple[str, str]], args: str | None) -> str | None:
    """The first problem of a tenant's environment and arguments; None when the rule allows both."""
    return environment_problem(items) or args_problem(args)
