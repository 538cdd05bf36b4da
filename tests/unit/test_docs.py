"""The docs name only what exists: every repository path in backticks (`hcsd/…`, `tests/…`,
`libhcs/…`, …), every `hcsd.module.attribute`, and every relative link in README*.md and
docs/*.md. A rename that forgets the docs fails here instead of misleading the next reader.

Paths with a placeholder (`<version>`, `*`, `…`) and build outputs (`build/`, `out/`) are
not checked; they name no file of the tree.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path

import pytest

from tests.harness.daemon import ROOT

DOCS = sorted([*ROOT.glob("README*.md"), *(ROOT / "docs").glob("*.md")])
TOP = "hcsd|tests|libhcs|bpf|packaging|docs|bench|scripts|systemd|examples|proto"
PATH = re.compile(rf"^(?:{TOP})/[\w./-]*$")
MODULE = re.compile(r"^hcsd(?:\.\w+)+$")
LINK = re.compile(r"\]\(([^)\s]+)\)")
NOT_IN_TREE = {"build", "build-arm64", "out"}  # made by the build
PROTO_PACKAGES = {"hcsd.v1"}  # dotted, but a .proto package, not a Python module


def backticked(text: str) -> list[tuple[int, str]]:
    """(line number, code span) for each one-word code span."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        found += [(number, span) for span in line.split("`")[1::2] if span and " " not in span]
    return found


def module_problem(name: str) -> str | None:
    """None when `name` is a module of hcsd, or a module and attributes of it."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        try:
            spec = importlib.util.find_spec(module)
        except ModuleNotFoundError:
            spec = None
        if spec is None:
            continue
        obj: object = importlib.import_module(module)
        for attribute in parts[cut:]:
            if not hasattr(obj, attribute):
                return f"{module} has no {'.'.join(parts[cut:])}"
            obj = getattr(obj, attribute)
        return None
    return "no such module"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_named_path_module_and_link_exists(doc: Path) -> None:
    text = doc.read_text()
    problems = []
    for number, written in backticked(text):
        token = written.rstrip(".,;:)")
        if PATH.match(token) and not NOT_IN_TREE & set(token.split("/")):
            if not (ROOT / token).exists():
                problems.append(f"{doc.name}:{number}: `{token}` does not exist")
        elif (
            MODULE.match(token)
            and token not in PROTO_PACKAGES
            and (why := module_problem(token)) is not None
        ):
            problems.append(f"{doc.name}:{number}: `{token}`: {why}")
    for number, line in enumerate(text.splitlines(), 1):
        for target in LINK.findall(line):
            if "://" in target or target.startswith("#"):
                continue
            if not (doc.parent / target.split("#")[0]).exists():
                problems.append(f"{doc.name}:{number}: link {target} goes nowhere")
    assert not problems, "\n".join(problems)


def test_the_check_sees_a_missing_path_and_a_missing_attribute() -> None:
    assert PATH.match("hcsd/daemon/main.py") and not (ROOT / "hcsd/daemon/main.py").exists()
    assert module_problem("hcsd.daemon.lifecycle.RELOAD_STEPS") is None
    assert module_problem("hcsd.daemon.lifecycle.NO_SUCH") == "hcsd.daemon.lifecycle has no NO_SUCH"
    assert module_problem("hcsd.daemon.main") == "hcsd.daemon has no main"
    assert module_problem("hcsd.hooks.oci_hook") == "hcsd has no hooks.oci_hook"
    assert backticked("see `hcsd/x.py` and `a b`\uff0c`c`") == [(1, "hcsd/x.py"), (1, "c")]


def test_the_chinese_readme_keeps_up_with_the_english_one() -> None:
    """The same sections, and the same commands, paths and names in code spans."""
    english, chinese = (ROOT / "README.md").read_text(), (ROOT / "README_CN.md").read_text()
    assert chinese.count("\n## ") == english.count("\n## ")
    spans = [{span for _, span in backticked(text)} for text in (english, chinese)]
    only_english, only_chinese = sorted(spans[0] - spans[1]), sorted(spans[1] - spans[0])
    assert not only_english and not only_chinese, f"README.md: {only_english}, CN: {only_chinese}"


def test_the_install_docs_node_steps_are_what_the_vm_test_runs() -> None:
    """docs/install.md: each `node` command is a line of tests/e2e/vm-inside.sh (Debian 12
    under a real systemd), and the package it installs is the .deb the VM test installs;
    the `cluster` blocks run in tests/kubelet/test_helm_install.py."""
    from tests.harness import install_doc

    assert set(install_doc.marks()) == set(install_doc.KINDS), install_doc.marks()
    assert len(install_doc.marks()) == sum(len(install_doc.blocks(k)) for k in install_doc.KINDS)
    vm_lines = {line.strip() for line in (ROOT / "tests/e2e/vm-inside.sh").read_text().splitlines()}
    node = [c for b in install_doc.blocks("node") for c in install_doc.commands(b)]
    assert node == ["hcsctl setup containerd --yes", "systemctl enable --now hcsd"], node
    missing = [c for c in node if not any(line.startswith(c) for line in vm_lines)]
    assert not missing, f"node steps the VM test does not run: {missing}"
    (package,) = install_doc.blocks("node-package")
    assert "apt-get install ./hcsd_" in package and "dnf install ./hcsd-" in package, package
    assert "dpkg -i /hcsd.deb" in (ROOT / "tests/e2e/test_vm.py").read_text()
