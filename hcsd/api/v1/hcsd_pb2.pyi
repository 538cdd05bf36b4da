from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class HealthState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    HEALTH_STATE_UNSPECIFIED: _ClassVar[HealthState]
    HEALTH_STATE_HEALTHY: _ClassVar[HealthState]
    HEALTH_STATE_DEGRADED: _ClassVar[HealthState]
    HEALTH_STATE_UNHEALTHY: _ClassVar[HealthState]
    HEALTH_STATE_LOST: _ClassVar[HealthState]
HEALTH_STATE_UNSPECIFIED: HealthState
HEALTH_STATE_HEALTHY: HealthState
HEALTH_STATE_DEGRADED: HealthState
HEALTH_STATE_UNHEALTHY: HealthState
HEALTH_STATE_LOST: HealthState

class ClaimDevice(_message.Message):
    __slots__ = ("request", "device", "pool", "share_id", "memory", "compute")
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    SHARE_ID_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_FIELD_NUMBER: _ClassVar[int]
    request: str
    device: str
    pool: str
    share_id: str
    memory: str
    compute: str
    def __init__(self, request: _Optional[str] = ..., device: _Optional[str] = ..., pool: _Optional[str] = ..., share_id: _Optional[str] = ..., memory: _Optional[str] = ..., compute: _Optional[str] = ...) -> None: ...

class PrepareClaimRequest(_message.Message):
    __slots__ = ("claim", "devices", "runtime", "pod_uid")
    CLAIM_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_FIELD_NUMBER: _ClassVar[int]
    POD_UID_FIELD_NUMBER: _ClassVar[int]
    claim: PodRef
    devices: _containers.RepeatedCompositeFieldContainer[ClaimDevice]
    runtime: str
    pod_uid: str
    def __init__(self, claim: _Optional[_Union[PodRef, _Mapping]] = ..., devices: _Optional[_Iterable[_Union[ClaimDevice, _Mapping]]] = ..., runtime: _Optional[str] = ..., pod_uid: _Optional[str] = ...) -> None: ...

class PreparedDevice(_message.Message):
    __slots__ = ("request", "device", "pool", "share_id", "cdi_device_ids")
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    SHARE_ID_FIELD_NUMBER: _ClassVar[int]
    CDI_DEVICE_IDS_FIELD_NUMBER: _ClassVar[int]
    request: str
    device: str
    pool: str
    share_id: str
    cdi_device_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, request: _Optional[str] = ..., device: _Optional[str] = ..., pool: _Optional[str] = ..., share_id: _Optional[str] = ..., cdi_device_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class PrepareClaimResponse(_message.Message):
    __slots__ = ("devices", "created", "allocation")
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    ALLOCATION_FIELD_NUMBER: _ClassVar[int]
    devices: _containers.RepeatedCompositeFieldContainer[PreparedDevice]
    created: bool
    allocation: Allocation
    def __init__(self, devices: _Optional[_Iterable[_Union[PreparedDevice, _Mapping]]] = ..., created: _Optional[bool] = ..., allocation: _Optional[_Union[Allocation, _Mapping]] = ...) -> None: ...

class UnprepareClaimRequest(_message.Message):
    __slots__ = ("claim_uid",)
    CLAIM_UID_FIELD_NUMBER: _ClassVar[int]
    claim_uid: str
    def __init__(self, claim_uid: _Optional[str] = ...) -> None: ...

class UnprepareClaimResponse(_message.Message):
    __slots__ = ("released",)
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    released: bool
    def __init__(self, released: _Optional[bool] = ...) -> None: ...

class MeasureRequest(_message.Message):
    __slots__ = ("device_uuids",)
    DEVICE_UUIDS_FIELD_NUMBER: _ClassVar[int]
    device_uuids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, device_uuids: _Optional[_Iterable[str]] = ...) -> None: ...

