"""What goes into HCS's cluster image, chosen from a Debian root with the hcsd package installed.

The image holds a Python service and nothing else: the Debian packages python3 needs (their
Depends and Pre-Depends, closed over), the packages owning the native libraries the venv's
extension modules link against (the build finds them with ldd), base-files, the venv
/opt/hcsd/venv-VERSION with the package's /usr/bin links, /etc/passwd and /etc/group (with the
nonroot user 65532), and a dpkg status file listing exactly the packages inside (for scanners).
Every package's documentation (but its copyright file), man pages, locales and lintian files
stay out, as do packages only maintainer scripts need (dpkg, debconf, perl): no shell, no
package manager, no systemd, no kernel.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

SEEDS = ("python3", "base-files", "netbase", "tzdata")
#: Packages a Depends reaches only for maintainer scripts or the init system: never in the image.
LEFT_OUT = frozenset(
    {"dpkg", "debconf", "perl-base", "init-system-helpers", "systemd", "systemd-sysv", "libc-bin"}
)
#: Paths of kept packages that a service never reads (copyright files are kept, see `wanted`).
DROPPED = (
    "/usr/share/doc/", "/usr/share/man/", "/usr/share/info/", "/usr/share/locale/",
    "/usr/share/lintian/", "/usr/share/bug/", "/usr/share/menu/", "/usr/share/doc-base/",
    "/usr/share/bash-completion/", "/usr/share/pixmaps/", "/usr/share/applications/",
    "/usr/lib/hcs/wheels", "/usr/lib/hcs/bpf", "/usr/lib/hcs/libhcs.so",
    "/usr/lib/hcs/install-venv",
    "/usr/share/hcsd/", "/lib/systemd/", "/usr/lib/systemd/", "/usr/lib/tmpfiles.d/",
    "/usr/share/containers/", "/etc/hcsd/",
)  # fmt: skip
#: Always there: the top-level links of merged /usr, the passwd files, the venv.
EXTRA = ("/bin", "/sbin", "/lib", "/lib64", "/etc/passwd", "/etc/group", "/tmp")  # noqa: S108
#: Made by the package's postinst (so in no file list): taken whole.
TREES = ("/opt/hcsd",)


@dataclass(frozen=True)
class Package:
    name: str
    paragraph: str
    depends: tuple[tuple[str, ...], ...]  # alternatives per dependency
    provides: tuple[str, ...]


def _names(field: str) -> list[tuple[str, ...]]:
    """`a (>= 1) | b, c:any` → [(a, b), (c,)]: names only, versions and arch qualifiers dropped."""
    return [
        tuple(re.split(r"[\s(:]", alt.strip(), maxsplit=1)[0] for alt in dep.split("|"))
        for dep in field.split(",")
        if dep.strip()
    ]


def _field(paragraph: str, name: str) -> str:
    match = re.search(rf"^{name}: (.*(?:\n .*)*)", paragraph, re.MULTILINE)
    return match.group(1).replace("\n", " ") if match else ""


def installed(status: str) -> dict[str, Package]:
    """The installed packages of a dpkg status file."""
    packages: dict[str, Package] = {}
    for paragraph in status.strip().split("\n\n"):
        if "Status: install ok installed" not in paragraph:
            continue
        name = _field(paragraph, "Package")
        depends = _names(_field(paragraph, "Pre-Depends")) + _names(_field(paragraph, "Depends"))
        provides = tuple(alt[0] for alt in _names(_field(paragraph, "Provides")))
        packages[name] = Package(name, paragraph.strip() + "\n", tuple(depends), provides)
    return packages


def closure(packages: dict[str, Package], seeds: list[str]) -> list[str]:
    """The seeds and everything they depend on, through the first installed alternative."""
    providers: dict[str, str] = {}
    for package in packages.values():
        for virtual in package.provides:
            providers.setdefault(virtual, package.name)

    def first(alternatives: tuple[str, ...]) -> str | None:
        for name in alternatives:
            if name in packages:
                return name
            if name in providers:
                return providers[name]
        return None

    wanted: set[str] = set()
    todo = [s for s in seeds if s in packages]
    while todo:
        name = todo.pop()
        if name in wanted or name in LEFT_OUT:
            continue
        wanted.add(name)
        todo += [f for f in map(first, packages[name].depends) if f is not None]
    return sorted(wanted)


def wanted(path: str) -> bool:
    if path.startswith("/usr/share/doc/") and path.endswith("/copyright"):
        return True
    return not any(path.startswith(prefix) or path + "/" == prefix for prefix in DROPPED)


def package_paths(root: Path, name: str) -> list[str]:
    info = root / "var/lib/dpkg/info"
    for list_file in (info / f"{name}.list", info / f"{name}:amd64.list"):
        if list_file.exists():
            return [p for p in list_file.read_text().splitlines() if p not in ("", "/.")]
    raise FileNotFoundError(f"no dpkg file list for {name} in {info}")


def resolve(root: Path, path: str) -> str | None:
    """`path` with every directory symlink on the way resolved inside `root` (merged /usr:
    /lib/x86_64-linux-gnu/libc.so.6 is usr/lib/...), the last component kept as it is;
    None when it does not exist."""
    parts = [p for p in path.split("/") if p]
    done: list[str] = []
    for i, part in enumerate(parts):
        here = root.joinpath(*done, part)
        if i < len(parts) - 1 and here.is_symlink():
            target = os.readlink(here)
            base = [] if target.startswith("/") else done
            joined = os.path.normpath("/".join(["", *base, target]))
            done = [p for p in (resolve(root, joined) or joined).split("/") if p]
            continue
        done.append(part)
    return "/" + "/".join(done) if os.path.lexists(root.joinpath(*done)) else None


def select(root: Path, seeds: list[str]) -> tuple[list[str], str]:
    """The image's paths (relative to `root`, resolved, with every __pycache__ of a kept
    directory) and its dpkg status file."""
    packages = installed((root / "var/lib/dpkg/status").read_text())
    kept = closure(packages, [*SEEDS, *seeds])
    chosen: set[str] = set()
    for name in [*kept, "hcsd"]:
        for path in package_paths(root, name):
            real = resolve(root, path) if wanted(path) else None
            if real is not None and wanted(real):
                chosen.add(real)
    for path in EXTRA:
        if os.path.lexists(root / path.lstrip("/")):
            chosen.add(path)
    trees = list(TREES)
    for path in list(chosen):
        cache = root / path.lstrip("/") / "__pycache__"
        if cache.is_dir() and not cache.is_symlink():
            trees.append(f"{path}/__pycache__")
    for tree in trees:
        for directory, dirs, files in os.walk(root / tree.lstrip("/")):
            inside = "/" + os.path.relpath(directory, root)
            chosen.update(f"{inside}/{name}".replace("//", "/") for name in [*dirs, *files])
            chosen.add(inside)
    status = "\n".join(packages[n].paragraph for n in [*kept, "hcsd"])
    return sorted(chosen), status
