"""The Celery integration's parts: the write-key record (keys) and the engine's settings and
checks (engine).  The public face is :mod:`rateloop.integrations.celery`."""
