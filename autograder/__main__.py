"""Command line of the instructor pipeline: ``python -m autograder COMMAND``."""

from __future__ import annotations

import argparse

from .pipeline import release


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run the command."""
    parser = argparse.ArgumentParser(prog="python -m autograder", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    rel = commands.add_parser("release", help="generate notebooks/ and solutions/ from source/")
    rel.add_argument("assignments", nargs="*", help="assignment names (default: all)")
    args = parser.parse_args(argv)
    if args.command == "release":
        release.release(args.assignments)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