class MeasureResult(_message.Message):
    __slots__ = ("uuid", "outcome", "message", "tflops_fp16", "ratio", "memory_bandwidth_gbps", "seconds")
    UUID_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TFLOPS_FP16_FIELD_NUMBER: _ClassVar[int]
    RATIO_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BANDWIDTH_GBPS_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    uuid: str
    outcome: str
    message: str
    tflops_fp16: float
    ratio: float
    memory_bandwidth_gbps: float
    seconds: float
    def __init__(self, uuid: _Optional[str] = ..., outcome: _Optional[str] = ..., message: _Optional[str] = ..., tflops_fp16: _Optional[float] = ..., ratio: _Optional[float] = ..., memory_bandwidth_gbps: _Optional[float] = ..., seconds: _Optional[float] = ...) -> None: ...

class MeasureResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[MeasureResult]
    def __init__(self, results: _Optional[_Iterable[_Union[MeasureResult, _Mapping]]] = ...) -> None: ...

class InstallKeysRequest(_message.Message):
    __slots__ = ("keyring",)
    KEYRING_FIELD_NUMBER: _ClassVar[int]
    keyring: str
    def __init__(self, keyring: _Optional[str] = ...) -> None: ...

class InstallKeysResponse(_message.Message):
    __slots__ = ("changed", "key_ids", "signing")
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    KEY_IDS_FIELD_NUMBER: _ClassVar[int]
    SIGNING_FIELD_NUMBER: _ClassVar[int]
    changed: bool
    key_ids: _containers.RepeatedScalarFieldContainer[str]
    signing: str
    def __init__(self, changed: _Optional[bool] = ..., key_ids: _Optional[_Iterable[str]] = ..., signing: _Optional[str] = ...) -> None: ...

class PrepareContainerRequest(_message.Message):
    __slots__ = ("container_id", "container_name", "pod", "container_annotations", "pod_annotations", "front_end", "spec", "user")
    class ContainerAnnotationsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class PodAnnotationsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_NAME_FIELD_NUMBER: _ClassVar[int]
    POD_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    POD_ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    FRONT_END_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    container_id: str
    container_name: str
    pod: PodRef
    container_annotations: _containers.ScalarMap[str, str]
    pod_annotations: _containers.ScalarMap[str, str]
    front_end: str
    spec: ContainerSpec
    user: ContainerUser
    def __init__(self, container_id: _Optional[str] = ..., container_name: _Optional[str] = ..., pod: _Optional[_Union[PodRef, _Mapping]] = ..., container_annotations: _Optional[_Mapping[str, str]] = ..., pod_annotations: _Optional[_Mapping[str, str]] = ..., front_end: _Optional[str] = ..., spec: _Optional[_Union[ContainerSpec, _Mapping]] = ..., user: _Optional[_Union[ContainerUser, _Mapping]] = ...) -> None: ...

class ContainerUser(_message.Message):
    __slots__ = ("uid", "gid")
    UID_FIELD_NUMBER: _ClassVar[int]
    GID_FIELD_NUMBER: _ClassVar[int]
    uid: int
    gid: int
    def __init__(self, uid: _Optional[int] = ..., gid: _Optional[int] = ...) -> None: ...

class ContainerSpec(_message.Message):
    __slots__ = ("device_paths", "mounts", "env")
    DEVICE_PATHS_FIELD_NUMBER: _ClassVar[int]
    MOUNTS_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    device_paths: _containers.RepeatedScalarFieldContainer[str]
    mounts: _containers.RepeatedCompositeFieldContainer[Mount]
    env: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, device_paths: _Optional[_Iterable[str]] = ..., mounts: _Optional[_Iterable[_Union[Mount, _Mapping]]] = ..., env: _Optional[_Iterable[str]] = ...) -> None: ...

class Mount(_message.Message):
    __slots__ = ("host_path", "container_path", "options")
    HOST_PATH_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_PATH_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    host_path: str
    container_path: str
    options: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, host_path: _Optional[str] = ..., container_path: _Optional[str] = ..., options: _Optional[_Iterable[str]] = ...) -> None: ...

