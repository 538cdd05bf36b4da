"""PyTorch through cudart under libhcs with HCS_VRAM_QUOTA=1Gi: it sees the quota as the total
and gets its out-of-memory error past it (caching allocator, or expandable segments on VMM)."""

import torch

checks = []


def check(ok: bool, what: str) -> None:
    checks.append(ok)
    if not ok:
        print(f"not ok {what}")


free, total = torch.cuda.mem_get_info()
check(total == 1 << 30, f"torch sees the quota as the total: {total}")
first = torch.empty(600 << 20, dtype=torch.uint8, device="cuda")
try:
    second = torch.empty(600 << 20, dtype=torch.uint8, device="cuda")
    check(False, "600Mi more should not fit")
except torch.OutOfMemoryError:
    check(True, "out of memory past the quota")
del first
torch.cuda.empty_cache()
third = torch.empty(900 << 20, dtype=torch.uint8, device="cuda")
check(third.numel() == 900 << 20, "the memory came back")
print(f"RESULT torch {sum(checks)} {len(checks) - sum(checks)}")
