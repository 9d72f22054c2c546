"""The DBOS integration's parts; the public face is :mod:`rateloop.integrations.dbos`."""