class PrepareContainerResponse(_message.Message):
    __slots__ = ("managed", "devices", "env", "mounts", "allocation")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    MANAGED_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    MOUNTS_FIELD_NUMBER: _ClassVar[int]
    ALLOCATION_FIELD_NUMBER: _ClassVar[int]
    managed: bool
    devices: _containers.RepeatedCompositeFieldContainer[DeviceNode]
    env: _containers.ScalarMap[str, str]
    mounts: _containers.RepeatedCompositeFieldContainer[Mount]
    allocation: Allocation
    def __init__(self, managed: _Optional[bool] = ..., devices: _Optional[_Iterable[_Union[DeviceNode, _Mapping]]] = ..., env: _Optional[_Mapping[str, str]] = ..., mounts: _Optional[_Iterable[_Union[Mount, _Mapping]]] = ..., allocation: _Optional[_Union[Allocation, _Mapping]] = ...) -> None: ...

class ContainerGoneRequest(_message.Message):
    __slots__ = ("container_id", "deleted")
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    DELETED_FIELD_NUMBER: _ClassVar[int]
    container_id: str
    deleted: bool
    def __init__(self, container_id: _Optional[str] = ..., deleted: _Optional[bool] = ...) -> None: ...

class GetNodeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Node(_message.Message):
    __slots__ = ("name", "version", "backends", "ledger_seq", "device_count", "allocation_count", "started_at", "orphaned_containers", "health_source", "mode", "discovery_notes", "assignment_key_ids", "fabric_domain", "fabric_source", "fabric_ports", "fabric_notes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    BACKENDS_FIELD_NUMBER: _ClassVar[int]
    LEDGER_SEQ_FIELD_NUMBER: _ClassVar[int]
    DEVICE_COUNT_FIELD_NUMBER: _ClassVar[int]
    ALLOCATION_COUNT_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    ORPHANED_CONTAINERS_FIELD_NUMBER: _ClassVar[int]
    HEALTH_SOURCE_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    DISCOVERY_NOTES_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENT_KEY_IDS_FIELD_NUMBER: _ClassVar[int]
    FABRIC_DOMAIN_FIELD_NUMBER: _ClassVar[int]
    FABRIC_SOURCE_FIELD_NUMBER: _ClassVar[int]
    FABRIC_PORTS_FIELD_NUMBER: _ClassVar[int]
    FABRIC_NOTES_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    backends: _containers.RepeatedScalarFieldContainer[str]
    ledger_seq: int
    device_count: int
    allocation_count: int
    started_at: float
    orphaned_containers: _containers.RepeatedScalarFieldContainer[str]
    health_source: str
    mode: str
    discovery_notes: _containers.RepeatedScalarFieldContainer[str]
    assignment_key_ids: _containers.RepeatedScalarFieldContainer[str]
    fabric_domain: str
    fabric_source: str
    fabric_ports: _containers.RepeatedScalarFieldContainer[str]
    fabric_notes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ..., backends: _Optional[_Iterable[str]] = ..., ledger_seq: _Optional[int] = ..., device_count: _Optional[int] = ..., allocation_count: _Optional[int] = ..., started_at: _Optional[float] = ..., orphaned_containers: _Optional[_Iterable[str]] = ..., health_source: _Optional[str] = ..., mode: _Optional[str] = ..., discovery_notes: _Optional[_Iterable[str]] = ..., assignment_key_ids: _Optional[_Iterable[str]] = ..., fabric_domain: _Optional[str] = ..., fabric_source: _Optional[str] = ..., fabric_ports: _Optional[_Iterable[str]] = ..., fabric_notes: _Optional[_Iterable[str]] = ...) -> None: ...

