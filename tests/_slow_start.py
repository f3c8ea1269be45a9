"""A worker initializer whose module takes seconds to import: a spawned worker imports it before
any initializer runs, the window where a Ctrl-C used to kill a starting worker."""

import time

time.sleep(3.0)


def ready() -> None:
    pass
