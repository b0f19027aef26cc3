"""What the CLI prints, a line (or a block of lines) in one write(2).

`print(text)` writes the text and its newline apart where standard output is unbuffered
(PYTHONUNBUFFERED, `python -u`), so that two commands appending to one file
(`gpupool submit ... >> ids &`, 25 at a time) interleave into a line of two ids and an empty
one. `say` writes the whole line, newline included, in one call and flushes it at once: a line
never waits in a buffer to be split at its boundary either.
"""

from __future__ import annotations

import sys


def say(text: object = "", *, err: bool = False) -> None:
    """`text` and its newline to standard output (standard error with `err`), in one write."""
    stream = sys.stderr if err else sys.stdout
    stream.write(f"{text}\n")
    stream.flush()
