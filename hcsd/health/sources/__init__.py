"""Where health events come from: eBPF through libbpf, bcc, or polling, best first."""
