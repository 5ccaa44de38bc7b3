"""gate's command line (`gate ...`): thin wrappers over the core, one line per error.

The console scripts start here, in a module that imports nothing: importing the commands takes a tenth
of a second, and Ctrl-C in it is `gate: interrupted` (130) as it is once a command runs, never a
traceback."""
import sys


def _interrupted() -> int:
    print("gate: interrupted", file=sys.stderr)
    return 130


def gate() -> int:
    """The `gate` console script."""
    try:
        from .main import main
    except KeyboardInterrupt:
        return _interrupted()
    return main()


def server() -> int:
    """The `server` console script (`gate serve` under the name OpenEnv's tooling runs)."""
    try:
        from .main import main
    except KeyboardInterrupt:
        return _interrupted()
    return main(["serve", *sys.argv[1:]])
