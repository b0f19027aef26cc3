"""`gpupool k8s ...`: bad input is one line and a non-zero exit, before anything starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def gpupool(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    env["KUBECONFIG"] = str(home / "no-such-kubeconfig")
    env["HOME"] = str(home)
    return subprocess.run(
        [sys.executable, "-m", "gpupool", "k8s", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["extender", "--listen", "8888"], "invalid --listen '8888': use HOST:PORT"),
        (["extender", "--policy", "fastest"], "unknown policy 'fastest'"),
        (["extender", "--resync", "0"], "invalid --resync 0.0: must be positive"),
        (["extender", "--key-file", "/no/key"], "cannot read the allocation key /no/key"),
        (["device-plugin", "--kubelet-dir", "/no/such/dir"], "invalid --kubelet-dir"),
        (
            ["device-plugin", "--kubelet-dir", "/tmp", "--key-file", "/no/key"],
            "cannot read the allocation key /no/key",
        ),
        (["webhook"], "the webhook serves HTTPS only"),
        (["webhook", "--tls-cert", "/no/cert.pem"], "the webhook serves HTTPS only"),
        (
            ["webhook", "--tls-cert", "/no/cert.pem", "--tls-key", "/no/key.pem"],
            "invalid TLS file /no/cert.pem: not found",
        ),
    ],
)
def test_bad_input_is_one_line(args: list[str], line: str, tmp_path: Path) -> None:
    result = gpupool(*args, home=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("gpupool: error: ")
    assert line in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("key", "line"),
    [
        (b"short", "the allocation key KEY is 5 bytes: use at least 32 random bytes"),
        (b"k" * 48, "no Kubernetes configuration: not in a cluster and no kubeconfig"),
    ],
)
def test_the_extender_needs_a_long_key_then_the_api_server(
    key: bytes, line: str, tmp_path: Path
) -> None:
    path = tmp_path / "key"
    path.write_bytes(key)
    result = gpupool("extender", "--key-file", str(path), home=tmp_path)
    assert result.returncode == 2, result.stderr
    assert line.replace("KEY", str(path)) in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
