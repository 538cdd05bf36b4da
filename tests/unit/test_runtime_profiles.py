"""RuntimeProfiles on the extender's side: the CRD and the code agree on the bounds, the shipped
examples are accepted by both, malformed profiles are refused with their reason, the entry
for a device is the first that matches, and a pod naming a profile that does not exist is
refused with its name. (tests/cluster/test_runtime_profiles.py: the same against a real API
server, through bind.)"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from hcsd.cluster.decisions import Decider
from hcsd.cluster.demand import DemandError
from hcsd.cluster.extender import Extender
from hcsd.cluster.extender_metrics import Metrics
from hcsd.cluster.kube import KubeError
from hcsd.cluster.rebinding import STRATEGIC_MERGE_PATCH
from hcsd.cluster.runtime_profiles import RuntimeProfile, cover_of, resolve, runtime_profile
from hcsd.contract import names, runtime_binding
from hcsd.contract.assignment import parse
from hcsd.model import Device, Grant, Vendor
from hcsd.profiles.database import ProfileDatabase
from tests.unit.test_bind_reservations import FakeApiServer, bind, cluster, pending, used, watch
from tests.unit.test_manifests import crd_schema, problems

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "packaging" / "runtime-profiles").glob("*.yaml"))
DB = ProfileDatabase.load(None)
GiB = 2**30


def profile(*runtimes: dict[str, Any], name: str = "p", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.RUNTIME_PROFILE_KIND,
        "metadata": {"name": name, "resourceVersion": "1"},
        "spec": {"runtimes": list(runtimes), **spec},
    }


def test_examples_exist() -> None:
    assert {p.name for p in EXAMPLES} >= {"pytorch-2.5.yaml", "llm-serving.yaml"}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_passes_the_schema_and_the_extender(path: Path) -> None:
    text = path.read_text()
    assert text.startswith("#"), "an example says what it is and that it is one"
    obj = yaml.safe_load(text)
    assert problems(obj, names.RUNTIME_PROFILES) == []
    found = runtime_profile(obj)
    assert found.name == obj["metadata"]["name"] and found.entries


def test_the_schema_holds_the_contracts_bounds() -> None:
    """The CRD refuses what the node would refuse: the same limits, in both places."""
    spec = crd_schema(names.RUNTIME_PROFILES)["properties"]["spec"]["properties"]
    entry = spec["runtimes"]["items"]
    fields = entry["properties"]
    assert fields["image"]["maxLength"] == runtime_binding.MAX_IMAGE
    assert fields["env"]["maxItems"] == runtime_binding.MAX_ENV
    assert fields["env"]["x-kubernetes-list-map-keys"] == ["name"]  # a name once
    assert fields["env"]["items"]["properties"]["value"]["maxLength"] == runtime_binding.MAX_TEXT
    for argv in ("command", "args"):
        assert fields[argv]["maxItems"] == runtime_binding.MAX_ARGV
        assert fields[argv]["items"]["maxLength"] == runtime_binding.MAX_TEXT
    assert spec["codeMount"]["maxLength"] == runtime_binding.MAX_PATH
    assert fields["vendor"]["enum"] == [v.value for v in Vendor]
    (rule,) = entry["x-kubernetes-validations"]
    assert rule["rule"] == "!has(self.args) || has(self.command)"


def reserved_rule() -> str:
    """The CEL rule on env items that refuses the contract's reserved variables."""
    listed = ", ".join(f"'{name}'" for name in sorted(runtime_binding.RESERVED_ENV))
    prefix = runtime_binding.RESERVED_ENV_PREFIX
    return f"!(self.name in [{listed}]) && !self.name.startsWith('{prefix}')"


@pytest.mark.parametrize(
    "name",
    ["ROCR_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "NVIDIA_MIG_MONITOR_DEVICES",
     "ASCEND_RUNTIME_OPTIONS"],
)  # fmt: skip
def test_the_selectors_vendor_runtimes_read_are_reserved(name: str) -> None:
    """A profile setting one would change the devices the container sees behind hcsd's back."""
    assert runtime_binding.reserved_env(name)


def test_driver_capabilities_are_left_to_profiles() -> None:
    """NVIDIA_DRIVER_CAPABILITIES picks driver libraries, not devices: a profile may set it."""
    assert not runtime_binding.reserved_env("NVIDIA_DRIVER_CAPABILITIES")


def test_the_crd_refuses_exactly_the_contracts_reserved_variables() -> None:
    """One home for the reserved set (hcsd.contract.runtime_binding): the CRD's rule is the
    one generated from it, and names the variable in its message."""
    env = crd_schema(names.RUNTIME_PROFILES)["properties"]["spec"]["properties"]["runtimes"]
    (rule,) = env["items"]["properties"]["env"]["items"]["x-kubernetes-validations"]
    assert rule["rule"] == reserved_rule(), f"write into the CRD: {reserved_rule()}"
    assert rule["messageExpression"].startswith("self.name + ")
    assert rule["fieldPath"] == ".name"


