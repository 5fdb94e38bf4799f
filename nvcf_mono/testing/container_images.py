"""Container images for tests and benchmarks, built offline.

No registry on the internet is reachable where the tests run, so images are assembled here: from
Debian's ``busybox-static`` (``httpd`` and CGI scripts: small, and a real image with its own
entrypoint, env and files), and for the example model server from this machine's own Python.
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import socket
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from nvcf_mono.ports import spare_port

ECHO_IMAGE = "localhost/nvcf-test/echo:1"
#: The same, running as uid and gid 1000 (as many published images do): no group in common with the host.
ECHO_USER_IMAGE = "localhost/nvcf-test/echo-user:1"

#: POST /cgi-bin/echo answers what the container sees: the request, its secrets, its env, and what it can read.
ECHO_CGI = r"""#!/bin/sh
body=$(head -c "${CONTENT_LENGTH:-0}")
probe=$(cat "${PROBE_PATH:-/nonexistent}" 2>&1 | head -c 200 | tr -d '"\n\\')
wrote=no
# Writable, and left empty: a file left there would make the answer a large response (a 302 to a zip).
out="$HTTP_NVCF_LARGE_OUTPUT_DIR"
if [ -n "$out" ] && echo made > "$out/probe.txt" && rm "$out/probe.txt"; then wrote=yes; fi
echo "Content-Type: application/json"
echo ""
printf '{"echo": %s, "secrets": %s, "instance": "%s", "port": "%s", "function": "%s", "greeting": "%s", ' \
  "${body:-null}" "$(cat /var/secrets/secrets.json 2>/dev/null || echo null)" "$NVCF_INSTANCE_ID" \
  "$INFERENCE_PORT" "$NVCF_FUNCTION_ID" "$GREETING"
printf '"image_env": "%s", "probe": "%s", "token": "%s", "uid": "%s", "wrote_output": "%s"}' \
  "$IMAGE_ENV" "$probe" "${NVCF_WORKER_TOKEN:-none}" "$(id -u)" "$wrote"
"""

#: POST /cgi-bin/stream: three server-sent events, a little apart.
STREAM_CGI = r"""#!/bin/sh
head -c "${CONTENT_LENGTH:-0}" >/dev/null
echo "Content-Type: text/event-stream"
echo ""
for i in 1 2 3; do
  echo "data: event $i"
  echo ""
  sleep 0.2
