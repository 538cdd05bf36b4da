"""The refusal table: one row per reason, codes that mean the same on gRPC and ttrpc."""

from __future__ import annotations

import grpc
import pytest

from hcsd.api.server import grpc_code
from hcsd.daemon.metrics import render_metrics
from hcsd.discovery import Inventory
from hcsd.ledger import Ledger, LedgerConflict, LedgerWriteError, OverCapacity
from hcsd.refusals import RULES, Code, Reason, Refusal
from hcsd.runtime.nri.ttrpc import Code as TtrpcCode
from hcsd.service import NodeService


def test_every_reason_has_one_rule() -> None:
    assert set(RULES) == set(Reason)


@pytest.mark.parametrize("code", list(Code), ids=lambda c: c.name)
def test_codes_are_the_same_number_on_grpc_and_ttrpc(code: Code) -> None:
    assert grpc.StatusCode[code.name].value[0] == code.value
    assert TtrpcCode[code.name] == code.value
    assert grpc_code(Refusal(next(r for r in Reason if RULES[r].code is code), "x")).name == (
        code.name
    )


def test_only_unavailable_is_temporary() -> None:
    """UNAVAILABLE tells clients to retry; nothing permanent may use it, nothing else may be
    temporary (a client deciding by the code alone must decide right)."""
    for reason, rule in RULES.items():
        assert rule.temporary == (rule.code is Code.UNAVAILABLE), reason


@pytest.mark.parametrize(
    ("error", "reason", "code", "temporary"),
    [
        pytest.param(
            LedgerWriteError("disk full"), "write_failed", Code.UNAVAILABLE, True, id="write"
        ),
        pytest.param(
            OverCapacity("no room"), "over_capacity", Code.RESOURCE_EXHAUSTED, False, id="over"
        ),
        pytest.param(
            LedgerConflict("holds more"), "conflict", Code.ALREADY_EXISTS, False, id="conflict"
        ),
    ],
)
def test_ledger_refusals_are_refusals(
    error: Refusal, reason: str, code: Code, temporary: bool
) -> None:
    assert isinstance(error, Refusal)
    assert (error.reason, error.code, error.temporary) == (reason, code, temporary)


def test_text_names_the_reason_and_says_when_to_retry() -> None:
    permanent = Refusal(Reason.INSUFFICIENT_VRAM, "A100: 1Ti wanted, most free is 80Gi")
    assert permanent.about("ns/pod/main").describe() == (
        "ns/pod/main: A100: 1Ti wanted, most free is 80Gi (refused: insufficient_vram)"
    )
    temporary = Refusal(Reason.WRITE_FAILED, "c1: No space left on device")
    assert temporary.describe() == (
        "c1: No space left on device (refused: write_failed; temporary, retry)"
    )
    assert str(temporary) == "c1: No space left on device"


def test_a_reason_from_a_newer_daemon_is_not_guessed() -> None:
    assert Refusal.parse("no_such_reason", "text") is None
    parsed = Refusal.parse("write_failed", "text")
    assert parsed is not None and parsed.temporary


def test_metrics_list_every_reason(mixed_inventory: Inventory, ledger: Ledger) -> None:
    text = render_metrics(NodeService(mixed_inventory, ledger))
    for reason in Reason:
        assert f'hcs_refusals_total{{reason="{reason.value}"}} 0.0' in text
