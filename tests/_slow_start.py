"""A worker initializer whose module takes seconds to import in a worker: a spawned worker
imports it before any initializer runs, the window where a Ctrl-C used to kill a starting worker.
It sleeps only where the test asks (its workers inherit the variable); the test's own process
imports it at once."""

import os
import time

if os.environ.get("CYTO_TEST_SLOW_START"):
    time.sleep(float(os.environ["CYTO_TEST_SLOW_START"]))


def ready() -> None:
    pass
