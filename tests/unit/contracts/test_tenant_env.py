"""The platform's rule for a tenant's environment and arguments (``contracts/tenant_env.py``)."""

from __future__ import annotations

import pytest

from nvcf_mono.contracts import env, tenant_env


@pytest.mark.parametrize(
    ("name", "pattern"),
    [
        ("PYTHONWARNINGS", "PYTHON*"),
        ("PYTHONPATH", "PYTHON*"),
        ("PYTHONSTARTUP", "PYTHON*"),
        ("BROWSER", "BROWSER"),
        ("LD_PRELOAD", "LD_*"),
        ("LD_LIBRARY_PATH", "LD_*"),
        ("LD_AUDIT", "LD_*"),
        ("GLIBC_TUNABLES", "GLIBC_TUNABLES"),
        ("GCONV_PATH", "GCONV_PATH"),
        ("MALLOC_CHECK_", "MALLOC_*"),
        ("BASH_ENV", "BASH_ENV"),
        ("ENV", "ENV"),
        ("BASH_FUNC_LS", "BASH_FUNC_*"),
        ("IFS", "IFS"),
        ("PS4", "PS4"),
        ("SHELLOPTS", "SHELLOPTS"),
        ("PERL5OPT", "PERL5*"),
        ("PERLLIB", "PERLLIB"),
        ("RUBYOPT", "RUBYOPT"),
        ("NODE_OPTIONS", "NODE_OPTIONS"),
        ("JAVA_TOOL_OPTIONS", "JAVA_TOOL_OPTIONS"),
        ("LUA_INIT", "LUA_*"),
        ("PATH", "PATH"),
        ("HOME", "HOME"),
        ("XDG_CONFIG_HOME", "XDG_*"),
        ("NVIDIA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"),
        ("NVCF_WORKER_TOKEN", "NVCF_WORKER_TOKEN"),
        ("NVCF_ANYTHING", "NVCF_*"),
        ("NVCT_RESULTS_DIR", "NVCT_RESULTS_DIR"),
        ("NVCF_MONO__BUS__URL", "NVCF_*"),
        ("SECRETS_FILE", "SECRETS_FILE"),
        ("CUDA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"),
    ],
)
def test_names_that_change_how_programs_start_or_the_contract_are_refused(name: str, pattern: str) -> None:
    why = tenant_env.name_refusal(name)
    assert why is not None and f"matches {pattern} of the platform's environment rule;" in why, why


def test_every_name_of_the_instance_contract_is_refused() -> None:
    for var in env.CONTRACT:
        assert tenant_env.name_refusal(var.name) is not None, var.name


@pytest.mark.parametrize("name", ["ld_preload", "Ld_Preload", "pythonwarnings", "Browser", "nvcf_worker_token", "path"])
def test_case_variants_are_refused_and_the_refusal_says_case_does_not_matter(name: str) -> None:
    why = tenant_env.name_refusal(name)
    assert why is not None and "without regard to case" in why


@pytest.mark.parametrize("name", ["LD_PRELOAD=x", "A B", "1ABC", "BASH_FUNC_ls%%", "X\0Y", "", "é"])
def test_a_name_has_kubernetes_shape_so_no_name_sets_another_variable(name: str) -> None:
    assert tenant_env.name_refusal(name) is not None


@pytest.mark.parametrize(
    "name",
    ["GREETING", "MODEL_NAME", "my.setting", "x-y", "_private", "PYTHONUNBUFFERED", "PYTHONIOENCODING", "TMPDIR",
     "LANG", "TZ", "HTTP_PROXY", "NGC_API_KEY", "NODE_ENV", "LDAP_URL", "PATHS", "HOMEPAGE", "ENVIRONMENT"],
)  # fmt: skip
def test_ordinary_names_and_pythons_own_flags_are_allowed(name: str) -> None:
    assert tenant_env.name_refusal(name) is None


def test_the_first_refused_variable_is_named_with_the_rule() -> None:
    problem = tenant_env.environment_problem([("A", "1"), ("LD_PRELOAD", "/x.so"), ("PATH", "/x")])
    assert problem is not None and problem.startswith(
        "containerEnvironment 'LD_PRELOAD' is not allowed: it matches LD_*"
    )
    assert "load code" in problem
    assert tenant_env.environment_problem([("A", "1"), ("B", "")]) is None
    nul = tenant_env.environment_problem([("A", "x\0y")])
    assert nul is not None and "'A'" in nul and "NUL" in nul


def test_arguments_are_passed_as_written_and_must_split() -> None:
    assert tenant_env.split_args("--model 'my model' {python} {port}") == ["--model", "my model", "{python}", "{port}"]
    assert tenant_env.args_problem("--x 'unclosed") == "containerArgs cannot be split: No closing quotation"
    assert tenant_env.args_problem("a\0b") == "containerArgs cannot hold a NUL character"
    assert tenant_env.args_problem(None) is None and tenant_env.args_problem("") is None
    assert tenant_env.workload_problem([("BROWSER", "x")], "ok") is not None
    assert tenant_env.workload_problem([("A", "x")], "'") is not None
