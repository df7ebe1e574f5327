"""The exit codes every front end shares (0 all good, 1 a check failed, 2 bad input or usage)."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    CHECK_FAILED = 1
    USAGE = 2
