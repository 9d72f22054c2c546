"""The shipped Grafana dashboard names only metrics and labels that exist.

Every PromQL expression of ``examples/grafana/rateloop-dashboard.json`` (panel
targets and template variables) is parsed for the metric names and label names
it uses, and each is looked up in a real Prometheus exposition
(``generate_latest``) of a :class:`PrometheusSink` the loop fed: retries,
waits, a fallback, a refused fallback target, an unknown outcome, an admission
wait, a capacity deadline miss and a shared pause.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from rateloop.admission import LimitSpec
from rateloop.admission.limiter import Limiter
from rateloop.loop import RateLoop
from rateloop.observe.prometheus import PrometheusSink
from rateloop.policy import Policy
from rateloop.route import Cost, Route
from rateloop.testing import FakeClock, FaultScript

DASHBOARD = Path(__file__).resolve().parents[1] / "examples" / "grafana" / "rateloop-dashboard.json"
URL = "https://api.openai.com/v1/chat/completions"
A = Route(provider="openai", model="a", project="proj")
B = Route(provider="anthropic", model="b", project="proj")

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_MATCHERS = re.compile(r"\{([^}]*)\}")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_RANGE = re.compile(r"\[[^\]]*\]")
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or",
             "unless", "bool", "offset"}  # fmt: skip


def promql_names(expr: str) -> tuple[set[str], set[str]]:
    """The metric names and the label names ``expr`` uses."""
    labels: set[str] = set()
    for m in _MATCHERS.finditer(_STRING.sub('""', expr)):
        labels |= {part.split("=")[0].split("!")[0].strip() for part in m.group(1).split(",")}
    text = _MATCHERS.sub(" ", _STRING.sub('""', expr))
    for m in _GROUPING.finditer(text):
        labels |= {name.strip() for name in m.group(1).split(",") if name.strip()}
    text = _RANGE.sub(" ", _GROUPING.sub(" ", text))
    # label_values(metric, label): the second argument is a label.
    lv = re.search(r"label_values\(\s*([A-Za-z_:][\w:]*)\s*,\s*(\w+)\s*\)", text)
    if lv:
        labels.add(lv.group(2))
        text = text.replace(lv.group(0), lv.group(1))
    metrics = {
        m.group(0)
        for m in _IDENT.finditer(text)
        if m.group(0) not in _KEYWORDS and not text[m.end() :].lstrip().startswith("(")
    }
    return metrics, labels - {""}


def test_the_parser_finds_names_so_a_wrong_one_would_fail() -> None:
    expr = 'histogram_quantile(0.95, sum by (le, tenant) (rate(rateloop_nope_bucket{x=~"$p"}[5m])))'
    assert promql_names(expr) == ({"rateloop_nope_bucket"}, {"le", "tenant", "x"})
    assert promql_names("label_values(rateloop_calls_total, provider)") == (
        {"rateloop_calls_total"},
        {"provider"},
    )


def throttled(retry_after: str = "1") -> httpx.HTTPStatusError:
    request = httpx.Request("POST", URL)
    response = httpx.Response(429, headers={"retry-after": retry_after}, request=request)
    return httpx.HTTPStatusError("429", request=request, response=response)


def ok() -> httpx.Response:
    return httpx.Response(200, request=httpx.Request("POST", URL))


def exercised_exposition() -> dict[str, set[str]]:
    """Each sample name of a real exposition and its label names, after a varied run."""
    clock = FakeClock()
    sink = PrometheusSink(clock=clock)
    policy = Policy.from_dict({"backoff": {"jitter": "none"}, "attempts_per_route": 1})
    plain = RateLoop(Policy.from_dict({"backoff": {"jitter": "none"}}), clock=clock, sinks=[sink])
    assert plain.call(FaultScript([throttled(), ok()]), route=A).ok  # a retry after a wait
    once = RateLoop(policy, clock=clock, sinks=[sink])
    fallback = FaultScript({"a": [throttled()], "b": [ok()]})
    assert once.call(fallback, route=A, fallbacks=[B]).ok  # a refusal, then a fallback
    small = Route(provider="openai", model="small", context_window=1000)
    once.call(FaultScript({"a": [throttled()]}), route=A, fallbacks=[small],
              cost=Cost(input_tokens=5000))  # fmt: skip
    timeout = httpx.ReadTimeout("read timed out", request=httpx.Request("POST", URL))
    plain.call(FaultScript([timeout]), route=A, idempotent=False)  # an unknown outcome
    limiter = Limiter(limits={A.scope: LimitSpec(requests_per_minute=2, burst=1.0)}, clock=clock)
    admitted = RateLoop(Policy(), limiter=limiter, clock=clock, sinks=[sink])
    for _ in range(2):
        assert admitted.call(FaultScript([ok()]), route=A).ok  # the second one waits
    admitted.call(FaultScript([ok()]), route=A, deadline=5.0)  # a capacity deadline miss
    paused = Limiter(limits={B.scope: LimitSpec(requests_per_minute=600)}, clock=clock)
    pausing = RateLoop(Policy(), limiter=paused, clock=clock, sinks=[sink])
    assert pausing.call(FaultScript([throttled("2"), ok()]), route=B).ok  # a shared pause
    out: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(sink.exposition().decode()):
        for sample in family.samples:
            out.setdefault(sample.name, set()).update(sample.labels)
    return out


def dashboard_exprs() -> list[str]:
    board = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    exprs = [t["expr"] for p in board["panels"] for t in p["targets"]]
    for var in board["templating"]["list"]:
        query = var.get("query")
        if isinstance(query, dict):
            exprs.append(query["query"])
    return exprs


EXPOSED = exercised_exposition()


@pytest.mark.parametrize("expr", dashboard_exprs())
def test_every_query_names_metrics_and_labels_the_sink_exposes(expr: str) -> None:
    metrics, labels = promql_names(expr)
    assert metrics, expr
    missing = metrics - EXPOSED.keys()
    assert not missing, f"{sorted(missing)} not in the exposition: {sorted(EXPOSED)}"
    known = set().union(*(EXPOSED[m] for m in metrics))
    assert labels <= known, f"labels {sorted(labels - known)} of {expr!r} not on {metrics}"


def test_the_dashboard_covers_every_counter_and_histogram_of_the_sink() -> None:
    used = set().union(*(promql_names(e)[0] for e in dashboard_exprs()))
    families = {re.sub(r"_(total|bucket|sum|count|created)$", "", name) for name in EXPOSED}
    shown = {re.sub(r"_(total|bucket|sum|count|created)$", "", name) for name in used}
    assert families - shown == set()
