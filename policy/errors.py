"""One base for every expected failure, and the exit codes the front ends share.

A ``BlockwidthError`` carries a message (what is wrong, one line or located lines), the input it
is about (a key: ``target``, ``draft``, ``widths``, ...; None when the message names it already)
and the exit code a headless command ends with. Each front end words an input's name its way,
once: the command line as its flag (``--target``), the console as its field's label; ``say``
puts those words in front of the message. Nothing below wraps one error in another to rename it.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Mapping


class ExitCode(IntEnum):
    """Every code a blockwidth command ends with (the README lists them)."""

    OK = 0
    CHECK_FAILED = 1  # a check failed, a save was refused, the profile is held by another writer
    USAGE = 2  # bad input or usage: one line naming the input; nothing was run or written
    ENVIRONMENT = 3  # the environment failed: a server that could not start, crashed or failed a request
    TIMED_OUT = 124  # a sharded group ran past --group-timeout (as timeout(1) ends)
    INTERRUPTED = 130  # Ctrl-C (128 + SIGINT): what was measured is kept
    BROKEN_PIPE = 141  # the reader of stdout left (128 + SIGPIPE): nothing more is said


# How an input is called where no front end words it (a library caller, a log line).
WORDS: Mapping[str, str] = {"draft": "drafter"}


class BlockwidthError(Exception):
    """An expected failure: ``message``, the ``input_name`` it is about, the ``exit_code``."""

    exit_code: ExitCode = ExitCode.USAGE

    def __init__(self, message: str, input_name: str | None = None,
                 exit_code: ExitCode | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.input_name = input_name
        if exit_code is not None:
            self.exit_code = exit_code

    def about(self, input_name: str) -> "BlockwidthError":
        """This error, said of ``input_name``: for a reader that does not know which input it was
        given (a config, a file). Returns the same error, to be raised again."""
        if self.input_name is None:
            self.input_name = input_name
        return self

    def adding(self, text: str = "", *, before: str = "") -> "BlockwidthError":
        """This error with ``text`` after its message and ``before`` in front of it (what a front
        end kept, where a log is, which command): the same error, its class, input and exit code,
        to be raised again, never wrapped in another."""
        self.message = f"{before}{self.message}{text}"
        self.args = (self.message, *self.args[1:])
        return self

    def say(self, names: Mapping[str, str] | None = None) -> str:
        """The message, the input named as ``names`` words it (else WORDS, else the key)."""
        if not self.input_name:
            return self.message
        word = (names or {}).get(self.input_name) or WORDS.get(self.input_name, self.input_name)
        return f"{word} {self.message}"

    def __str__(self) -> str:
        return self.say()


class InputError(BlockwidthError):
    """Bad input from the operator: one line naming the input and what is wrong."""
