"""How every process of `bashfleet.worker.engine.isolate` starts: `python -I -S
.../isolate/bootstrap.py ENTRY ARGS...` (`isolate.command` builds it).

Under `-I -S` nothing is on sys.path (no site-packages, not even this script's folder),
so the package cannot be imported by its name. This script registers the packages above
this one (`bashfleet`, `bashfleet.worker`, `bashfleet.worker.engine`) as empty packages
over their folders, without running their `__init__`s (those import the engine's other
dependencies), imports `isolate` itself, and runs ENTRY as `__main__` with
`sys.argv` = [its path, ARGS...], as if it had been run by its path.
"""

import os
import runpy
import sys
import types


def _register_parents(isolate_dir: str) -> None:
    engine_dir = os.path.dirname(isolate_dir)
    worker_dir = os.path.dirname(engine_dir)
    for name, path in (("bashfleet", os.path.dirname(worker_dir)),
                       ("bashfleet.worker", worker_dir),
                       ("bashfleet.worker.engine", engine_dir)):
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [path]
            sys.modules[name] = package


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    _register_parents(here)
    from bashfleet.worker.engine import isolate  # noqa: PLC0415 - importable only now

    if len(sys.argv) < 2 or sys.argv[1] not in isolate.ENTRIES:
        sys.exit(f"usage: bootstrap.py ENTRY ARGS... (ENTRY one of {isolate.ENTRIES})")
    entry = sys.argv[1]
    sys.argv = [os.path.join(here, f"{entry}.py"), *sys.argv[2:]]
    runpy.run_module(f"bashfleet.worker.engine.isolate.{entry}", run_name="__main__",
                     alter_sys=True)


if __name__ == "__main__":
    main()
