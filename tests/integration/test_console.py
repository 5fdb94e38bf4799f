"""The web console in a real browser (Debian's chromium and chromedriver, driven by Selenium).

The platform is the all-in-one host with its real cluster agent and local backend (instances are
real processes, their logs real files). The browser signs in with the admin token, finds the echo
function, scales it from zero and watches its instance come up, reads its logs, invokes it from the
try-it panel; then signs in as another account and cannot see it. Other scenarios make, deploy and
undeploy a function from the console, read why a deployment failed, launch a task with the tasks
key and follow it to its result's download, and page through a long task list. Screenshots of the
main pages go to ``test-artifacts/console/`` (not committed) for a person to look at.

CI installs chromium (``.ci/run``) and sets ``NVCF_MONO_REQUIRE_BROWSER=1``: there a missing browser
fails the test; on a machine without one it is skipped, saying what to install.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest

from nvcf_mono.models.account import DEFAULT_ACCOUNT
from nvcf_mono.testing.platform import credentials, wait_status
from nvcf_mono.testing.running import agent, other_account_key, platform
from tests.integration.compute.conftest import (
    CLUSTER_A,
    all_gone,
    cluster_pids,
    compute_platform,
    create,
    deploy,
    function,
    spec,
)

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "test-artifacts" / "console"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")

if not (CHROMIUM and CHROMEDRIVER):
    if os.environ.get("NVCF_MONO_REQUIRE_BROWSER") == "1":
        raise RuntimeError("NVCF_MONO_REQUIRE_BROWSER=1 but chromium or chromedriver is missing")
    pytest.skip("no browser here: apt-get install chromium chromium-driver", allow_module_level=True)


def _browser(downloads: Path | None = None) -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM or ""
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(flag)
    if downloads is not None:
        options.add_experimental_option(
            "prefs", {"download.default_directory": str(downloads), "download.prompt_for_download": False}
        )
    return webdriver.Chrome(service=Service(CHROMEDRIVER or ""), options=options)


class Page:
    """The console in one browser tab, with waits that say what they waited for."""

    def __init__(self, driver: Any, base: str) -> None:
        from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support.ui import WebDriverWait

        self.driver, self.base, self.by = driver, base, By
        # Parts of the page are drawn again every 2 s: an element found a moment ago may be gone.
        ignored = (NoSuchElementException, StaleElementReferenceException)
        self.wait = WebDriverWait(driver, 60, poll_frequency=0.2, ignored_exceptions=ignored)

    def open(self, fragment: str = "") -> None:
        self.driver.get(f"{self.base}/console#{fragment}")

    def find(self, css: str) -> Any:
        return self.wait.until(lambda d: d.find_element(self.by.CSS_SELECTOR, css), message=f"no {css}")

    def click(self, css: str) -> None:
        """Click ``css`` (found again if it was drawn anew in between)."""

        def clicked(d: Any) -> bool:
            d.find_element(self.by.CSS_SELECTOR, css).click()
            return True

        self.wait.until(clicked, message=f"could not click {css}")

    def text_of(self, css: str, pattern: str) -> str:
        """The text of ``css`` once it matches ``pattern``."""

        def matching(d: Any) -> str | None:
            found = d.find_elements(self.by.CSS_SELECTOR, css)
            return next((e.text for e in found if re.search(pattern, e.text)), None)

        text: str = self.wait.until(matching, message=f"{css} never matched {pattern!r}")
        return text

    def sign_in(self, token: str, *, refused: bool = False) -> None:
        """Sign in; unless ``refused``, wait for the dashboard it lands on."""
        self.open("/signin")
        field = self.find("#token")
        field.clear()
        field.send_keys(token)
        self.click("#signin-submit")
        if not refused:
            self.text_of("#function-count", r"^(\d+|-)$")  # "-": a credential that may not list functions

    def fill(self, fields: dict[str, str]) -> None:
        """Type each value into the field its selector names, over what it held; again into the new field
        when the page redraws it meanwhile (a status change redraws a version's forms).
        """
        from selenium.common.exceptions import StaleElementReferenceException

        for css, value in fields.items():

            def typed(d: Any, css: str = css, value: str = value) -> bool:
                try:
                    field = d.find_element(self.by.CSS_SELECTOR, css)
                    field.clear()
                    field.send_keys(value)
                    return bool(field.get_attribute("value") == value)
                except StaleElementReferenceException:
                    return False

            self.wait.until(typed, message=f"{css} never held {value!r}")

    def accept_confirmation(self) -> None:
        from selenium.webdriver.support import expected_conditions

        self.wait.until(expected_conditions.alert_is_present(), message="no confirmation asked")
        self.driver.switch_to.alert.accept()

    def screenshot(self, name: str) -> None:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        self.driver.save_screenshot(str(SCREENSHOTS / f"{name}.png"))


@contextlib.contextmanager
def _console(base: str, downloads: Path | None = None) -> Iterator[Page]:
    """A browser on the console at ``base``; what it showed when a step failed is kept as ``failure``."""
    page = Page(_browser(downloads), base)
    try:
        yield page
    except Exception:
        page.screenshot("failure")
        raise
    finally:
        page.driver.quit()


def _drawn(polyline: Any) -> bool:
    """A polyline of two points or more (the same point twice, with round caps, is a dot)."""
    return len((polyline.get_attribute("points") or "").split()) >= 2


def _scenario(base: str, admin_token: str, other_key: str, fid: str, vid: str) -> None:
    with _console(base) as page:
        # A wrong credential is refused, and says why.
        page.sign_in("nvapi-not-a-key", refused=True)
        assert "refused" in page.text_of("#signin-error", "refused")

        page.sign_in(admin_token)
        page.text_of("#traffic h2", "Traffic")
        page.screenshot("dashboard")
        assert page.driver.execute_script("return sessionStorage.getItem('nvcf.console.token')") == admin_token
        assert admin_token not in page.driver.current_url

        page.open("/functions")
        page.click('tr[data-function="echo"] a.function-link')
        page.text_of("h1", "echo")
        assert page.text_of("#specs td.min", r"^\d+$") == "0"
        page.screenshot("function-at-zero")

        # What is typed in the scale form stays while the page refreshes around it, also when the
        # focus moves from one field to the next (a refresh comes every 2 s).
        page.fill({"#scale-min": "1"})
        page.find("#scale-max").click()
        time.sleep(2.5)
        assert page.find("#scale-min").get_attribute("value") == "1"

        # Scale from zero: an instance appears, runs, and has logs.
        page.click("#scale-submit")
        page.accept_confirmation()
        page.text_of("#specs td.min", r"^1$")
        page.text_of("#instance-table td", r"^running$")
        page.click("#instance-table .logs-button")
        page.text_of("pre.log", r"\S")
        page.text_of('pre.log[data-log="worker"]', "inference server healthy")
        page.screenshot("function-running")

        # The try-it panel invokes the version and shows what came back.
        page.fill({"#try-body": '{"message": "hello from the console"}'})
        page.click("#try-invoke")
        assert page.text_of("#try-status", r"^\d{3}$") == "200"
        assert "hello from the console" in page.text_of("#try-answer", "hello from the console")
        assert UUID.match(page.text_of("#try-reqid", r"^[0-9a-f-]{36}$"))
        assert "execution" in page.text_of("#try-timing", "execution")
        page.screenshot("try-it")

        # An answer that takes longer than the page's wait (5 s) is followed through its 202s.
        page.fill({"#try-body": '{"message": "slow to come", "delay": 7}'})
        page.click("#try-invoke")
        assert "In progress" in page.text_of("#try-waiting", "In progress")
        assert page.text_of("#try-status", r"^\d{3}$") == "200"
        assert "slow to come" in page.text_of("#try-answer", "slow to come")

        # The dashboard draws that one call's latency: a minute with calls between minutes without
        # any is a mark of its own (a line of one point draws nothing).
        page.open("/")
        latency = "#traffic .grid > div:nth-child(2) polyline"
        page.wait.until(
            lambda d: any(_drawn(e) for e in d.find_elements(page.by.CSS_SELECTOR, latency)), "no latency drawn"
        )
        page.screenshot("dashboard-traffic")

        page.open("/clusters")
        page.text_of("table td", "H100")
        page.screenshot("clusters")

        # Another account: the function is not in its list, and its page is not found.
        page.click("#signout")
        page.sign_in(other_key)
        page.open("/functions")
        page.find("#functions")
        time.sleep(0.5)  # the list is rendered: nothing more will come
        assert not page.driver.find_elements(page.by.CSS_SELECTOR, 'tr[data-function="echo"]')
        page.open(f"/functions/{fid}/versions/{vid}")
        assert "not found" in page.text_of("#page-error", "(?i)not found").lower()

        # The admin token acts on the account chosen in the switcher: the other account's (empty) list,
        # then its own again.
        from selenium.webdriver.support.ui import Select

        page.click("#signout")
        page.sign_in(admin_token)
        Select(page.find("#account")).select_by_value("other-account")
        page.open("/functions")
        page.text_of("#functions td", "No functions")
        Select(page.find("#account")).select_by_value("")
        page.open("/functions")
        page.find('tr[data-function="echo"]')


async def test_the_console_in_a_browser(tmp_path: Path) -> None:
    async with compute_platform(tmp_path) as p:
        creds = credentials(p.host)
        fid, vid, d = await create(p.admin, function("echo"))
        await deploy(p.admin, d, spec(min_instances=0, max_instances=1))
        await wait_status(p.admin, d, "ACTIVE")
        other = await other_account_key(p, "other-account")
        base = p.host.endpoints.url.rstrip("/")
        try:
            with anyio.fail_after(240):
                await anyio.to_thread.run_sync(_scenario, base, creds["admin_token"], other, fid, vid)
        finally:
            # Undeployed before the host stops: the local backend keeps instances for the next agent.
            with anyio.CancelScope(shield=True):
                await p.admin.delete(d)
                await all_gone(cluster_pids(CLUSTER_A), timeout=45)  # a loaded machine drains slowly


async def test_the_console_is_one_page_and_its_files_with_a_strict_policy(tmp_path: Path) -> None:
    async with compute_platform(tmp_path) as p:
        # Not API operations: fetched without the /v3/openapi check.
        session, base = p.anonymous.session, p.host.endpoints.url.rstrip("/")
        for path, kind in (("/console", "text/html"), ("/console/console.js", "text/javascript")):
            async with session.get(f"{base}{path}") as reply:
                assert reply.status == 200 and reply.headers["Content-Type"].startswith(kind)
                policy = reply.headers["Content-Security-Policy"]
                assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
                assert reply.headers["X-Content-Type-Options"] == "nosniff"
        for missing in ("/console/..%2Fpyproject.toml", "/console/__init__.py", "/console/nope.js"):
            async with session.get(f"{base}{missing}") as reply:
                assert reply.status == 404, missing
                assert reply.headers["Content-Type"].startswith("application/problem+json")


def _task_scenario(base: str, task_key: str, downloads: Path) -> str:
    with _console(base, downloads) as page:
        # The tasks key may not list functions: it is signed in all the same, and the dashboard says so.
        page.sign_in(task_key)
        assert "Not allowed" in page.text_of(".card p.muted", "Not allowed")

        # Launched from the list's form (this key may not list cluster groups: GPU and instance type
        # are typed in); the page it lands on is the task's.
        page.open("/tasks")
        page.click("#new-task")
        page.fill({"#task-name": "squares", "#task-image": "task-example", "#task-args": "--steps 3 --seconds 6"})
        page.fill({"#task-type-gpu": "H100", "#task-type-instance-type": "ON-PREM.GPU.H100_1x"})
        page.click("#task-submit")
        page.text_of("h1", "^squares")
        task_id: str = page.driver.current_url.rsplit("/", 1)[-1]
        assert UUID.match(task_id), task_id

        # The page follows the task while it runs, without a reload (it landed on it QUEUED), and so
        # does the list: the task ends while the list is shown.
        page.find("#cancel-task")
        page.text_of("h1 .badge", "^RUNNING$")
        page.open("/tasks")
        page.text_of(f'tr[data-task="{task_id}"] td.status', "^COMPLETED$")
        page.open(f"/tasks/{task_id}")

        # COMPLETED at 100 % with its result; it can be deleted now, no longer cancelled.
        page.text_of("h1 .badge", "^COMPLETED$")
        assert page.text_of("#task-progress", r"^\d+ %$") == "100 %"
        page.find("#delete-task")
        assert not page.driver.find_elements(page.by.CSS_SELECTOR, "#cancel-task")
        page.text_of("td", "^squares.json$")
        page.screenshot("task-completed")

        # The result downloads as the file it was.
        page.click("tr[data-result] button.download")
        saved = downloads / "squares.json"
        page.wait.until(lambda d: saved.exists() and saved.read_text().startswith("{"), "no download")
        assert json.loads(saved.read_text()) == {"squares": [1, 4, 9]}

        page.click("#delete-task")
        page.accept_confirmation()
        page.text_of("h1", "^Tasks$")
        page.find("#tasks")
        assert not page.driver.find_elements(page.by.CSS_SELECTOR, f'tr[data-task="{task_id}"]')
        return task_id


async def test_a_task_in_the_console(tmp_path: Path) -> None:
    async with compute_platform(tmp_path, **{"plugins.control.tasks.heartbeat_interval": "0.5"}) as p:
        key = credentials(p.host)["task_api_key"]
        base = p.host.endpoints.url.rstrip("/")
        with anyio.fail_after(120):
            task_id = await anyio.to_thread.run_sync(_task_scenario, base, key, tmp_path / "downloads")
        assert (await p.admin.get(f"/v1/nvct/tasks/{task_id}")).status == 404


def _tasks_list_scenario(base: str, admin_token: str, count: int) -> None:
    with _console(base) as page:
        page.sign_in(admin_token)
        page.open("/tasks")
        rows = "tr[data-task]"
        page.wait.until(lambda d: len(d.find_elements(page.by.CSS_SELECTOR, rows)) == 100, "not the first 100 tasks")
        page.click("#more-tasks")
        page.wait.until(lambda d: len(d.find_elements(page.by.CSS_SELECTOR, rows)) == count, f"not all {count} tasks")
        assert not page.driver.find_elements(page.by.CSS_SELECTOR, "#more-tasks")  # the last page has no cursor


async def test_the_task_list_shows_every_task_a_page_at_a_time(tmp_path: Path) -> None:
    count = 105  # the API answers 100 at most a page
    async with platform(tmp_path) as p, agent(p.bus):
        raised = await p.admin.patch(f"/v2/nvcf/accounts/{DEFAULT_ACCOUNT}", {"maxTasksAllowed": count})
        assert raised.status == 200, raised.body
        gpu = {"gpu": "H100", "instanceType": "ON-PREM.GPU.H100_1x"}
        for n in range(count):
            body = {"name": f"t{n}", "containerImage": "registry.example.com/t:1", "gpuSpecification": gpu}
            assert (await p.admin.post("/v1/nvct/tasks", body)).status == 200
        base = p.host.endpoints.url.rstrip("/")
        with anyio.fail_after(120):
            await anyio.to_thread.run_sync(_tasks_list_scenario, base, credentials(p.host)["admin_token"], count)


def _deploy_scenario(base: str, admin_token: str, fid: str, vid: str) -> None:
    with _console(base) as page:
        page.sign_in(admin_token)
        # The function list follows a deployment made elsewhere (here, the API), without a reload.
        page.open("/functions")
        row = 'tr[data-function="echo"] .badge'
        page.text_of(row, "^INACTIVE$")
        spec = {"gpu": "H100", "instanceType": "ON-PREM.GPU.H100_1x", "minInstances": 0, "maxInstances": 1}
        deploy = urllib.request.Request(
            f"{base}/v2/nvcf/deployments/functions/{fid}/versions/{vid}",
            data=json.dumps({"deploymentSpecifications": [spec]}).encode(),
            headers={"Authorization": f"Bearer {admin_token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(deploy, timeout=30) as answer:
            assert answer.status == 200
        page.text_of(row, "^ACTIVE$")

        # On its page the version's status follows what is done there: INACTIVE once undeployed,
        # ACTIVE once deployed again (at zero instances).
        page.open(f"/functions/{fid}/versions/{vid}")
        page.text_of("#version-status", "^ACTIVE$")
        page.text_of("#telemetry", "^traces → collector, logs → collector$")  # its endpoints, by name
        page.click("#undeploy")
        page.accept_confirmation()
        page.text_of("#version-status", "^INACTIVE$")
        page.fill({"#deploy-min": "0"})
        page.click("#deploy button[type=submit]")
        page.text_of("#version-status", "^ACTIVE$")

        # A function made from the list's form: a refusal says why and makes nothing; then one is made,
        # and the page it lands on is its version's, ready to deploy.
        page.open("/functions")
        page.click("#new-function")
        page.fill({"#new-name": "made-here", "#new-image": "Not/An/Image", "#new-inference-url": "/echo"})
        page.fill({"#new-inference-port": "9000", "#new-health-uri": "/health"})
        page.click("#new-submit")
        assert "containerImage" in page.text_of("#toast", "Creating failed")
        page.fill({"#new-image": "echo"})
        page.click("#new-submit")
        page.text_of("h1", "^made-here")
        page.text_of("#version-status", "^INACTIVE$")
        page.find("#deploy")


async def test_a_function_made_deployed_and_undeployed_from_the_console(tmp_path: Path) -> None:
    # A collector on this host: the operator allows loopback endpoints.
    async with compute_platform(tmp_path, **{"plugins.control.telemetry_networks": '["127.0.0.0/8"]'}) as p:
        tel = await p.admin.post(
            "/v2/nvcf/telemetries",
            {
                "endpoint": "http://127.0.0.1:9",  # nothing listens: its exports fail, the function is unaffected
                "protocol": "HTTP",
                "provider": "OTEL_COLLECTOR",
                "types": ["LOGS", "TRACES"],
                "secret": {"name": "collector", "value": "token"},
            },
        )
        tid = tel.json["telemetry"]["telemetryId"]
        chosen = {"tracesTelemetryId": tid, "logsTelemetryId": tid}
        fid, vid, _ = await create(p.admin, function("echo", telemetries=chosen))
        base = p.host.endpoints.url.rstrip("/")
        with anyio.fail_after(120):
            await anyio.to_thread.run_sync(_deploy_scenario, base, credentials(p.host)["admin_token"], fid, vid)
        listed = (await p.admin.get("/v2/nvcf/functions")).json["functions"]
        assert sorted(f["name"] for f in listed) == ["echo", "made-here"]  # the refused one made nothing


def _failed_deployment_scenario(base: str, admin_token: str, fid: str, vid: str) -> str:
    with _console(base) as page:
        page.sign_in(admin_token)
        page.open(f"/functions/{fid}/versions/{vid}")
        page.text_of("#version-status", "^ERROR$")
        text: str = page.text_of("#deployment pre.health-info", "does not exist")
        page.screenshot("deployment-error")
        return text


async def test_a_failed_deployment_says_why_on_its_page(tmp_path: Path) -> None:
    broken = {"images.broken.command": json.dumps(["/nonexistent/bin/server", "--port", "{port}"])}
    async with compute_platform(tmp_path, **broken) as p:
        fid, vid, d = await create(p.admin, function("broken", containerImage="broken"))
        await deploy(p.admin, d, spec(min_instances=1))
        await wait_status(p.admin, d, "ERROR", timeout=30)
        base = p.host.endpoints.url.rstrip("/")
        with anyio.fail_after(120):
            shown = await anyio.to_thread.run_sync(
                _failed_deployment_scenario, base, credentials(p.host)["admin_token"], fid, vid
            )
        assert "/nonexistent/bin/server" in shown


def _many_functions_scenario(base: str, admin_token: str) -> None:
    with _console(base) as page:
        page.sign_in(admin_token)
        assert page.text_of("#queue-now .muted", "deployed functions") == "in the first 25 of 26 deployed functions"


async def test_the_dashboard_says_when_it_counts_only_some_queues(tmp_path: Path) -> None:
    # The dashboard asks for a queue per function, 25 at most: past that it says how many it counted.
    async with platform(tmp_path) as p, agent(p.bus):
        at_zero = {"gpu": "H100", "instanceType": "ON-PREM.GPU.H100_1x", "minInstances": 0, "maxInstances": 1}
        for n in range(26):
            _, _, d = await create(p.admin, function(f"f{n}"))
            assert (await p.admin.post(d, {"deploymentSpecifications": [at_zero]})).status == 200
        await create(p.admin, function("never-deployed"))  # not counted: it has no queue
        base = p.host.endpoints.url.rstrip("/")
        with anyio.fail_after(120):
            await anyio.to_thread.run_sync(_many_functions_scenario, base, credentials(p.host)["admin_token"])
