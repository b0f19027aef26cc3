"""Every GPUPOOL_* environment variable gpupool reads or sets, in one list; the node daemon's
defaults (DAEMON), which `gpupool serve` and the agent's config both take from here.

The C libraries name the ones they read in `native/include/gpupool_settings.h`; a test keeps that
header and this list equal, and another one checks that no GPUPOOL_* name appears in the code
without being declared here. Reading goes through `Setting.read`, which takes the environment as
a mapping, so this module stays pure (no I/O).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Flag, auto


class Reader(Flag):
    """Who reads a variable: the Python package, the C libraries, or both."""

    PYTHON = auto()
    NATIVE = auto()
    BOTH = PYTHON | NATIVE


@dataclass(frozen=True)
class Setting:
    """One GPUPOOL_* variable: its name, its default (None: unset means "none"), and what it does.

    `per_device` variables also come as NAME_<n> for visible device ordinal n, overriding NAME.
    """

    name: str
    default: str | None
    doc: str
    reader: Reader
    per_device: bool = False

    def read(self, environ: Mapping[str, str], ordinal: int | None = None) -> str | None:
        """The value in `environ` (the per-device form first when `ordinal` is given); an empty
        value counts as unset."""
        if ordinal is not None and self.per_device:
            value = environ.get(f"{self.name}_{ordinal}")
            if value:
                return value
        return environ.get(self.name) or self.default


MEMORY_LIMIT = Setting(
    "GPUPOOL_MEMORY_LIMIT",
    None,
    "A share's memory per GPU: a Kubernetes quantity (4Gi, 4G) or bytes.",
    Reader.NATIVE,
    per_device=True,
)
COMPUTE_LIMIT = Setting(
    "GPUPOOL_COMPUTE_LIMIT",
    "100",
    "A share's compute per GPU, a whole percent from 1 to 100 (100: no limit).",
    Reader.NATIVE,
    per_device=True,
)
COMPUTE_POLICY = Setting(
    "GPUPOOL_COMPUTE_POLICY",
    "cap",
    "`cap`: never above the compute share; `share`: use an idle GPU, back to the share under load.",
    Reader.NATIVE,
)
COMPUTE_PRIORITY = Setting(
    "GPUPOOL_COMPUTE_PRIORITY",
    None,
    "`high`: guaranteed; `low`: runs only while no high share on the GPU has work (unset: "
    "arbitrated with the other shares only when the share has a compute limit).",
    Reader.NATIVE,
)
ELASTIC = Setting(
    "GPUPOOL_ELASTIC",
    "0",
    "`1`: the share's allocations are managed memory, so that it can be suspended to host memory "
    "and resumed at the same addresses (set by the daemon for its shim-mode jobs).",
    Reader.NATIVE,
)
MEMORY_BURST = Setting(
    "GPUPOOL_MEMORY_BURST",
    None,
    "Bytes per GPU a low-priority share may allocate past its memory share, host-backed managed "
    "memory evicted first (needs GPUPOOL_ELASTIC=1).",
    Reader.NATIVE,
)
SHARED_REGION = Setting(
    "GPUPOOL_SHARED_REGION",
    None,
    "The accounting file shared by every process of one share (made by the launch).",
    Reader.NATIVE,
)
ARBITER_DIR = Setting(
    "GPUPOOL_ARBITER_DIR",
    None,
    "The trusted compute arbiter's runtime directory: its lease socket and the GPUs' read-only "
    "views (set by the launch).",
    Reader.NATIVE,
)
ARBITER_SHARE = Setting(
    "GPUPOOL_ARBITER_SHARE",
    None,
    "The share's id and key at the arbiter, ID:KEY in hex (set by the launch, which registered "
    "the share; without it the share holds its compute cap alone).",
    Reader.NATIVE,
)
CONFIG_FILE = Setting(
    "GPUPOOL_CONFIG_FILE",
    None,
    "A share's settings file, read instead of the environment where /etc/gpupool/shim.conf "
    "is absent.",
    Reader.NATIVE,
)
LOG_LEVEL = Setting(
    "GPUPOOL_LOG_LEVEL",
    "warn",
    "What the C libraries print on stderr: error, warn, info or debug.",
    Reader.NATIVE,
)
SIM_NODE = Setting(
    "GPUPOOL_SIM_NODE",
    None,
    "The directory of the simulated node that `gpupool` commands and the simulated driver use.",
    Reader.BOTH,
)
SIM_KERNEL_NS = Setting(
    "GPUPOOL_SIM_KERNEL_NS",
    None,
    "Simulated driver: nanoseconds a 256x128-thread kernel takes (default: the node's own).",
    Reader.NATIVE,
)
DEBUG = Setting(
    "GPUPOOL_DEBUG",
    None,
    "Any value: the CLI shows the traceback of an internal error instead of one line.",
    Reader.PYTHON,
)
URL = Setting(
    "GPUPOOL_URL",
    None,
    "Where clients find the daemon: unix:///path/to/gpupool.sock or http://host:port "
    "(default: the state dir's socket).",
    Reader.PYTHON,
)
TOKEN = Setting(
    "GPUPOOL_TOKEN",
    None,
    "The bearer token clients send to a daemon over TCP (`gpupool serve --token-file`).",
    Reader.PYTHON,
)
WATCHDOG = Setting(
    "GPUPOOL_WATCHDOG",
    "report",
    "What `gpupool serve` does with a GPU process of no job or a job over its memory share: "
    "`report` (an event) or `kill` (SIGKILL to the process, recorded too).",
    Reader.PYTHON,
)
WATCHDOG_EXEMPT = Setting(
    "GPUPOOL_WATCHDOG_EXEMPT",
    None,
    "GPU processes of no job that `gpupool serve`'s watchdog reports as exempt and never kills: "
    "comma-separated command names (as `gpupool gpus` shows them) and uid:N entries.",
    Reader.PYTHON,
)
MPS_CONTROL = Setting(
    "GPUPOOL_MPS_CONTROL",
    None,
    "The MPS control program the daemon starts per GPU for `--mode mps` jobs (default: "
    "nvidia-cuda-mps-control on real GPUs, gpupool's simulated twin on a simulated node).",
    Reader.PYTHON,
)
MIG_KEEP_INSTANCES = Setting(
    "GPUPOOL_MIG_KEEP_INSTANCES",
    None,
    "1 or true: the node daemon leaves the MIG instances it created for jobs in place "
    "after them, for the next job of that profile (`gpupool serve --mig-keep-instances`).",
    Reader.PYTHON,
)

LOG_FORMAT = Setting(
    "GPUPOOL_LOG_FORMAT",
    "plain",
    "How `gpupool serve` writes its log on stderr: `plain` (lines to read) or `json` (one JSON "
    "object per line, for Loki or Elasticsearch; `gpupool serve --log-format`).",
    Reader.PYTHON,
)


@dataclass(frozen=True)
class DaemonDefaults:
    """What the node daemon does when neither an option of `gpupool serve` nor a setting says."""

    #: how a job's GPUs are chosen (scheduler.registry.POLICY_NAMES): the policy the trace
    #: benchmark measures
    policy: str = "gpupool"
    #: seconds from a cancel's SIGTERM to its SIGKILL
    cancel_grace_s: float = 10.0
    #: bytes of each job's stdout and stderr kept, the newest (0: no limit)
    max_log_size: int = 1 << 30
    #: seconds after which a finished job, its events and its directory are deleted
    keep_finished_s: float = 14 * 86400
    #: the share of the host's memory that services' parked replicas may hold together
    #: (`serve --parked-memory` sets bytes); past it the least recently used is stopped
    parked_memory_fraction: float = 0.5


DAEMON = DaemonDefaults()


@dataclass(frozen=True)
class ListenerLimits:
    """What one client may hold of the daemon's listeners (the Unix socket, `--listen`), so that
    no client, authenticated or not, takes descriptors or memory from the others
    (docs/limits.md). A peer is a uid on the Unix socket, an IP address over TCP; each listener
    has its own budget, so a flood of TCP connections leaves the Unix socket usable."""

    #: bytes of a request's head (request line and headers); past it 431
    max_head_bytes: int = 32 << 10
    #: header lines in a request's head; past it 431
    max_headers: int = 100
    #: seconds from a request's first byte to the end of its head
    head_timeout_s: float = 10.0
    #: seconds from the end of a request's head to the end of its body
    body_timeout_s: float = 30.0
    #: seconds a connection may wait for its next request (its first one too)
    idle_timeout_s: float = 5.0
    #: connections open at once on one listener; at most a quarter of the open-file limit
    max_connections: int = 1024
    #: connections open at once from one peer on one listener
    max_connections_per_peer: int = 128


LISTENER = ListenerLimits()

#: every setting, in the order the docs list them
ALL: tuple[Setting, ...] = (
    MEMORY_LIMIT,
    COMPUTE_LIMIT,
    COMPUTE_POLICY,
    COMPUTE_PRIORITY,
    ELASTIC,
    MEMORY_BURST,
    SHARED_REGION,
    ARBITER_DIR,
    ARBITER_SHARE,
    CONFIG_FILE,
    LOG_LEVEL,
    SIM_NODE,
    SIM_KERNEL_NS,
    DEBUG,
    URL,
    TOKEN,
    WATCHDOG,
    WATCHDOG_EXEMPT,
    MPS_CONTROL,
    MIG_KEEP_INSTANCES,
    LOG_FORMAT,
)

#: the settings that make up a share; only a launch may set them
SHARE_SETTINGS: tuple[Setting, ...] = (
    MEMORY_LIMIT,
    COMPUTE_LIMIT,
    COMPUTE_POLICY,
    COMPUTE_PRIORITY,
    ELASTIC,
    MEMORY_BURST,
    SHARED_REGION,
    CONFIG_FILE,
    ARBITER_DIR,
    ARBITER_SHARE,
)


def by_name(name: str) -> Setting | None:
    """The setting `name` declares, per-device forms (`GPUPOOL_MEMORY_LIMIT_3`) included."""
    for setting in ALL:
        if name == setting.name:
            return setting
        suffix = name.removeprefix(setting.name + "_")
        if setting.per_device and suffix != name and suffix.isdigit():
            return setting
    return None
