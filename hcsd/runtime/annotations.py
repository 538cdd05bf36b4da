"""Local requests from annotations (`hcs.io/vram: 8Gi` …), for containers outside Kubernetes
scheduling. Each key is read from the container's annotations first, then the pod's."""

from __future__ import annotations

from collections.abc import Mapping

from hcsd.contract import names
from hcsd.model import PodRef, Request, TopologyPreference, Vendor
from hcsd.quantity import QuantityError, parse_bytes, parse_quantity

__all__ = ["KEYS", "RequestError", "local_request", "requested_keys"]

VRAM = names.ANNOTATION_VRAM
TFLOPS = names.ANNOTATION_TFLOPS
DEVICES = names.ANNOTATION_DEVICES
VENDORS = names.ANNOTATION_VENDORS
MODELS = names.ANNOTATION_MODELS
TOPOLOGY = names.ANNOTATION_TOPOLOGY
KEYS = (VRAM, TFLOPS, DEVICES, VENDORS, MODELS, TOPOLOGY)
REQUESTING = (VRAM, TFLOPS, DEVICES)  # the keys that make a request; the rest only narrow it


class RequestError(ValueError):
    """An annotation hcsd cannot act on; the message names the annotation."""


def _lookup(key: str, container: Mapping[str, str], pod: Mapping[str, str]) -> str | None:
    value = container.get(key, pod.get(key))
    return value.strip() if value is not None else None


def requested_keys(
    container_annotations: Mapping[str, str], pod_annotations: Mapping[str, str]
) -> list[str]:
    """The annotations that make a local request, on the container or its pod (empty: none)."""
    return [k for k in REQUESTING if k in container_annotations or k in pod_annotations]


def local_request(
    container_id: str,
    container_name: str,
    pod: PodRef,
    container_annotations: Mapping[str, str],
    pod_annotations: Mapping[str, str],
) -> Request | None:
    """The request the annotations make, or None when they ask for nothing."""
    values = {k: _lookup(k, container_annotations, pod_annotations) for k in KEYS}
    if values[VRAM] is None and values[TFLOPS] is None and values[DEVICES] is None:
        return None
    vram_text, tflops_text, devices_text = values[VRAM], values[TFLOPS], values[DEVICES]
    try:
        vram = parse_bytes(vram_text, what=VRAM) if vram_text else None
        tflops = float(parse_quantity(tflops_text)) if tflops_text else None
        devices = 1
        if devices_text:
            if not devices_text.isdigit():
                raise RequestError(f"{DEVICES}: expected a whole number, got {devices_text!r}")
            devices = int(devices_text)
        vendors = frozenset(
            Vendor.parse(v) for v in (values[VENDORS] or "").split(",") if v.strip()
        )
        models = names.model_names(values[MODELS] or "")
        topology = TopologyPreference(values[TOPOLOGY] or "")
        return Request(
            container_id=container_id,
            vram_bytes=vram,
            devices=devices,
            tflops_fp16=tflops,
            vendors=vendors,
            models=models,
            topology=topology,
            pod=pod,
            container_name=container_name,
            source="local",
        )
    except RequestError:
        raise
    except (QuantityError, ValueError) as e:
        raise RequestError(str(e)) from e
