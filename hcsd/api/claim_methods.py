"""PrepareClaim and UnprepareClaim: the DRA kubelet plugin's calls (hcsd/runtime/claims.py).

The plugin (in hcs-syncer) has read the ResourceClaim from the API server; hcsd never talks
to Kubernetes and takes the devices and consumed capacities as sent, checking them against
its own devices and ledger like any other request. With a pod naming a RuntimeProfile the
plugin also sends the profile it resolved for the allocated devices (claim_runtime.py).
"""

from __future__ import annotations

import json

import grpc

from hcsd.api.messages import InvalidRequest, allocation_to_pb, claim_devices_from_pb
from hcsd.api.v1 import hcsd_pb2 as pb
from hcsd.contract.runtime_binding import RuntimeBindingError, load
from hcsd.model import PodRef
from hcsd.refusals import Reason, Refusal
from hcsd.runtime.claim_runtime import ClaimRuntime
from hcsd.runtime.claims import Claims
from hcsd.runtime.injector import Injector
from hcsd.service import NodeService

__all__ = ["ClaimMethods"]


def _runtime(request: pb.PrepareClaimRequest) -> ClaimRuntime | None:
    """The RuntimeProfile entry the plugin resolved for the claim (runtime_binding's JSON)."""
    if not request.runtime:
        return None
    if not request.pod_uid or len(request.pod_uid) > 63:
        raise InvalidRequest("a runtime needs the reserving pod's uid")
    if len(request.runtime) > 64 * 1024:
        raise InvalidRequest("runtime: larger than 64 KiB")
    try:
        return ClaimRuntime(request.pod_uid, load(json.loads(request.runtime)))
    except (ValueError, RuntimeBindingError) as e:
        raise InvalidRequest(f"runtime: {e}") from e


class ClaimMethods:
    """Mixed into the servicer: the claim calls need the injector's settings (libhcs, the
    driver paths, the CDI directory), so a server built without one answers UNAVAILABLE."""

    def __init__(self, service: NodeService, injector: Injector | None) -> None:
        self.claims = (
            Claims(
                service,
                injector.settings.run_dir,
                injector.settings.runtime.libhcs_path,
                injector.settings.runtime.driver_paths,
                injector.settings.runtime.cdi_dir,
            )
            if injector is not None
            else None
        )

    async def PrepareClaim(
        self, request: pb.PrepareClaimRequest, context: grpc.aio.ServicerContext
    ) -> pb.PrepareClaimResponse:
        claims = await self._claims(context)
        ref = PodRef(request.claim.namespace, request.claim.name, request.claim.uid)
        try:
            results = claim_devices_from_pb(request.devices)
            runtime = _runtime(request)
        except InvalidRequest as e:
            refusal = Refusal(Reason.INVALID_REQUEST, f"claim {ref}: invalid request: {e}")
            raise claims.service.refuse(refusal) from e
        prepared, created = claims.prepare(ref, results, runtime)
        return pb.PrepareClaimResponse(
            devices=[
                pb.PreparedDevice(
                    request=r.request,
                    device=r.device,
                    pool=r.pool,
                    share_id=r.share_id,
                    cdi_device_ids=list(ids),
                )
                for r, ids in zip(results, prepared.cdi_ids, strict=True)
            ],
            created=created,
            allocation=allocation_to_pb(prepared.allocation),
        )

    async def UnprepareClaim(
        self, request: pb.UnprepareClaimRequest, context: grpc.aio.ServicerContext
    ) -> pb.UnprepareClaimResponse:
        claims = await self._claims(context)
        return pb.UnprepareClaimResponse(released=claims.unprepare(request.claim_uid))

    async def _claims(self, context: grpc.aio.ServicerContext) -> Claims:
        if self.claims is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "runtime integration is disabled")
            raise AssertionError  # unreachable: abort raises
        return self.claims
