"""How the headless commands take signals. A measuring command treats SIGTERM (and SIGHUP) as
Ctrl-C: the measurement stops after the step under way and the record of what finished is
written, marked cancelled (a supervisor's SIGTERM lost every repetition measured); a second
signal quits at once. ``serve`` stops its server on any of them, and none may end it mid-stop.
"""

from __future__ import annotations

import signal
import sys
import threading
from typing import Any, Callable

STOP = (signal.SIGTERM, signal.SIGHUP)  # what a supervisor or a closed terminal sends


class handlers:
    """``handler`` for ``sigs`` inside the block (the main thread's alone: only it may set
    them), the old handlers back after it."""

    def __init__(self, handler: Callable[[int, Any], Any] | int, *sigs: int) -> None:
        self.handler, self.sigs, self.old = handler, sigs, {}

    def __enter__(self) -> "handlers":
        if threading.current_thread() is threading.main_thread():
            for sig in self.sigs:
                self.old[sig] = signal.signal(sig, self.handler)
        return self

    def __exit__(self, *exc: Any) -> bool:
        for sig, h in self.old.items():
            signal.signal(sig, h)
        return False


LAST: list[int] = []  # the last signal raise_interrupt took (what the stop line names)


def raise_interrupt(signum: int, frame: Any) -> None:
    LAST[:] = [signum]
    raise KeyboardInterrupt


def stop_words(what: str, step: str = "forward") -> str:
    """The line a first stop signal gets: the work stops after its step and keeps what finished.
    Ctrl-C's own words for SIGINT; another signal is named (a supervisor's SIGTERM read "Ctrl-C
    again quits now"), and a second signal of any kind quits."""
    name = signal.Signals(LAST[0]).name if LAST and LAST[0] != signal.SIGINT else None
    again = "Ctrl-C again quits now" if name is None else f"{name}; a second signal quits now"
    return f"blockwidth: stopping {what} after the {step} under way ({again})"


def as_interrupt() -> handlers:
    """SIGTERM and SIGHUP raise KeyboardInterrupt, as Ctrl-C does (the code that waits on a
    measurement answers both the same way)."""
    return handlers(raise_interrupt, *STOP)


def shielded() -> handlers:
    """SIGINT, SIGTERM and SIGHUP ignored while something must finish (a server's bounded stop)."""
    return handlers(signal.SIG_IGN, signal.SIGINT, *STOP)


def cancelling(cancel: threading.Event, what: str) -> handlers:
    """The first SIGINT, SIGTERM or SIGHUP sets ``cancel`` (the work stops after the step under
    way and keeps what finished) and says so; a second raises KeyboardInterrupt."""
    def handler(signum: int, frame: Any) -> None:
        if cancel.is_set():
            raise KeyboardInterrupt
        cancel.set()
        LAST[:] = [signum]
        sys.stderr.write(f"\n{stop_words(what, 'step')}\n")
        sys.stderr.flush()

    return handlers(handler, signal.SIGINT, *STOP)
