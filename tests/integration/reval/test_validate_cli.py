"""``nvcf-mono helm validate``: the same verdicts and texts as the API, from a terminal."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.function_charts import VALUES, write_chart
from tests.integration.reval.test_validate_api import CASES, PRIVILEGED, SERVICE


def validate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nvcf_mono", "helm", "validate", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize("name", list(CASES))
def test_the_table_of_charts(tmp_path: Path, name: str) -> None:
    templates, changes, version, valid, errors = CASES[name]
    chart = write_chart(tmp_path, version=version, templates=templates, values={**VALUES, **changes})
    done = validate(str(chart), "--service-name", "inference-svc", "--service-port", "8001", "--json")
    assert done.returncode == (0 if valid else 1), done.stderr
    answer = json.loads(done.stdout)
    assert (answer["valid"], answer.get("validationErrors", [])) == (valid, errors)


def test_words_values_and_enforcement(tmp_path: Path) -> None:
    chart = write_chart(tmp_path, templates={"i.yaml": PRIVILEGED, "s.yaml": SERVICE})
    warned = validate(str(chart), "--service-name", "inference-svc", "--service-port", "8001")
    assert warned.returncode == 0
    assert warned.stdout.splitlines() == [
        f"{chart}: valid",
        '  warning: containers["server"].securityContext.privileged must not be true (not enforced yet)',
    ]
    enforced = validate(str(chart), "--enforce-security-context", "--set", "serviceType=NodePort")
    assert enforced.returncode == 1
    assert enforced.stdout.splitlines() == [
        f"{chart}: invalid",
        '  error: containers["server"].securityContext.privileged must not be true',
        "  error: service is not ClusterIP",
    ]
    usage = validate(str(chart), "--service-name", "x")
    assert usage.returncode == 2 and "--service-name and --service-port go together" in usage.stderr


def test_images_are_checked_when_asked(tmp_path: Path) -> None:
    # Nothing listens on port 1: the check reaches for the registry (the operator's own command: no network
    # rule) and says why it could not; without the flag no image is asked for.
    chart = write_chart(tmp_path, values={**VALUES, "image": "127.0.0.1:1/acme/inference:1.0"})
    assert validate(str(chart)).returncode == 0
    checked = validate(str(chart), "--validate-images", "--json")
    assert checked.returncode == 1, checked.stderr
    (error,) = json.loads(checked.stdout)["validationErrors"]
    assert (
        error == "cannot check image 127.0.0.1:1/acme/inference:1.0: cannot connect to 127.0.0.1:1: Connection refused"
    )
