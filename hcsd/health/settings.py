"""`[health]`: which kernel event source to use, how a device's score falls and recovers, the
sub-health signals' hold time and thresholds, and the operator's extra kernel-line rules. The
watcher takes this section whole; the analyzer's and the sub-health tracker's settings are
derived from it here, in one place."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hcsd.contract import paths
from hcsd.health.analyzer import AnalyzerSettings
from hcsd.health.parsing import DEFAULT_RULES, LineRule, compile_rules
from hcsd.health.signals import KINDS
from hcsd.health.subhealth import SubHealthSettings
from hcsd.sections import Section, checks, setting

__all__ = ["RECOVERY_MARGIN", "HealthSection"]

#: A degraded device is healthy again only this many points above `degraded_below`, so a score
#: hovering at the threshold does not flap.
RECOVERY_MARGIN = 10.0

_RULE_KEYS = ("vendor", "code", "severity", "pattern")


def _rules(value: Any) -> tuple[Mapping[str, str], ...]:
    if not isinstance(value, list | tuple) or not all(isinstance(v, Mapping) for v in value):
        raise ValueError
    for position, entry in enumerate(value):
        unknown = sorted(set(entry) - set(_RULE_KEYS))
        if unknown:
            raise ValueError(f"health rule #{position}: unknown key(s) {', '.join(unknown)}")
        for key, text in entry.items():
            if not isinstance(text, str):
                raise ValueError(f"health rule #{position}: {key} must be a string")
    compile_rules(value)  # raises ValueError naming the rule and what is wrong with it
    return tuple(dict(entry) for entry in value)


rule_tables = checks.Check("a list of tables {vendor, code, severity, pattern}", _rules)


@dataclass(frozen=True, slots=True)
class HealthSection(Section):
    """Health watching: the source, the score thresholds, the polling intervals, the rules."""

    source: str = setting(
        "auto",
        "Kernel event source: auto (ebpf, then bcc, then kmsg polling), ebpf, bcc, kmsg or off "
        "(no kernel events; vendor counters and sub-health still run unless subhealth is off).",
        checks.choice("auto", "ebpf", "bcc", "kmsg", "off"),
    )
    bpf_dir: str = setting(paths.BPF_DIR, "Where the compiled eBPF objects are.", checks.path)
    quiet_period: float = setting(
        600.0,
        "Seconds without faults before a degraded or unhealthy device is healthy again.",
        checks.seconds,
    )
    tick_interval: float = setting(
        1.0,
        "Seconds between re-evaluations of device health (how soon recovery shows).",
        checks.seconds,
    )
    degraded_below: float = setting(
        80.0, "Health score under which a device is degraded.", checks.score
    )
    unhealthy_below: float = setting(
        30.0, "Health score under which a device is unhealthy.", checks.score
    )
    aer_poll_interval: float = setting(
        5.0,
        "Seconds between polls of PCIe AER counters in sysfs (when no AER tracepoint).",
        checks.seconds,
    )
    rules: tuple[Mapping[str, str], ...] = setting(
        (),
        "Extra kernel-line rules: [{vendor, code, severity, pattern}], pattern with (?P<bus>).",
        rule_tables,
    )

    subhealth: bool = setting(
        True,
        "Watch sub-health signals (clock slowdown, PCIe link down-trained, corrections rising, "
        "measured TFLOPS under the profile): a signal that holds makes the device degraded.",
        checks.boolean,
    )
    subhealth_hold: float = setting(
        300.0,
        "Seconds a sub-health signal must hold, seen on every poll, before the device is degraded.",
        checks.seconds,
    )
    subhealth_recovery: float = setting(
        300.0,
        "Seconds a sub-health signal must stay away before a device it degraded is healthy again.",
        checks.seconds,
    )
    subhealth_clock_percent: float = setting(
        60.0,
        "SM clock under this percent of its maximum while busy, with no reason given, is a signal.",
        checks.percent,
    )
    subhealth_tflops_percent: float = setting(
        50.0,
        "Measured FP16 TFLOPS under this percent of the profile's dense peak is a signal (a "
        "broken device: good ones reach 70-80% of the peak; a slow one is found by the "
        "cluster side against the fleet's median).",
        checks.percent,
    )
    subhealth_ecc_window: float = setting(
        60.0,
        "Correctable memory errors at most this many seconds apart count as rising.",
        checks.seconds,
    )
    subhealth_ignore: tuple[str, ...] = setting(
        (),
        "Sub-health reasons never tracked (a known, accepted condition such as hw-power-brake).",
        checks.names(*KINDS),
    )
    subhealth_score: float = setting(
        50.0,
        "Health score a device degraded by sub-health reports at most (the extender scores "
        "devices by it); at least unhealthy_below.",
        checks.score,
    )

    def __post_init__(self) -> None:
        Section.__post_init__(self)
        if self.subhealth_score < self.unhealthy_below:
            raise ValueError(
                f"subhealth_score: {self.subhealth_score:g} is under unhealthy_below "
                f"({self.unhealthy_below:g}): a device sub-health only degrades would score as "
                "an unhealthy one"
            )

    def analyzer_settings(self) -> AnalyzerSettings:
        """The score thresholds; recovery needs RECOVERY_MARGIN points above degraded."""
        return AnalyzerSettings(
            quiet_period=self.quiet_period,
            degraded_below=self.degraded_below,
            recovered_above=min(100.0, self.degraded_below + RECOVERY_MARGIN),
            unhealthy_below=self.unhealthy_below,
        )

    def subhealth_settings(self) -> SubHealthSettings:
        return SubHealthSettings(
            hold=self.subhealth_hold,
            recovery=self.subhealth_recovery,
            clock_ratio=self.subhealth_clock_percent / 100.0,
            tflops_ratio=self.subhealth_tflops_percent / 100.0,
            ecc_window=self.subhealth_ecc_window,
            ignore=frozenset(self.subhealth_ignore),
        )

    def line_rules(self) -> tuple[LineRule, ...]:
        """The built-in kernel-line rules, then the operator's."""
        return (*DEFAULT_RULES, *compile_rules(self.rules))
