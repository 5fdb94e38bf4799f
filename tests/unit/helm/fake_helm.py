"""A stand-in for the ``helm`` executable, for the binary renderer's tests (no helm binary is installed here).

It is NOT helm: it implements only the commands and flags the binary renderer runs (``show chart``,
``show crds``, ``template``), renders with Helm's Go SDK (helm-python-sdk), and writes its
output and errors in helm's formats (``---`` / ``# Source: <template>`` documents; ``Error: ...`` on
stderr, exit 1). Any other flag is refused, the way helm refuses unknown flags. What the tests learn
from it is how the renderer calls helm and reads its answers; helm's own rendering is the SDK's.

``FAKE_HELM_LOG``: append each argv (JSON) there. Remote charts never reach helm: the platform fetches
them and hands helm a local archive.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import helm_python
import yaml


class Refused(Exception):
    pass


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise Refused(message)


def _parser() -> Parser:
    parser = Parser(prog="helm")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    show = sub.add_parser("show")
    show.add_argument("what", choices=("chart", "crds"))
    show.add_argument("chart")
    template = sub.add_parser("template")
    template.add_argument("release")
    template.add_argument("chart")
    template.add_argument("--namespace", required=True)
    template.add_argument("--values", action="append", default=[])
    template.add_argument("--skip-crds", action="store_true")
    template.add_argument("--no-hooks", action="store_true")
    return parser


def _documents(text: str) -> list[str]:
    return [doc.strip("\n") for doc in text.split("\n---") if doc.strip() and doc.strip() != "---"]


def main(argv: list[str]) -> int:
    log = os.environ.get("FAKE_HELM_LOG")
    if log:
        with open(log, "a") as out:
            out.write(json.dumps(argv) + "\n")
    try:
        args = _parser().parse_args(argv)
        with helm_python.Chart.load(args.chart) as chart:
            if args.command == "show" and args.what == "chart":
                sys.stdout.write(yaml.safe_dump(chart.metadata, sort_keys=False))
            elif args.command == "show":
                for crd in chart.crds:
                    sys.stdout.write(f"---\n{crd['data'].rstrip()}\n")
            else:
                values: dict[str, object] = {}
                for path in args.values:
                    values.update(yaml.safe_load(Path(path).read_text()) or {})
                rendered = chart.render(values, name=args.release, namespace=args.namespace, is_install=True)
                for path in sorted(rendered):
                    base = path.rsplit("/", 1)[-1]
                    if base.startswith("_") or base == "NOTES.txt":
                        continue
                    for doc in _documents(rendered[path]):
                        if args.no_hooks and "helm.sh/hook" in doc:
                            continue
                        sys.stdout.write(f"---\n# Source: {path}\n{doc}\n")
    except (Refused, helm_python.HelmError) as err:
        sys.stderr.write(f"Error: {err}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
