"""``python -m blockwidth``: the same entry point as the ``blockwidth`` console script."""

from blockwidth.console.cli import entry

if __name__ == "__main__":
    entry()
