"""``python -m rateloop``."""

from rateloop.cli import main

main()