class Link(_message.Message):
    __slots__ = ("peer_uuid", "kind", "gbps")
    PEER_UUID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    GBPS_FIELD_NUMBER: _ClassVar[int]
    peer_uuid: str
    kind: str
    gbps: float
    def __init__(self, peer_uuid: _Optional[str] = ..., kind: _Optional[str] = ..., gbps: _Optional[float] = ...) -> None: ...

class DeviceNode(_message.Message):
    __slots__ = ("path", "major", "minor", "type", "permissions")
    PATH_FIELD_NUMBER: _ClassVar[int]
    MAJOR_FIELD_NUMBER: _ClassVar[int]
    MINOR_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    PERMISSIONS_FIELD_NUMBER: _ClassVar[int]
    path: str
    major: int
    minor: int
    type: str
    permissions: str
    def __init__(self, path: _Optional[str] = ..., major: _Optional[int] = ..., minor: _Optional[int] = ..., type: _Optional[str] = ..., permissions: _Optional[str] = ...) -> None: ...

class Device(_message.Message):
    __slots__ = ("uuid", "vendor", "model", "index", "pci_bus_id", "numa_node", "vram_bytes", "tflops_fp16", "tflops_bf16", "tflops_fp32", "tops_int8", "links", "device_nodes", "shared_nodes", "health_score", "health_state", "attributes", "vram_allocated_bytes", "compute_allocated_percent", "allocation_count")
    class AttributesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    UUID_FIELD_NUMBER: _ClassVar[int]
    VENDOR_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    PCI_BUS_ID_FIELD_NUMBER: _ClassVar[int]
    NUMA_NODE_FIELD_NUMBER: _ClassVar[int]
    VRAM_BYTES_FIELD_NUMBER: _ClassVar[int]
    TFLOPS_FP16_FIELD_NUMBER: _ClassVar[int]
    TFLOPS_BF16_FIELD_NUMBER: _ClassVar[int]
    TFLOPS_FP32_FIELD_NUMBER: _ClassVar[int]
    TOPS_INT8_FIELD_NUMBER: _ClassVar[int]
    LINKS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_NODES_FIELD_NUMBER: _ClassVar[int]
    SHARED_NODES_FIELD_NUMBER: _ClassVar[int]
    HEALTH_SCORE_FIELD_NUMBER: _ClassVar[int]
    HEALTH_STATE_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    VRAM_ALLOCATED_BYTES_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_ALLOCATED_PERCENT_FIELD_NUMBER: _ClassVar[int]
    ALLOCATION_COUNT_FIELD_NUMBER: _ClassVar[int]
    uuid: str
    vendor: str
    model: str
    index: int
    pci_bus_id: str
    numa_node: int
    vram_bytes: int
    tflops_fp16: float
    tflops_bf16: float
    tflops_fp32: float
    tops_int8: float
    links: _containers.RepeatedCompositeFieldContainer[Link]
    device_nodes: _containers.RepeatedCompositeFieldContainer[DeviceNode]
    shared_nodes: _containers.RepeatedCompositeFieldContainer[DeviceNode]
    health_score: int
    health_state: HealthState
    attributes: _containers.ScalarMap[str, str]
    vram_allocated_bytes: int
    compute_allocated_percent: int
    allocation_count: int
    def __init__(self, uuid: _Optional[str] = ..., vendor: _Optional[str] = ..., model: _Optional[str] = ..., index: _Optional[int] = ..., pci_bus_id: _Optional[str] = ..., numa_node: _Optional[int] = ..., vram_bytes: _Optional[int] = ..., tflops_fp16: _Optional[float] = ..., tflops_bf16: _Optional[float] = ..., tflops_fp32: _Optional[float] = ..., tops_int8: _Optional[float] = ..., links: _Optional[_Iterable[_Union[Link, _Mapping]]] = ..., device_nodes: _Optional[_Iterable[_Union[DeviceNode, _Mapping]]] = ..., shared_nodes: _Optional[_Iterable[_Union[DeviceNode, _Mapping]]] = ..., health_score: _Optional[int] = ..., health_state: _Optional[_Union[HealthState, str]] = ..., attributes: _Optional[_Mapping[str, str]] = ..., vram_allocated_bytes: _Optional[int] = ..., compute_allocated_percent: _Optional[int] = ..., allocation_count: _Optional[int] = ...) -> None: ...

class ListDevicesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListDevicesResponse(_message.Message):
    __slots__ = ("devices",)
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    devices: _containers.RepeatedCompositeFieldContainer[Device]
    def __init__(self, devices: _Optional[_Iterable[_Union[Device, _Mapping]]] = ...) -> None: ...

class PodRef(_message.Message):
    __slots__ = ("namespace", "name", "uid")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    name: str
    uid: str
    def __init__(self, namespace: _Optional[str] = ..., name: _Optional[str] = ..., uid: _Optional[str] = ...) -> None: ...

class Grant(_message.Message):
    __slots__ = ("device_uuid", "vram_bytes", "compute_percent")
    DEVICE_UUID_FIELD_NUMBER: _ClassVar[int]
    VRAM_BYTES_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_PERCENT_FIELD_NUMBER: _ClassVar[int]
    device_uuid: str
    vram_bytes: int
    compute_percent: int
    def __init__(self, device_uuid: _Optional[str] = ..., vram_bytes: _Optional[int] = ..., compute_percent: _Optional[int] = ...) -> None: ...

class Allocation(_message.Message):
    __slots__ = ("container_id", "pod", "container_name", "grants", "created", "source", "front_end")
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    POD_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_NAME_FIELD_NUMBER: _ClassVar[int]
    GRANTS_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    FRONT_END_FIELD_NUMBER: _ClassVar[int]
    container_id: str
    pod: PodRef
    container_name: str
    grants: _containers.RepeatedCompositeFieldContainer[Grant]
    created: float
    source: str
    front_end: str
    def __init__(self, container_id: _Optional[str] = ..., pod: _Optional[_Union[PodRef, _Mapping]] = ..., container_name: _Optional[str] = ..., grants: _Optional[_Iterable[_Union[Grant, _Mapping]]] = ..., created: _Optional[float] = ..., source: _Optional[str] = ..., front_end: _Optional[str] = ...) -> None: ...

class ListAllocationsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListAllocationsResponse(_message.Message):
    __slots__ = ("allocations",)
    ALLOCATIONS_FIELD_NUMBER: _ClassVar[int]
    allocations: _containers.RepeatedCompositeFieldContainer[Allocation]
    def __init__(self, allocations: _Optional[_Iterable[_Union[Allocation, _Mapping]]] = ...) -> None: ...

class AllocateRequest(_message.Message):
    __slots__ = ("container_id", "pod", "container_name", "vram", "tflops_fp16", "devices", "compute_percent", "vendors", "models", "policy", "topology", "source")
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    POD_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_NAME_FIELD_NUMBER: _ClassVar[int]
    VRAM_FIELD_NUMBER: _ClassVar[int]
    TFLOPS_FP16_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_PERCENT_FIELD_NUMBER: _ClassVar[int]
    VENDORS_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    TOPOLOGY_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    container_id: str
    pod: PodRef
    container_name: str
    vram: str
    tflops_fp16: str
    devices: int
    compute_percent: int
    vendors: _containers.RepeatedScalarFieldContainer[str]
    models: _containers.RepeatedScalarFieldContainer[str]
    policy: str
    topology: str
    source: str
    def __init__(self, container_id: _Optional[str] = ..., pod: _Optional[_Union[PodRef, _Mapping]] = ..., container_name: _Optional[str] = ..., vram: _Optional[str] = ..., tflops_fp16: _Optional[str] = ..., devices: _Optional[int] = ..., compute_percent: _Optional[int] = ..., vendors: _Optional[_Iterable[str]] = ..., models: _Optional[_Iterable[str]] = ..., policy: _Optional[str] = ..., topology: _Optional[str] = ..., source: _Optional[str] = ...) -> None: ...