@pytest.mark.parametrize(
    "name", ["CUDA_VISIBLE_DEVICES", "LD_PRELOAD", "HCS_CODE_DIR", "ASCEND_RT_VISIBLE_DEVICES"]
)
def test_bind_refuses_a_stored_profile_setting_a_reserved_variable(name: str) -> None:
    """A profile stored before the CRD's rule: bind says which variable, and the pod keeps its
    image (no patch, no Binding, nothing held)."""
    e, server = rebinding(opted_in())
    env = [{"name": "NCCL_DEBUG", "value": "WARN"}, {"name": name, "value": "0"}]
    e.state.profiles.apply(
        "p", runtime_profile(profile({"vendor": "nvidia", "image": "cuda:1", "env": env}))
    )
    refused = bind(e, "q", "u1")
    assert f"runtime profile p sets {name}, which hcsd sets itself" in refused, refused
    assert server.patches == [] and server.bindings == [] and used(e) == [0, 0]
    assert (
        server.pods["q"]["spec"]["containers"][0]["image"]
        == opted_in()["spec"]["containers"][0]["image"]
    )


NVIDIA = {"vendor": "nvidia", "image": "cuda:1"}
BAD = {
    "args without command": (profile({**NVIDIA, "args": ["-x"]}), "args need a command"),
    "unknown vendor": (profile({**NVIDIA, "vendor": "intel"}), "unknown vendor 'intel'"),
    "no image": (profile({"vendor": "nvidia"}), "is not an image name"),
    "image with a space": (profile({**NVIDIA, "image": "a b"}), "is not an image name"),
    "env name": (profile({**NVIDIA, "env": [{"name": "A-B", "value": "1"}]}), "variable name"),
    "env twice": (
        profile({**NVIDIA, "env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}),
        "names a variable twice",
    ),
    "relative code mount": (profile(NVIDIA, codeMount="work"), "is not absolute"),
    "no runtimes": (profile(), "runtimes must list 1..32 entries"),
    "bad model": (profile({**NVIDIA, "models": ["A100\nx"]}), "is not a model name"),
}


@pytest.mark.parametrize("case", BAD)
def test_a_malformed_profile_is_refused_with_its_reason(case: str) -> None:
    obj, reason = BAD[case]
    with pytest.raises(ValueError, match=reason):
        runtime_profile(obj)


def device(uuid: str, vendor: Vendor, model: str) -> Device:
    return Device(uuid, vendor, model, 0, "0000:00:00.0", 80 * GiB)


A100 = device("gpu-a", Vendor.NVIDIA, "A100-SXM4-80GB")
H100 = device("gpu-h", Vendor.NVIDIA, "H100-SXM5-80GB")
NPU = device("npu-0", Vendor.ASCEND, "Ascend910B3")
MIXED = runtime_profile(
    profile(
        {"vendor": "nvidia", "models": ["A100"], "image": "cuda-a100:1", "command": ["a"]},
        {"vendor": "nvidia", "image": "cuda:1", "env": [{"name": "X", "value": "1"}]},
        {
            "vendor": "ascend",
            "models": ["910B"],
            "image": "cann:1",
            "args": ["b"],
            "command": ["serve"],
        },
        codeMount="/workspace",
    )
)


def held(*devices: Device) -> tuple[Grant, ...]:
    return tuple(Grant(d.uuid, GiB, 0) for d in devices)


@pytest.mark.parametrize(
    ("devices", "image"),
    [((A100,), "cuda-a100:1"), ((H100,), "cuda:1"), ((A100, H100), "cuda:1"), ((NPU,), "cann:1")],
    ids=["model-entry-first", "vendor-entry", "one-entry-for-all-its-devices", "alias-910B"],
)
def test_the_first_entry_admitting_the_containers_devices_wins(
    devices: tuple[Device, ...], image: str
) -> None:
    found = resolve(MIXED, cover_of(MIXED, DB), {"main": held(*devices)}, [A100, H100, NPU])
    assert isinstance(found, dict)
    assert found["main"].image == image
    assert found["main"].profile == "p" and found["main"].code_mount == "/workspace"


def test_the_resolved_runtime_carries_env_command_and_args() -> None:
    found = resolve(MIXED, cover_of(MIXED, DB), {"m": held(NPU), "n": held(H100)}, [H100, NPU])
    assert isinstance(found, dict)
    assert (found["m"].command, found["m"].args, found["m"].argv()) == (
        ("serve",), ("b",), ("serve", "b"),
    )  # fmt: skip
    assert (found["n"].env, found["n"].command) == ((("X", "1"),), None)


def test_a_device_no_entry_admits_is_named_in_the_refusal() -> None:
    only_a100 = runtime_profile(profile({**NVIDIA, "models": ["A100"]}, name="only-a100"))
    found = resolve(only_a100, cover_of(only_a100, DB), {"main": held(H100)}, [H100])
    assert found == (
        "container main: runtime profile only-a100 has no image for nvidia H100-SXM5-80GB "
        "(it has: nvidia (a100, a100-sxm4-80gb))"
    )


def decider(*profiles: RuntimeProfile, listed: bool = True) -> Decider:
    by_name = {p.name: p for p in profiles}
    return Decider(DB, Metrics(lambda: True), lambda a, b: None,
                   profiles=by_name.get, profiles_listed=lambda: listed)  # fmt: skip


def pod(annotations: dict[str, str]) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "name": "p", "annotations": annotations},
        "spec": {"containers": [{"name": "main", "image": "placeholder",
                                 "resources": {"limits": {names.RESOURCE_VRAM: "8Gi"}}}]},
    }  # fmt: skip


