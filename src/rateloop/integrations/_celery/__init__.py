"""The Celery integration's parts: settings (a task's rateloop settings, checked), keys (the
write-key record in Redis) and engine (the worker settings, the broker checks).  The public
face is :mod:`rateloop.integrations.celery`."""