done
"""


#: What podman needs on machines like CI's: runc (crun fails on hybrid cgroups), cgroupfs, and rlimits no
#: higher than the sandbox's hard limits (it lacks CAP_SYS_RESOURCE).
CONTAINERS_CONF = """[containers]
default_ulimits = ["nofile={n}:{n}", "nproc={n}:{n}"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
"""


def write_containers_conf(path: Path) -> Path:
    """A ``containers.conf`` for this machine (point ``CONTAINERS_CONF`` at it)."""
    hard = min(resource.getrlimit(resource.RLIMIT_NOFILE)[1], resource.getrlimit(resource.RLIMIT_NPROC)[1])
    path.write_text(CONTAINERS_CONF.format(n=min(hard, 10000)))
    return path


#: The image's command: httpd under a shell that stops it on SIGTERM (PID 1 has no default action for it,
#: and a server that ignores it makes every stop wait out the grace period).
SERVE = "trap 'kill $server; exit 0' TERM; httpd -f -p 9000 -h /www & server=$!; wait $server"


def _rootfs(root: Path) -> None:
    busybox = shutil.which("busybox")
    assert busybox is not None, "busybox-static is needed to build the test images (apt-get install busybox-static)"
    (root / "bin").mkdir(parents=True)
    (root / "www" / "cgi-bin").mkdir(parents=True)
    (root / "tmp").mkdir()
    (root / "tmp").chmod(0o1777)
    shutil.copy(busybox, root / "bin" / "busybox")
    names = subprocess.run([busybox, "--list"], capture_output=True, text=True, check=True).stdout.split()
    for name in names:
        if name != "busybox":
            (root / "bin" / name).symlink_to("busybox")
    for name, text in (("echo", ECHO_CGI), ("stream", STREAM_CGI)):
        path = root / "www" / "cgi-bin" / name
        path.write_text(text)
        path.chmod(0o755)
    (root / "www" / "health").write_text("ok\n")


def build_echo_image(podman: str) -> str:
    """``ECHO_IMAGE``: busybox httpd on port 9000 serving the CGI scripts above, and ``ECHO_USER_IMAGE``, the
    same as uid 1000 (both built again each session).
    """
    _import_echo(podman, {ECHO_IMAGE: [], ECHO_USER_IMAGE: ["--change", "USER 1000:1000"]})
    return ECHO_IMAGE


def _import_echo(podman: str, names: dict[str, list[str]], files: dict[str, str] | None = None) -> None:
    """The echo image, with ``files`` (path under ``/www``: text) too, as each of ``names`` (name: its own
    ``podman import`` options); one layer, made now.
    """
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "root"
        _rootfs(root)
        for path, text in (files or {}).items():
            (root / "www" / path).write_text(text)
        archive = Path(tmp) / "root.tar"
        with tarfile.open(archive, "w") as tar:
            tar.add(root, arcname=".")
        for name, options in names.items():
            changes = ["--change", f"CMD {json.dumps(['/bin/sh', '-c', SERVE])}"]
            changes += ["--change", "ENV IMAGE_ENV=from-the-image", *options]
            subprocess.run([podman, "import", *changes, str(archive), name], check=True, capture_output=True)


#: The example model server (``nvcf_mono.examples.llm``) on port 8000, as its own image.
LLM_IMAGE = "localhost/nvcf-test/llm:1"
#: Where the image keeps the example and the packages it imports (its PYTHONPATH).
APP = "/app"
#: Parts of the standard library the example never imports (tests, GUIs, build files, bundled wheels).
_NOT_NEEDED = re.compile(
    r"(^|/)(test|tests|idlelib|tkinter|turtledemo|ensurepip|lib2to3|site-packages|dist-packages|config-[^/]*)(/|$)"
    r"|\.opt-[12]\.pyc$"
)
#: Prints the extension modules the example loads, and the top-level packages (or single modules) it
#: imports from outside the standard library ({path: name}); run by the Python the image is made of.
_IMPORTED = """
import json, os, sys, sysconfig
import nvcf_mono.examples.llm
stdlib = sysconfig.get_path("stdlib")
entries = sorted((os.path.abspath(p) for p in sys.path if p and os.path.isdir(p)), key=len, reverse=True)
roots, extensions = {}, []
for module in list(sys.modules.values()):
    file = getattr(module, "__file__", None)
    if file and file.endswith(".so"):
        extensions.append(file)
    if not file or (file.startswith(stdlib + os.sep) and "-packages" + os.sep not in file):
        continue  # the standard library (copied whole), not packages installed inside it
    entry = next((e for e in entries if file.startswith(e + os.sep)), None)
    if entry is not None:
        top = file[len(entry) + 1 :].split(os.sep, 1)[0]
        roots[os.path.join(entry, top)] = top
        vendored = os.path.join(entry, top + ".libs")  # a wheel's own shared libraries, beside it
        if os.path.isdir(vendored):
            roots[vendored] = top + ".libs"
print(json.dumps({"roots": roots, "extensions": extensions}))
"""


def _shared_libraries(binaries: list[str]) -> set[str]:
    """The shared libraries ``binaries`` load (``ldd``), the dynamic loader included."""
    found: set[str] = set()
    for binary in binaries:
        out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=False).stdout
        found.update(os.path.normpath(m.group(1)) for m in re.finditer(r"(?:=> )?(/\S+) \(0x", out))
    return found


def build_llm_image(podman: str) -> str:
    """``LLM_IMAGE``: the example model server run by this machine's Python, copied into an image.

    The interpreter, the shared libraries it and its extension modules load (at the same paths, so
    its own library path finds them), the standard library without its tests, and the packages the
    example imports (``aiohttp`` and its dependencies, ``nvcf_mono``) under APP. Built again each session.
    """
    python = os.path.realpath(sys.executable)
    stdlib = sysconfig.get_path("stdlib")
    found = subprocess.run([sys.executable, "-c", _IMPORTED], capture_output=True, text=True, check=True)
    imported = json.loads(found.stdout)
    packages: dict[str, str] = imported["roots"]
    # What the interpreter and the extensions it loads need (not every extension of the standard library:
    # _tkinter would bring X11).
    libraries = _shared_libraries([python, *imported["extensions"]])

    def lean(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        return None if _NOT_NEEDED.search(info.name) else info

    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(tmp) / "root.tar"
        with tarfile.open(archive, "w") as tar:
            for directory in ("tmp", APP.strip("/")):
                info = tarfile.TarInfo(directory)
                info.type, info.mode = tarfile.DIRTYPE, 0o1777 if directory == "tmp" else 0o755
                tar.addfile(info)
            tar.add(python, arcname=python)
            for library in sorted(libraries):
                tar.add(os.path.realpath(library), arcname=library)
            tar.add(stdlib, arcname=stdlib, filter=lean)
            for source, name in sorted(packages.items()):
                tar.add(source, arcname=f"{APP}/{name}", filter=lean)
        command = [python, "-m", "nvcf_mono.examples.llm", "--host", "0.0.0.0", "--port", "8000"]
        changes = ["--change", f"CMD {json.dumps(command)}", "--change", f"ENV PYTHONPATH={APP}"]
        changes += ["--change", "ENV PYTHONDONTWRITEBYTECODE=1"]
        subprocess.run([podman, "import", *changes, str(archive), LLM_IMAGE], check=True, capture_output=True)
    return LLM_IMAGE


@contextmanager
def registry_server(workdir: Path, *, tls: tuple[Path, Path] | None = None) -> Iterator[str]:
    """A real registry (Debian's ``docker-registry``) on 127.0.0.1 with one user, ``alice``/``wonderland``
    (basic authentication), storing under ``workdir``; yields its ``host:port``. ``tls``: its certificate
    and key files (HTTPS); without, it speaks HTTP.
    """
    registry = shutil.which("docker-registry")
    assert registry is not None, "docker-registry is needed for this test (apt-get install docker-registry)"
    port = spare_port()
    host = f"127.0.0.1:{port}"
    workdir.mkdir(parents=True, exist_ok=True)
    users = subprocess.run(["htpasswd", "-Bbn", "alice", "wonderland"], capture_output=True, text=True, check=True)
    (workdir / "htpasswd").write_text(users.stdout)
    served = f"http:\n  addr: {host}\n"
    if tls is not None:
        served += f"  tls:\n    certificate: {tls[0]}\n    key: {tls[1]}\n"
    (workdir / "config.yml").write_text(
        f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {workdir / 'data'}\n"
        f"{served}auth:\n  htpasswd:\n    realm: test\n    path: {workdir / 'htpasswd'}\n"
    )
    with open(workdir / "registry.log", "wb") as log:
        proc = subprocess.Popen([registry, "serve", str(workdir / "config.yml")], stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(100):
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    break
            except OSError:
                time.sleep(0.05)
        yield host
    finally:
        proc.terminate()
        proc.wait(10)


def _again(command: list[str], tries: int = 3) -> str:
    """Run ``command``, again after a failure; what it printed. In whole test runs Podman 4.3 once failed a
    build (exit status 125) and once failed a list of images ("image not known" for one it had found), neither
    seen when tried alone; the last failure says what the command printed.
    """
    for attempt in range(tries):
        done = subprocess.run(command, capture_output=True, check=False)
        if done.returncode == 0:
            return done.stdout.decode(errors="replace")
        if attempt + 1 < tries:
            time.sleep(1)
    raise AssertionError(
        f"{' '.join(command)} failed ({done.returncode}): {done.stderr.decode(errors='replace')[-2000:]}"
    )


#: What ``private_registry`` holds: tag -> (manifest format, the file its top layer adds under /www, or
#: None for the image the others are made from).
PRIVATE_TAGS = {"1": ("oci", None), "2": ("v2s2", None), "3": ("oci", "added"), "4": ("oci", "other")}


@contextmanager
def private_registry(podman: str, workdir: Path, *, tls: tuple[Path, Path] | None = None) -> Iterator[str]:
    """:func:`registry_server` holding an echo image no engine here has a layer of, made now (its one layer
    adds ``/www/private``), as ``nvcf-test/private:1`` (OCI's manifest) and ``nvcf-test/private:2``
    (Docker's), and that image with a layer more as ``:3`` (adding ``/www/added``) and ``:4``
    (``/www/other``), which share its layer; yields its ``host:port``. Without ``tls`` it speaks HTTP,
    and Podman reaches it where ``CONTAINERS_REGISTRIES_CONF`` names ``workdir/registries.conf`` (it
    marks the registry insecure). The engine keeps no local copy of any.
    """
    with registry_server(workdir, tls=tls) as host:
        port = host.rsplit(":", 1)[1]
        conf = workdir / "registries.conf"
        conf.write_text(
            "".join(f'[[registry]]\nlocation = "{h}:{port}"\ninsecure = true\n' for h in ("127.0.0.1", "localhost"))
        )
        source = f"localhost/nvcf-test/private-source:{port}"
        made = [source]
        try:
            _import_echo(podman, {source: []}, {"private": f"made {time.time_ns()}\n"})
            for tag, (kind, added) in PRIVATE_TAGS.items():
                local = source
                if added is not None:
                    local = f"{source}-{tag}"
                    context = workdir / f"build-{tag}"
                    context.mkdir()
                    (context / added).write_text(f"added by tag {tag}\n")
                    (context / "Containerfile").write_text(f"FROM {source}\nCOPY {added} /www/{added}\n")
                    _again([podman, "build", "-q", "-t", local, str(context)])
                    made.append(local)
                push = ["push", "--tls-verify=false", "--creds", "alice:wonderland", "--format", kind]
                _again([podman, *push, local, f"docker://{host}/nvcf-test/private:{tag}"])
        finally:
            subprocess.run([podman, "rmi", "-f", *made], capture_output=True, check=False)
        try:
            yield host
        finally:
            # Whatever the tests brought onto the host from it, under any tag (a digest's too).
            listed = [podman, "images", "--format", "{{.Repository}}:{{.Tag}}"]
            try:
                names = _again(listed).split()
            except AssertionError:
                names = []  # left behind: a failure of the test itself is the one to see
            pulled = [n for n in names if n.startswith((f"127.0.0.1:{port}/", f"localhost:{port}/"))]
            if pulled:
                subprocess.run([podman, "rmi", "-f", *pulled], capture_output=True, check=False)
