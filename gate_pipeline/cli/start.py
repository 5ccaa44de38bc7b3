"""Where gate's console scripts start: `gate` (`gate()`) and `server` (`main()`: `gate serve` under the name
OpenEnv's tooling runs, whose layout names a server's entry point `main`), in a module that imports nothing of
gate's: importing the commands takes a tenth of a second, and a Ctrl-C meanwhile is `gate: interrupted` (130)
as it is once a command runs. The signal is only noted while they are imported: raised there, Python's import
machinery can swallow it in one of its callbacks ("Exception ignored in ... _get_module_lock"), and the
command then ran to its end."""
import signal
import sys
import threading


def _import_main():
    """`cli.main.main`, or None when a Ctrl-C came while it was imported (where Ctrl-C is Python's KeyboardInterrupt:
    an ignored SIGINT, as in a shell's background job, stays ignored)."""
    if threading.current_thread() is not threading.main_thread() \
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        from .main import main
        return main
    interrupted: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda sig, frame: interrupted.append(sig))
    try:
        from .main import main
    finally:
        signal.signal(signal.SIGINT, previous)
    return None if interrupted else main


def _run(argv: list[str] | None) -> int:
    try:
        main = _import_main()
    except KeyboardInterrupt:  # before the handler above took over
        main = None
    if main is None:
        print("gate: interrupted", file=sys.stderr)
        return 130
    return main(argv)


def gate() -> int:
    """The `gate` console script."""
    return _run(None)


def main() -> int:
    """The `server` console script: `gate serve` with this command's arguments."""
    return _run(["serve", *sys.argv[1:]])
