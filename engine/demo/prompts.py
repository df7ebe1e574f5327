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

# A request whose answer repeats its prompt: main() written out, then asked for once more.
# The first copy's body is the demo target's own greedy continuation of DEMO_PROMPTS[3],
# so the answer is (nearly) that text again and the model-free lookup drafter finds its
# drafts in the prompt: on this prompt lookup can win; on the others it has nothing to find.
_MAIN_BODY = (" argparse.ArgumentParser()\n    parser.add_argument('--file', default=False, "
              "action='store_true',\n            help='the file to store the output file to store them.')\n"
              "    parser.add_argument('--main', default=")
REPEAT_PROMPT = DEMO_PROMPTS[3] + _MAIN_BODY + "\n\n\n# The same, once more:\n" + DEMO_PROMPTS[3]

# The console's prompt presets (p cycles them): name, text.
PRESETS: tuple[tuple[str, str], ...] = (
    ("class Stack (demo default)", DEMO_PROMPTS[0]),
    ("__repr__", DEMO_PROMPTS[1]),
    ("read_config", DEMO_PROMPTS[2]),
    ("main()", DEMO_PROMPTS[3]),
    ("repeat: main() once more (its answer repeats the prompt; lookup can win)", REPEAT_PROMPT),
)
