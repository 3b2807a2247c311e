"""Starts the fault tests' driver processes without paying Python's imports for each (tests/conftest.py: ``drivers``).

    python tests/driver_server.py MODULE [MODULE ...]

It imports the modules (the drivers, tests/kill_driver.py and tests/budget_driver.py: Ray,
Tune and ray_dptune with them; and what they import lazily) once, then reads one JSON request per line on stdin::

    {"module": "kill_driver", "argv": [...], "env": {...}, "stdout": PATH, "stderr": PATH, "timeout": S}

and forks a child for each. The child is a driver process of its own: its own pid and
environment, its stdout and stderr in the given files, its own connection to the Ray cluster
at $RAY_ADDRESS (``ray.init`` runs in the child; this parent never connects to Ray and runs no
thread, so the fork copies no Ray or gRPC state). It runs ``MODULE.main()`` with ``argv`` and
exits; a kill is a real SIGKILL to its pid. The answer is one JSON line per request,
``{"returncode": N}``, N as ``subprocess`` gives it (-9: killed by SIGKILL; -1 after a
timeout, when this parent SIGKILLs it).
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback


def child(module, request: dict) -> int:
    """Runs in the forked child: the driver's main() with the request's argv, environment and files."""
    stdin = os.open(os.devnull, os.O_RDONLY)
    os.dup2(stdin, 0)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = [module.__file__, *request["argv"]]
    try:
        module.main()
        return 0
    except SystemExit as exit_:  # argparse and explicit exits, with the code a process would exit with
        if exit_.code is None or isinstance(exit_.code, int):
            return exit_.code or 0
        print(exit_.code, file=sys.stderr)
        return 1
    except BaseException:  # noqa: BLE001 - a process that dies of an exception: traceback on stderr, status 1
        traceback.print_exc()
        return 1
    finally:
        atexit._run_exitfuncs()  # what the interpreter runs at a normal exit (ray.shutdown among them)
        sys.stdout.flush()
        sys.stderr.flush()


def wait(pid: int, timeout: float) -> int:
    """The child's status as ``subprocess`` reports it; SIGKILLs it after ``timeout`` seconds (-1)."""
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return -1
        time.sleep(0.01)


def main() -> None:
    modules = {name: importlib.import_module(name) for name in sys.argv[1:]}
    answers = sys.stdout
    for line in sys.stdin:
        request = json.loads(line)
        module = modules[request["module"]]
        answers.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            os._exit(child(module, request))
        answers.write(json.dumps({"returncode": wait(pid, request.get("timeout", 300))}) + "\n")
        answers.flush()


class DriverServer:
    """The test side: starts the server once, then runs each driver as a process of its own.

    Args:
        modules: the driver modules to import once (in tests/).
    """

    def __init__(self, *modules: str):
        here = os.path.dirname(os.path.abspath(__file__))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))}
        self._process = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), *modules],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        self._folder = tempfile.TemporaryDirectory(prefix="drivers-")

    def run(self, module: str, argv: list[str], *, env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
        """Runs ``module.main()`` with ``argv`` and ``env`` in a new process; its status, stdout and stderr."""
        out, err = (os.path.join(self._folder.name, name) for name in ("stdout", "stderr"))
        request = {"module": module, "argv": [str(a) for a in argv], "env": env, "stdout": out, "stderr": err}
        self._process.stdin.write(json.dumps({**request, "timeout": timeout}) + "\n")
        self._process.stdin.flush()
        answer = self._process.stdout.readline()
        if not answer:
            raise RuntimeError(f"the driver server exited (status {self._process.wait()})")
        with open(out) as stdout, open(err) as stderr:
            returncode = json.loads(answer)["returncode"]
            return subprocess.CompletedProcess([module, *argv], returncode, stdout.read(), stderr.read())

    def close(self) -> None:
        self._process.stdin.close()
        self._process.wait(timeout=60)
        self._folder.cleanup()


if __name__ == "__main__":
    main()
