"""SIGKILL for a whole container found through its real cgroup, and for nothing else."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from hcsd.watchdog.cgroups import CgroupMapper, CgroupMount, owner
from hcsd.watchdog.killing import Killer
from tests.harness.waiting import wait_for
from tests.watchdog.cgroup import Containers

# A process that forks a child every 20 ms for as long as it lives: the kill must catch the
# children forked while the first signals fly.
FORKER = (
    "import os, time\n"
    "while True:\n"
    "    if os.fork() == 0:\n"
    "        time.sleep(60)\n"
    "    time.sleep(0.02)\n"
)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def wait_dead(pids: set[int], timeout: float = 5) -> set[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.02)
    return {p for p in pids if alive(p)}


class NoMounts(CgroupMapper):
    """A mapper that sees no cgroup file system, as in a mount namespace without one."""

    def mounts(self) -> list[CgroupMount]:
        return []


def test_every_process_of_the_container_and_no_other(containers: Containers) -> None:
    target, neighbour = containers.new(pod="a"), containers.new(pod="b")
    main = target.spawn([sys.executable, "-c", FORKER])
    nested = target.spawn(["sleep", "60"], sub="init.scope")  # a sub-cgroup it made itself
    other = neighbour.spawn(["sleep", "60"])
    wait_for(lambda: len(target.pids()) >= 4, "the forker forked a few", timeout=10)
    before = target.pids()
    held = {target.id, neighbour.id}
    mapper = CgroupMapper()
    report = Killer(mapper).kill(
        target.id,
        [main.pid],
        lambda pid: owner(mapper.ids(pid) or (), held) == target.id,
    )
    assert report.source == "cgroup"
    assert set(report.killed) >= before | {nested.pid}
    assert wait_dead(set(report.killed)) == set()
    assert target.pids() == set()  # no child escaped between the rounds
    assert other.poll() is None and alive(other.pid)  # the neighbour is untouched


def test_a_seed_outside_the_container_is_not_killed(containers: Containers) -> None:
    target = containers.new()
    victim = target.spawn(["sleep", "60"])
    bystander = containers.new().spawn(["sleep", "60"])
    mapper = CgroupMapper()
    held = {target.id}
    # The seed list names a pid of another container (a pid reused since it was listed):
    # the cgroup of the seed does not name the target, so it leads nowhere.
    report = Killer(mapper).kill(
        target.id,
        [bystander.pid, victim.pid],
        lambda pid: owner(mapper.ids(pid) or (), held) == target.id,
    )
    assert report.killed == (victim.pid,)
    assert alive(bystander.pid)


def test_without_cgroup_mounts_a_proc_scan_finds_them(containers: Containers) -> None:
    target = containers.new()
    first, second = target.spawn(["sleep", "60"]), target.spawn(["sleep", "60"], sub="x")
    bystander = containers.new().spawn(["sleep", "60"])
    mapper = NoMounts()
    held = {target.id}
    report = Killer(mapper).kill(
        target.id, [first.pid], lambda pid: owner(mapper.ids(pid) or (), held) == target.id
    )
    assert report.source == "proc"
    assert set(report.killed) == {first.pid, second.pid}
    assert wait_dead({first.pid, second.pid}) == set()
    assert alive(bystander.pid)


def test_zombies_are_not_killed_again(containers: Containers) -> None:
    target = containers.new()
    dead = target.spawn(["sleep", "60"])
    dead.kill()  # not reaped: a zombie, still in /proc with its cgroup path, not in cgroup.procs
    deadline = time.monotonic() + 5
    while alive(dead.pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    mapper = NoMounts()  # the /proc scan, which does see zombies
    held = {target.id}
    report = Killer(mapper).kill(
        target.id, [dead.pid], lambda pid: owner(mapper.ids(pid) or (), held) == target.id
    )
    assert report.killed == ()
    dead.wait()


def test_a_wrong_rule_from_the_caller_still_cannot_reach_outside(
    containers: Containers, tmp_path: Path
) -> None:
    inside, bystander = (
        containers.new().spawn(["sleep", "60"]),
        containers.new().spawn(["sleep", "60"]),
    )
    target, other = "a" * 64, "b" * 64
    # A /proc of our own that lists only these two processes (so that nothing else on this
    # machine can ever be a candidate), with cgroup paths naming two containers.
    for process, cid in ((inside, target), (bystander, other)):
        (tmp_path / str(process.pid)).mkdir()
        (tmp_path / str(process.pid) / "cgroup").write_text(f"0::/kubepods/pod1/{cid}\n")
        (tmp_path / str(process.pid) / "stat").write_text(f"{process.pid} (sleep) S 1\n")
    mapper = NoMounts(tmp_path)
    # A caller whose rule says yes to every process: the container's path still decides.
    report = Killer(mapper).kill(target, [inside.pid], lambda pid: True)
    assert report.source == "proc" and report.killed == (inside.pid,)
    assert wait_dead({inside.pid}) == set()
    assert alive(bystander.pid)
