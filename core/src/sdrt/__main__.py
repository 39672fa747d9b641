import os
import sys

try:  # Ctrl-C while the modules import is the same one line and exit status as later (sdrt.cli.main)
    from .cli import main

    code = main()
except KeyboardInterrupt:
    print("interrupted", file=sys.stderr)
    code = 130
if code == 130:
    # Under `python -m`, CPython (3.11-3.13) ends a run by re-raising SIGINT on itself (status -2, not 130) when
    # the Ctrl-C landed inside a string exec() (a dataclass or namedtuple being made by a lazy import), even
    # though sdrt caught it: its runtime flag survives the catch. The run is over and cleaned up here, so leave
    # with the status the one line promised, after what Python's exit would wait for: the threads that are not
    # daemons (a compile-cache store finishing in the background); a second Ctrl-C leaves at once (a store's
    # temporary folder is swept by a later run).
    import threading

    try:
        for thread in threading.enumerate():
            if thread is not threading.main_thread() and not thread.daemon:
                thread.join()
    except KeyboardInterrupt:
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(130)
raise SystemExit(code)
