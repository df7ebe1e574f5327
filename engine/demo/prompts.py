"""The demo prompts: beginnings of ordinary Python that the demo pair continues.

Each ends inside a line, where the byte-level BPE the pair was trained with
would also have split the text, so the first token is not an odd boundary.
"""

DEMO_PROMPTS: tuple[str, ...] = (
    'class Stack:\n    """A last-in, first-out container."""\n\n    def __init__(self):\n        self',
    "    def __repr__(self):\n        return",
    'def read_config(path):\n    """Return the settings stored in *path* as a dict."""\n'
    "    result = {}\n    with open(path) as f:\n        for",
    'import os\nimport sys\n\n\ndef main(argv=None):\n    """Parse the command line and run."""\n    parser =',
)
DEFAULT_PROMPT = DEMO_PROMPTS[0]

# A request whose answer repeats its prompt (the second copy of a function, renamed):
# the model-free lookup drafter finds its drafts in the prompt here, and nowhere else.
REPEAT_PROMPT = (
    'def read_config(path):\n    """Return the settings stored in *path* as a dict."""\n'
    "    result = {}\n    with open(path) as f:\n        for line in f:\n"
    '            key, _, value = line.partition("=")\n'
    "            result[key.strip()] = value.strip()\n    return result\n\n\n"
    "# The same function, renamed to load_config:\n"
    'def load_config(path):\n    """Return the settings stored in *path* as a dict."""\n'
    "    result = {}\n    with open(path) as f:\n        for"
)

# The console's prompt presets (p cycles them): name, text.
PRESETS: tuple[tuple[str, str], ...] = (
    ("class Stack (demo default)", DEMO_PROMPTS[0]),
    ("__repr__", DEMO_PROMPTS[1]),
    ("read_config", DEMO_PROMPTS[2]),
    ("main()", DEMO_PROMPTS[3]),
    ("repeat: the answer repeats the prompt (lookup can win)", REPEAT_PROMPT),
)
