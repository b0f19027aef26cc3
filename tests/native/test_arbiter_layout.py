"""The arbiter file's layout as Python reads it (gpupool.isolation.arbiter) equals the C header's
(native/include/gpupool_arbiter.h): offsets, sizes, magic and version."""

from __future__ import annotations

import subprocess
from pathlib import Path

from shim_support import INCLUDE, compile_prog

from gpupool.isolation import arbiter

PROGRAM = r"""
#include <stddef.h>
#include <stdio.h>
#include "gpupool_arbiter.h"
#define SHARE(f) printf("share.%s %zu %zu\n", #f, offsetof(gpupool_arbiter_share, f), \
                        sizeof(((gpupool_arbiter_share *)0)->f))
int main(void) {
    printf("magic %llu\nversion %u\nshares %d\n", (unsigned long long)GPUPOOL_ARBITER_MAGIC,
           GPUPOOL_ARBITER_VERSION, GPUPOOL_ARBITER_SHARES);
    printf("file.size %zu\nfile.share %zu\n", sizeof(gpupool_arbiter_file),
           offsetof(gpupool_arbiter_file, share));
    printf("file.version %zu\nfile.fsize %zu\n", offsetof(gpupool_arbiter_file, version),
           offsetof(gpupool_arbiter_file, size));
    SHARE(share_id); SHARE(weight); SHARE(priority); SHARE(vtime); SHARE(wanted_ns);
    SHARE(busy_ns); SHARE(pid); SHARE(policy);
    printf("share.size %zu\n", sizeof(gpupool_arbiter_share));
    return 0;
}
"""


def test_python_reads_the_arbiter_at_the_c_offsets(tmp_path: Path) -> None:
    source = tmp_path / "layout.c"
    source.write_text(PROGRAM)
    exe = compile_prog(source, tmp_path / "layout")
    assert INCLUDE.is_dir()
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    c = {line.split()[0]: [int(v) for v in line.split()[1:]] for line in out.splitlines()}
    assert c["magic"] == [arbiter.MAGIC]
    assert c["version"] == [arbiter.VERSION]
    assert c["shares"] == [arbiter.SHARES]
    assert c["file.size"] == [arbiter.FILE_SIZE]
    assert c["file.share"] == [arbiter.SHARES_OFFSET]
    assert (c["file.version"], c["file.fsize"]) == ([8], [12])  # HEADER: magic, version, size
    assert c["share.size"] == [arbiter.SHARE.size]
    # SHARE's fields in order: each one's offset and size as the struct format lays them out
    fields = ["share_id", "weight", "priority", "vtime", "wanted_ns", "busy_ns", "pid", "policy"]
    offset = 0
    for name, code in zip(fields, arbiter.SHARE.format.lstrip("<"), strict=True):
        size = {"Q": 8, "I": 4, "i": 4}[code]
        assert c[f"share.{name}"] == [offset, size], name
        offset += size
