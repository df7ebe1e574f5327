"""The demo prompts: beginnings of ordinary Python that the demo pair continues.

Each ends inside a line, where the byte-level BPE the pair was trained with
would also have split the text, so the first token is not an odd boundary.
A pair's own prompts come as a JSON list in a file (build_gpu's prompts.json);
``read_prompts`` is the one check every tool that reads such a list goes through.
"""

from __future__ import annotations

import os

from blockwidth.policy import files
from blockwidth.policy.errors import BlockwidthError

DEMO_PROMPTS: tuple[str, ...] = (
    'class Stack:\n    """A last-in, first-out container."""\n\n    def __init__(self):\n        self',
    "    def __repr__(self):\n        return",
    'def read_config(path):\n    """Return the settings stored in *path* as a dict."""\n'
    "    result = {}\n    with open(path) as f:\n        for",
    'import os\nimport sys\n\n\ndef main(argv=None):\n    """Parse the command line and run."""\n    parser =',
)
DEFAULT_PROMPT = DEMO_PROMPTS[0]

# A request whose answer repeats its prompt: main() written out, then asked for once more.
# The first copy's body is the demo target's own greedy continuation of DEMO_PROMPTS[3],
# so the answer is (nearly) that text again and the model-free lookup drafter finds its
# drafts in the prompt: on this prompt lookup can win; on the others it has nothing to find.
_MAIN_BODY = (" argparse.ArgumentParser()\n    parser.add_argument('--file', default=False, "
              "action='store_true',\n            help='the file to store the output file to store them.')\n"
              "    parser.add_argument('--main', default=")
REPEAT_PROMPT = DEMO_PROMPTS[3] + _MAIN_BODY + "\n\n\n# The same, once more:\n" + DEMO_PROMPTS[3]

# The console's prompt presets (p cycles them): name, text. The first is the console's default:
# the built-in mixed workload (a leading @ names a workload), so a first session on any pair
# decides on a mix of requests rather than on one prompt.
PRESETS: tuple[tuple[str, str], ...] = (
    ("@mixed: the built-in workload (16 requests: code, prose, chat, repetitive, long context)", "@mixed"),
    ("class Stack (demo default)", DEMO_PROMPTS[0]),
    ("__repr__", DEMO_PROMPTS[1]),
    ("read_config", DEMO_PROMPTS[2]),
    ("main()", DEMO_PROMPTS[3]),
    ("repeat: main() once more (its answer repeats the prompt; lookup can win)", REPEAT_PROMPT),
)

# What the prompt field's label says while the field holds a preset: two presets begin with the
# same line (main() and its repeat), and the toast that named them was gone in four seconds.
# (strict: a preset added without its tag fails at import, not by naming the wrong one)
_TAGS = {text: tag for tag, (_, text) in
         zip(("@mixed", "Stack", "__repr__", "read_config", "main()", "repeat"), PRESETS, strict=True)}


def preset_tag(text: str) -> str | None:
    """The short name of the preset ``text`` is, or None (typed, or a preset edited)."""
    return _TAGS.get(text)


class PromptsFileError(BlockwidthError, ValueError):
    """A prompts file that cannot be used; str() is the one line to show: flag, path, what."""

    @classmethod
    def of(cls, problem: files.FileProblem, flag: str) -> PromptsFileError:
        # user_path's problems name the flag already; the readers' start with the path
        text = str(problem)
        return cls(text if text.startswith(flag) else f"{flag} {text}")


_EXPECTED = "expected a non-empty JSON list of prompts (strings)"
_JSON_TYPES = {dict: "an object", list: "a list", bool: "a boolean", int: "a number",
               float: "a number", type(None): "null"}


def read_prompts(path: str | os.PathLike, flag: str = "--prompts-file") -> list[str]:
    """The non-empty strings of a non-empty JSON list in ``path``, or PromptsFileError naming
    ``flag``. Tools call it before loading a model: a bad file then costs no minutes.
    (bench used to stop in a traceback, or measure a list of objects; build_drafters had its
    own copy of this check.)"""
    try:
        p = files.user_path(path, flag)
        got = files.read_json(p)
    except files.FileProblem as e:
        raise PromptsFileError.of(e, flag) from None
    if not isinstance(got, list):
        raise PromptsFileError(f"{flag} {p}: {_JSON_TYPES.get(type(got), 'a value')}; {_EXPECTED}")
    if not got:
        raise PromptsFileError(f"{flag} {p}: an empty list; {_EXPECTED}")
    for i, item in enumerate(got):
        if not isinstance(item, str):
            raise PromptsFileError(f"{flag} {p}: item {i} (from 0) is {_JSON_TYPES.get(type(item), 'a value')}, "
                                   f"not a string; {_EXPECTED}")
        if not item:
            raise PromptsFileError(f"{flag} {p}: item {i} (from 0) is an empty string; {_EXPECTED}")
    return got
