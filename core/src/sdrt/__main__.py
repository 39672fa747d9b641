import sys

try:  # Ctrl-C while the modules import is the same one line and exit status as later (sdrt.cli.main)
    from .cli import main

    code = main()
except KeyboardInterrupt:
    print("interrupted", file=sys.stderr)
    code = 130
raise SystemExit(code)
