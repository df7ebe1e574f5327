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
