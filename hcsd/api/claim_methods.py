"""PrepareClaim and UnprepareClaim: the DRA kubelet plugin's calls (hcsd/runtime/claims.py).

The plugin (in hcs-syncer) has read the ResourceClaim from the API server; hcsd never talks
to Kubernetes and takes the devices and consumed capacities as sent, checking them against
its own devices and ledger like any other request.
"""

from __future__ import annotations

import grpc

from hcsd.api.messages import InvalidRequest, allocation_to_pb, claim_devices_from_pb
from hcsd.api.v1 import hcsd_pb2 as pb
from hcsd.model import PodRef
from hcsd.refusals import Reason, Refusal
from hcsd.runtime.claims import Claims
from hcsd.runtime.injector import Injector
from hcsd.service import NodeService

__all__ = ["ClaimMethods"]


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
        except InvalidRequest as e:
            refusal = Refusal(Reason.INVALID_REQUEST, f"claim {ref}: invalid request: {e}")
            raise claims.service.refuse(refusal) from e
        prepared, created = claims.prepare(ref, results)
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
