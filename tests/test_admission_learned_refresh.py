"""Reading what other processes learned: once a second per provider scope, not per tenant.

A limiter on a shared backend reads the limits other processes learned from
the provider's headers (one extra round trip) when a route that can learn
something is due.  The provider states limits for a project, every tenant
included (``Route.provider_scope``), so the tenants of one project share that
schedule: 100k tenants calling now and then would otherwise pay the extra
round trip on nearly every admission.
"""

from __future__ import annotations

from rateloop.admission.learning import REFRESH_SECONDS, Learned
from rateloop.route import Route


def _tenant(project: str, tenant: str) -> Route:
    return Route(provider="openai", model="gpt-5", project=project, tenant=tenant)


def test_the_tenants_of_a_project_share_one_read_a_second() -> None:
    learned = Learned(lambda scope: False, shared=True)
    tenants = [_tenant("p", f"t{i}") for i in range(50)]
    ops = [learned.refresh_op(route, 100.0) for route in tenants]
    assert [op is not None for op in ops] == [True] + [False] * 49
    first = ops[0]
    assert first is not None and first.scopes == tenants[0].scopes  # the caller's scopes
    # Another project of the same model is another provider scope: its own read.
    assert learned.refresh_op(_tenant("q", "t0"), 100.0) is not None
    # Within the second, no tenant of p reads again; after it, the next one does.
    assert learned.refresh_op(tenants[9], 100.0 + REFRESH_SECONDS * 0.99) is None
    again = learned.refresh_op(tenants[9], 100.0 + REFRESH_SECONDS)
    assert again is not None and again.scopes == tenants[9].scopes


def test_a_route_without_a_project_has_its_own_schedule() -> None:
    learned = Learned(lambda scope: False, shared=True)
    model = Route(provider="openai", model="gpt-5")
    assert learned.refresh_op(model, 5.0) is not None
    assert learned.refresh_op(model, 5.5) is None
    assert learned.refresh_op(_tenant("p", "t1"), 5.5) is not None  # provider scope ...:p


def test_an_unshared_backend_never_reads() -> None:
    learned = Learned(lambda scope: False, shared=False)
    assert learned.refresh_op(_tenant("p", "t0"), 0.0) is None
