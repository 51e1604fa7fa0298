"""How many CPU threads a training or evaluation run should use on a possibly busy machine."""

from __future__ import annotations

import os

import torch


def idle_cpu_threads() -> int:
    """Threads for a CPU run: torch's default, lowered to the cores other processes leave idle (at least 1).

    On a busy machine, more OpenMP threads than idle cores make every matrix product wait for descheduled
    threads (measured on a loaded 2-core machine: SmolLM2 calibration 126 tok/s with 1 thread, 23 with 2).
    """
    try:
        busy = os.getloadavg()[0]
    except OSError:  # not available on this platform
        return torch.get_num_threads()
    idle = (os.cpu_count() or 1) - busy
    return max(1, min(torch.get_num_threads(), int(idle + 0.5)))
