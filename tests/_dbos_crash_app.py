"""A DBOS app for tests/test_integrations_dbos.py's crash test, run as a subprocess.

``python tests/_dbos_crash_app.py start|recover SYSDB_URL REDIS_URL PREFIX WORKFLOW_ID``

The workflow makes two calls through :func:`call_step`: ``a`` answers at once; ``b`` is
refused with ``retry-after: 3`` the first time (beyond the pause limit of 1 s: a durable
sleep), then answers.  Each call counts itself in Redis (``PREFIX:a`` / ``PREFIX:b``), so the
test sees every side effect, whichever process made it.  ``start`` starts the workflow and
waits (the test kills it); ``recover`` launches the same executor, which recovers the
workflow, and prints its result.  Nothing runs on import.
"""

from __future__ import annotations

import sys


def main(mode: str, sysdb_url: str, redis_url: str, prefix: str, workflow_id: str) -> None:
    import httpx
    import redis
    from dbos import DBOS, SetWorkflowID

    from rateloop import Policy, RateLoop, Route
    from rateloop.integrations.dbos import call_step, launch

    counter = redis.Redis.from_url(redis_url)

    def call(route: Route, *, name: str) -> str:
        n = counter.incr(f"{prefix}:{name}")
        if name == "b" and n == 1:
            request = httpx.Request("POST", "https://api.openai.com/v1/chat/completions")
            response = httpx.Response(429, headers={"retry-after": "3"}, request=request)
            raise httpx.HTTPStatusError("429", request=request, response=response)
        return f"{name}:{route.model}"

    loop = RateLoop(Policy.from_dict({"pause_limit_secs": 1}), sinks=())
    route = Route(provider="openai", model="gpt-4o-mini")

    @DBOS.workflow(name="rateloop_crash_test")
    def two_calls() -> list[str]:
        first = call_step(lambda r: call(r, name="a"), loop=loop, route=route, name="a")
        second = call_step(lambda r: call(r, name="b"), loop=loop, route=route, name="b")
        return [first.value, second.value]

    launch({"name": "rateloop-crash-test", "system_database_url": sysdb_url,
            "executor_id": "crash-test", "application_version": "crash-test",
            "sys_db_pool_size": 4, "log_level": "WARNING"})
    try:
        if mode == "start":
            with SetWorkflowID(workflow_id):
                handle = DBOS.start_workflow(two_calls)
            handle.get_result()  # the test kills this process during the durable sleep
        else:
            handle = DBOS.retrieve_workflow(workflow_id)
            print("result:", ",".join(handle.get_result()), flush=True)
    finally:
        DBOS.destroy()


if __name__ == "__main__":
    main(*sys.argv[1:6])