def test_profiles_off_refuse_a_pod_naming_one_saying_so_and_leave_others_alone() -> None:
    """--no-runtime-profiles (the chart's runtimeProfiles.enabled=false): no informer, and a
    pod naming a profile hears why rather than "not listed yet"."""
    d = Decider(DB, Metrics(lambda: True), lambda a, b: None,
                profiles={"p": MIXED}.get, profiles_on=False)  # fmt: skip
    with pytest.raises(DemandError, match="runtime profiles are off in this cluster"):
        d.demand(pod({names.ANNOTATION_RUNTIME_PROFILE: "p"}))
    plain = d.demand(pod({}))
    assert plain is not None and plain.cover is None


def test_a_pod_naming_a_profile_gets_its_cover_and_one_naming_none_gets_none() -> None:
    d = decider(MIXED)
    named = d.demand(pod({names.ANNOTATION_RUNTIME_PROFILE: "p"}))
    assert named is not None and named.cover == cover_of(MIXED, DB)
    plain = d.demand(pod({}))
    assert plain is not None and plain.cover is None


@pytest.mark.parametrize(
    ("value", "listed", "reason"),
    [
        ("missing", True, "RuntimeProfile 'missing' does not exist"),
        ("missing", False, "the RuntimeProfiles are not listed yet"),
        ("Not_A_Name", True, "'Not_A_Name' is not a RuntimeProfile name"),
    ],
    ids=["unknown", "not-listed", "not-a-name"],
)
def test_a_pod_naming_an_unusable_profile_is_refused_with_its_name(
    value: str, listed: bool, reason: str
) -> None:
    with pytest.raises(DemandError, match=reason):
        decider(MIXED, listed=listed).demand(pod({names.ANNOTATION_RUNTIME_PROFILE: value}))


def test_a_changed_profile_is_read_again() -> None:
    """The cover is remembered per resourceVersion: an edit of the profile is seen."""
    changed = profile({"vendor": "ascend", "image": "cann:2"}, name="p")
    changed["metadata"]["resourceVersion"] = "2"
    current = {"p": MIXED}
    d = Decider(DB, Metrics(lambda: True), lambda a, b: None, profiles=current.get)
    first = d.demand(pod({names.ANNOTATION_RUNTIME_PROFILE: "p"}))
    current["p"] = runtime_profile(copy.deepcopy(changed))
    second = d.demand(pod({names.ANNOTATION_RUNTIME_PROFILE: "p"}))
    assert first is not None and first.cover is not None
    assert second is not None and second.cover is not None
    assert [v for v, _ in first.cover.entries] == [Vendor.NVIDIA, Vendor.NVIDIA, Vendor.ASCEND]
    assert [v for v, _ in second.cover.entries] == [Vendor.ASCEND]


# --- bind: the image patch before the Binding ------------------------------------------------


class RebindingApiServer(FakeApiServer):
    """FakeApiServer with the pod's strategic-merge patch of container images: uid and
    resourceVersion in the patch are preconditions (409), `refuse` answers the next patch
    instead (the admission policy's 403), the write bumps the version."""

    def __init__(self, *pods: dict[str, Any]) -> None:
        super().__init__(*pods)
        self.patches: list[dict[str, Any]] = []
        self.refuse: KubeError | None = None

    def request(self, method: str, path: str, *, body: Any = None, **kw: Any) -> dict[str, Any]:
        assert (method, kw.get("content_type")) == ("PATCH", STRATEGIC_MERGE_PATCH)
        self.patches.append(body)
        if self.refuse is not None:
            failure, self.refuse = self.refuse, None
            raise failure
        pod = self.pods[path.rsplit("/", 1)[1]]
        for field in ("uid", "resourceVersion"):
            if body["metadata"][field] != pod["metadata"][field]:
                raise KubeError(409, "Conflict", f"Precondition failed: {field}")
        images = {c["name"]: c["image"] for c in body["spec"]["containers"]}
        for container in pod["spec"]["containers"]:
            container["image"] = images.get(container["name"], container["image"])
        return self.touch(pod["metadata"]["name"], {})


