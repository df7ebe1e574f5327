"""``python -m lab.gguf_convert GGUF OUT --variant ...``: the GGUF converter, as the lab's GPU scripts
call it. It lives with the fixtures that need it (tests/gguf_convert.py), since the product's tests
import nothing from the lab."""

from tests.gguf_convert import *  # noqa: F401,F403 (the converter's names, for lab code)
from tests.gguf_convert import main

if __name__ == "__main__":
    raise SystemExit(main())