class AllocateResponse(_message.Message):
    __slots__ = ("allocation", "created", "model")
    ALLOCATION_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    allocation: Allocation
    created: bool
    model: str
    def __init__(self, allocation: _Optional[_Union[Allocation, _Mapping]] = ..., created: _Optional[bool] = ..., model: _Optional[str] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("container_id",)
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    container_id: str
    def __init__(self, container_id: _Optional[str] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ("released", "allocation")
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    ALLOCATION_FIELD_NUMBER: _ClassVar[int]
    released: bool
    allocation: Allocation
    def __init__(self, released: _Optional[bool] = ..., allocation: _Optional[_Union[Allocation, _Mapping]] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("send_initial",)
    SEND_INITIAL_FIELD_NUMBER: _ClassVar[int]
    send_initial: bool
    def __init__(self, send_initial: _Optional[bool] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("kind", "seq", "allocation", "device", "violation", "time")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        KIND_UNSPECIFIED: _ClassVar[Event.Kind]
        KIND_INITIAL: _ClassVar[Event.Kind]
        KIND_SYNCED: _ClassVar[Event.Kind]
        KIND_ALLOCATED: _ClassVar[Event.Kind]
        KIND_RELEASED: _ClassVar[Event.Kind]
        KIND_DEVICE_CHANGED: _ClassVar[Event.Kind]
        KIND_DEVICE_REMOVED: _ClassVar[Event.Kind]
        KIND_VRAM_OVER_QUOTA: _ClassVar[Event.Kind]
    KIND_UNSPECIFIED: Event.Kind
    KIND_INITIAL: Event.Kind
    KIND_SYNCED: Event.Kind
    KIND_ALLOCATED: Event.Kind
    KIND_RELEASED: Event.Kind
    KIND_DEVICE_CHANGED: Event.Kind
    KIND_DEVICE_REMOVED: Event.Kind
    KIND_VRAM_OVER_QUOTA: Event.Kind
    KIND_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    ALLOCATION_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    VIOLATION_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    kind: Event.Kind
    seq: int
    allocation: Allocation
    device: Device
    violation: VramViolation
    time: float
    def __init__(self, kind: _Optional[_Union[Event.Kind, str]] = ..., seq: _Optional[int] = ..., allocation: _Optional[_Union[Allocation, _Mapping]] = ..., device: _Optional[_Union[Device, _Mapping]] = ..., violation: _Optional[_Union[VramViolation, _Mapping]] = ..., time: _Optional[float] = ...) -> None: ...

class VramViolation(_message.Message):
    __slots__ = ("container_id", "pod", "container_name", "device_uuid", "used_bytes", "granted_bytes", "allowed_bytes", "accounted_bytes", "pids", "action")
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    POD_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_NAME_FIELD_NUMBER: _ClassVar[int]
    DEVICE_UUID_FIELD_NUMBER: _ClassVar[int]
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    GRANTED_BYTES_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_BYTES_FIELD_NUMBER: _ClassVar[int]
    ACCOUNTED_BYTES_FIELD_NUMBER: _ClassVar[int]
    PIDS_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    container_id: str
    pod: PodRef
    container_name: str
    device_uuid: str
    used_bytes: int
    granted_bytes: int
    allowed_bytes: int
    accounted_bytes: int
    pids: _containers.RepeatedScalarFieldContainer[int]
    action: str
    def __init__(self, container_id: _Optional[str] = ..., pod: _Optional[_Union[PodRef, _Mapping]] = ..., container_name: _Optional[str] = ..., device_uuid: _Optional[str] = ..., used_bytes: _Optional[int] = ..., granted_bytes: _Optional[int] = ..., allowed_bytes: _Optional[int] = ..., accounted_bytes: _Optional[int] = ..., pids: _Optional[_Iterable[int]] = ..., action: _Optional[str] = ...) -> None: ...