def rebinding(*pods: dict[str, Any]) -> tuple[Extender, RebindingApiServer]:
    e, _ = cluster()
    server = RebindingApiServer(*pods)
    e.binder.kube = server  # type: ignore[assignment]
    e.binder.rebinder.kube = server  # type: ignore[assignment]
    e.state.profiles.apply("p", MIXED)
    e.state.profiles.synced.set()
    for pod in pods:
        watch(e, pod)
    return e, server


def opted_in(name: str = "q", uid: str = "u1") -> dict[str, Any]:
    pod = pending(name, uid)
    pod["metadata"]["annotations"] = {names.ANNOTATION_RUNTIME_PROFILE: "p"}
    return pod


def test_bind_sets_the_image_then_binds_at_the_version_the_patch_made() -> None:
    e, server = rebinding(opted_in())
    assert bind(e, "q", "u1") == ""
    (patch,) = server.patches
    assert patch == {
        "metadata": {"uid": "u1", "resourceVersion": "7"},
        "spec": {"containers": [{"name": "main", "image": "cuda-a100:1"}]},
    }
    (binding,) = server.bindings
    assert binding["metadata"]["resourceVersion"] == "101"  # the patch's
    text = binding["metadata"]["annotations"][names.ANNOTATION_ASSIGNMENT]
    body = parse(text)
    assert (body.runtime["main"].image, body.runtime["main"].argv()) == ("cuda-a100:1", ("a",))
    assert used(e) == [60, 0]


def test_a_refused_image_patch_binds_nothing_and_holds_nothing() -> None:
    e, server = rebinding(opted_in())
    server.refuse = KubeError(403, "Forbidden", "denied by hcs-extender-requeue")
    refused = bind(e, "q", "u1")
    assert "403" in refused and "hcs-extender-requeue" in refused
    assert server.bindings == [] and used(e) == [0, 0]
    assert not server.pods["q"]["spec"].get("nodeName")


def test_a_pod_written_since_the_copy_is_patched_again_at_its_version() -> None:
    e, server = rebinding(opted_in())
    server.touch("q", {"hcs.io/capacity-freed": "2026-01-01T00:00:00.000Z"})
    assert bind(e, "q", "u1") == ""
    assert [p["metadata"]["resourceVersion"] for p in server.patches] == ["7", "101"]
    assert [b["metadata"]["resourceVersion"] for b in server.bindings] == ["102"]
    assert used(e) == [60, 0]


def test_an_image_already_right_is_not_patched() -> None:
    pod = opted_in()
    pod["spec"]["containers"][0]["image"] = "cuda-a100:1"
    e, server = rebinding(pod)
    assert bind(e, "q", "u1") == ""
    assert server.patches == [] and server.bindings[0]["metadata"]["resourceVersion"] == "7"


def test_a_profile_gone_before_bind_writes_nothing() -> None:
    e, server = rebinding(opted_in())
    e.state.profiles.apply("p", None)
    assert "RuntimeProfile 'p' does not exist" in bind(e, "q", "u1")
    assert server.patches == [] and server.bindings == [] and used(e) == [0, 0]


def test_a_pod_naming_no_profile_gets_no_patch_and_version_2() -> None:
    e, server = rebinding(pending("plain", "u2"))
    assert bind(e, "plain", "u2") == ""
    assert server.patches == []
    text = server.bindings[0]["metadata"]["annotations"][names.ANNOTATION_ASSIGNMENT]
    assert parse(text).runtime == {} and '"v":2' in text


def test_a_profile_too_big_for_the_assignment_is_refused_before_any_write() -> None:
    """64 variables of 4 KiB pass the CRD but make the annotation ~270 KiB, which hcsd
    refuses on every container create: bind says so and changes nothing."""
    e, server = rebinding(opted_in())
    env = [{"name": f"V{i}", "value": "x" * 4096} for i in range(64)]
    e.state.profiles.apply(
        "p", runtime_profile(profile({"vendor": "nvidia", "image": "cuda:1", "env": env}))
    )
    refused = bind(e, "q", "u1")
    assert "over the 65536 hcsd accepts" in refused, refused
    assert server.patches == [] and server.bindings == [] and used(e) == [0, 0]
