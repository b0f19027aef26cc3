"""Query parameters more than one route takes, bounded where the API takes them: a number past
what the store or the kernel can hold is a 400 naming the parameter, never an overflow deep
inside (a 500 with a traceback in the log)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Query

#: what one log read answers at most
LOG_CHUNK = 1 << 20
#: a file offset is 64-bit signed (off_t); a negative one reads from the top
MAX_LOG_OFFSET = 2**63 - 1

LogOffset = Annotated[int, Query(le=MAX_LOG_OFFSET, description="byte offset to read from")]
