"""The dashboard's events panel: job events link to their job, node events say "node", and every
detail is escaped."""

from __future__ import annotations

from gpupool.api.dashboard_html import events_html


def test_events_link_their_job_or_say_node_and_escape_details() -> None:
    events = [
        {"at": 2.0, "job_id": None, "kind": "foreign", "detail": "pid 7 <script>x</script>"},
        {"at": 1.0, "job_id": 3, "kind": "oom", "detail": "refused"},
    ]
    shown = events_html({"events": events})
    assert '<span class="node">node</span>' in shown and "/jobs/None" not in shown
    assert '<a href="/jobs/3">job 3</a>' in shown
    assert "<script>" not in shown and "&lt;script&gt;" in shown
    assert shown.index("foreign") < shown.index("oom")  # as given: newest first
