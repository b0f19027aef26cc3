"""The arbiter's views and messages as Python reads and writes them (gpupool.isolation.arbiter,
arbiter_control) equal the C header's (native/include/gpupool_arbiter.h): offsets, sizes, magic
and version."""

from __future__ import annotations

import subprocess
from pathlib import Path

from shim_support import INCLUDE, compile_prog

from gpupool.isolation import arbiter
from gpupool.isolation.arbiter_control import MSG, SLICE_MAX_US, SLICE_MIN_US

PROGRAM = r"""
#include <stddef.h>
#include <stdio.h>
#include "gpupool_arbiter.h"
#define SHARE(f) printf("share.%s %zu %zu\n", #f, offsetof(gpupool_arbiter_share, f), \
                        sizeof(((gpupool_arbiter_share *)0)->f))
#define CLIENT(f) printf("client.%s %zu %zu\n", #f, offsetof(gpupool_arbiter_client, f), \
                         sizeof(((gpupool_arbiter_client *)0)->f))
int main(void) {
    printf("magic %llu\nversion %u\nshares %d\nclients %d\n",
           (unsigned long long)GPUPOOL_ARBITER_MAGIC, GPUPOOL_ARBITER_VERSION,
           GPUPOOL_ARBITER_SHARES, GPUPOOL_ARBITER_CLIENTS);
    printf("file.size %zu\nfile.share %zu\nfile.client %zu\n", sizeof(gpupool_arbiter_view),
           offsetof(gpupool_arbiter_view, share), offsetof(gpupool_arbiter_view, client));
    printf("file.version %zu\nfile.fsize %zu\n", offsetof(gpupool_arbiter_view, version),
           offsetof(gpupool_arbiter_view, size));
    SHARE(share_id); SHARE(weight); SHARE(priority); SHARE(vtime); SHARE(wanted_ns);
    SHARE(busy_ns); SHARE(pid); SHARE(policy); SHARE(uid); SHARE(waiting); SHARE(resting);
    SHARE(clients); SHARE(slice_us); SHARE(reserved);
    CLIENT(pid); CLIENT(slot); CLIENT(start);
    printf("slice %u %u\n", GPUPOOL_ARB_SLICE_MIN_US, GPUPOOL_ARB_SLICE_MAX_US);
    printf("share.size %zu\nclient.size %zu\nmsg.size %zu\n", sizeof(gpupool_arbiter_share),
           sizeof(gpupool_arbiter_client), sizeof(gpupool_arbiter_msg));
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
    assert c["clients"] == [arbiter.CLIENTS]
    assert c["file.size"] == [arbiter.FILE_SIZE]
    assert c["file.share"] == [arbiter.SHARES_OFFSET]
    assert c["file.client"] == [arbiter.CLIENTS_OFFSET]
    assert c["client.size"] == [arbiter.CLIENT.size]
    assert c["msg.size"] == [MSG.size]
    assert c["slice"] == [SLICE_MIN_US, SLICE_MAX_US]
    assert (c["file.version"], c["file.fsize"]) == ([8], [12])  # HEADER: magic, version, size
    assert c["share.size"] == [arbiter.SHARE.size]
    # SHARE's fields in order: each one's offset and size as the struct format lays them out
    fields = ["share_id", "weight", "priority", "vtime", "wanted_ns", "busy_ns", "pid", "policy"]
    fields += ["uid", "waiting", "resting", "clients", "slice_us", "reserved"]
    _in_order(c, "share", fields, arbiter.SHARE.format)
    _in_order(c, "client", ["pid", "slot", "start"], arbiter.CLIENT.format)


def _in_order(c: dict[str, list[int]], struct: str, fields: list[str], layout: str) -> None:
    offset = 0
    for name, code in zip(fields, layout.lstrip("<"), strict=True):
        size = {"Q": 8, "I": 4, "i": 4}[code]
        assert c[f"{struct}.{name}"] == [offset, size], name
        offset += size
