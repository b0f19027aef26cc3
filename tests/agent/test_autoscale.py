"""The autoscaler's decisions and a service's spec, without a daemon."""

from __future__ import annotations

import pytest

from gpupool.agent.autoscale import Autoscaler
from gpupool.agent.service_replicas import backoff
from gpupool.agent.services import ServiceSpec, parse_replicas
from gpupool.core.errors import InvalidRequest


def spec(**changes: object) -> ServiceSpec:
    base: dict[str, object] = {
        "name": "chat",
        "argv": ("/bin/true",),
        "min_replicas": 0,
        "max_replicas": 4,
        "concurrency": 2,
        "idle_s": 10.0,
        "window_s": 5.0,
    }
    base.update(changes)
    return ServiceSpec(**base)  # type: ignore[arg-type]


def test_up_at_once_down_after_the_window_and_to_zero_after_idle() -> None:
    service = spec()
    scaler = Autoscaler(0.0)
    assert scaler.decide(service, 0, 0, 0.0, 0.0).replicas == 1  # just created: in use
    assert scaler.decide(service, 7, 0, 1.0, 1.0).replicas == 4  # 7 / 2, capped at MAX
    assert scaler.decide(service, 2, 0, 2.0, 2.0).replicas == 4  # a lull: held
    assert scaler.decide(service, 2, 0, 5.5, 5.9).replicas == 4  # the window still holds 7
    down = scaler.decide(service, 2, 0, 12.0, 12.0)
    assert down.replicas == 1 and "over 5s" in down.why
    assert scaler.decide(service, 0, 0, 12.0, 21.0).replicas == 1  # not idle for 10 s yet
    zero = scaler.decide(service, 0, 0, 12.0, 22.5)
    assert zero.replicas == 0 and "no request for 10s" in zero.why
    assert scaler.decide(service, 1, 1, 23.0, 23.0).replicas == 1  # a waiting request wakes it


def test_min_holds_and_backoff_doubles_to_a_ceiling() -> None:
    scaler = Autoscaler(0.0)
    decision = scaler.decide(spec(min_replicas=2), 0, 0, 0.0, 100.0)
    assert decision.replicas == 2 and decision.why == "MIN 2"
    assert [backoff(n) for n in (1, 2, 3, 4, 9)] == [1, 2, 4, 8, 30]


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"name": "Chat"}, "invalid service name"),
        ({"name": "a/b"}, "invalid service name"),
        ({"min_replicas": 3, "max_replicas": 1}, "MIN must not be above MAX"),
        ({"max_replicas": 0}, "MAX is 1 to"),
        ({"concurrency": 0}, "--concurrency"),
        ({"health": "health"}, "--health"),
        ({"health": "/a b"}, "--health"),
        ({"env": {"PORT": "1"}}, "gpupool picks"),
        ({"idle_s": float("nan")}, "--idle"),
        ({"memory": "lots"}, "lots"),
        ({"argv": ()}, "no command given"),
    ],
)
def test_bad_specs_are_refused_with_one_line(changes: dict[str, object], words: str) -> None:
    with pytest.raises(InvalidRequest, match=None) as refused:
        spec(**changes)
    assert words in str(refused.value)


def test_replicas_parse() -> None:
    assert parse_replicas("2") == (2, 2)
    assert parse_replicas("0..8") == (0, 8)
    for bad in ("3..1", "-1..2", "a", "1..", "99999"):
        with pytest.raises(InvalidRequest):
            parse_replicas(bad)
