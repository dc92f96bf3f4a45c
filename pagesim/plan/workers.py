"""Local worker processes for the plan's searches, started as `python -m pagesim.plan.workers`.

Why not multiprocessing: its spawn and forkserver children re-run the caller's main script to
rebuild its module, so `pagesim.plan(..., jobs=2)` in a script without an
`if __name__ == "__main__":` guard starts the plan again in every child, which fails, and the
parent waited forever. These workers import only pagesim: a script needs no guard. Each worker
reads calls from its stdin and answers on its stdout (pickles, length-prefixed); the parent
gives each idle worker the next job, so results come back as they finish.

A job that raises fails the plan with that exception; a worker that dies (killed, out of
memory) fails it with WorkerDied naming the worker's exit status and the last line it wrote
on stderr. Workers end with the parent (pagesim.children): on SIGTERM/SIGHUP of the parent,
by its `finally`; on a kill -9, by the kernel (Linux).
"""

from __future__ import annotations

import os
import pickle
import queue
import signal
import struct
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

from pagesim.children import die_with_parent, ending_on_signals, stop

_HEADER = struct.Struct("!Q")
_ROOT = str(Path(__file__).resolve().parents[2])  # where `pagesim` is imported from here


class WorkerDied(RuntimeError):
    """A worker process ended without answering (killed, out of memory, a crash in C)."""


def _send(stream, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _receive(stream) -> Any:
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        raise EOFError
    size, = _HEADER.unpack(header)
    data = stream.read(size)
    if len(data) < size:
        raise EOFError
    return pickle.loads(data)


class _Worker:
    def __init__(self, setup: tuple[Callable, tuple] | None):
        self.stderr = tempfile.TemporaryFile()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([_ROOT, *filter(None, [os.environ.get("PYTHONPATH")])]))
        self.process = subprocess.Popen([sys.executable, "-m", "pagesim.plan.workers"], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=self.stderr, env=env)
        if setup is not None:
            self.call(*setup)

    def call(self, function: Callable, arg: Any) -> Any:
        try:
            _send(self.process.stdin, (function, arg))
            ok, value = _receive(self.process.stdout)
        except (EOFError, BrokenPipeError, OSError):
            raise WorkerDied(self._death()) from None
        if not ok:
            raise value
        return value

    def _death(self) -> str:
        code = self.process.wait()
        self.stderr.seek(0)
        lines = [line for line in self.stderr.read().decode(errors="replace").splitlines() if line.strip()]
        how = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
        return f"a plan worker (pid {self.process.pid}) {how}" + (f": {lines[-1].strip()}" if lines else "")

    def close(self) -> None:
        try:
            self.process.stdin.close()
        except OSError:
            pass


def run_in_workers(function: Callable, args: list, workers: int, setup: tuple[Callable, tuple] | None = None,
                   follow: Callable[[int, Any], list] | None = None) -> Iterator[tuple[int, Any]]:
    """Yields (index, function(args[index])) as each finishes, over `workers` processes; each
    worker first runs setup = (function, arg) once. follow(index, answer), called here as each
    answer comes, returns more args to run (appended to args: their indices follow on), so a
    job's later tasks keep idle workers busy. Raises the first job's exception or WorkerDied;
    every worker is stopped when this ends, however it ends."""
    args = list(args)
    todo: queue.Queue = queue.Queue()
    for item in enumerate(args):
        todo.put(item)
    done: queue.Queue = queue.Queue()
    pool: list[_Worker] = []
    stopping = threading.Event()

    def serve(worker_setup) -> None:
        worker = None
        try:
            worker = _Worker(worker_setup)
            pool.append(worker)
            while not stopping.is_set():
                try:
                    index, arg = todo.get(timeout=0.2) if follow else todo.get_nowait()
                except queue.Empty:
                    if follow:
                        continue  # an answer still to come may bring more work
                    return
                done.put((index, True, worker.call(function, arg)))
        except BaseException as e:  # noqa: BLE001 - handed to the main thread, which raises it
            done.put((None, False, e))
        finally:
            if worker is not None:
                worker.close()  # no more calls: the worker exits on the end of its input

    with ending_on_signals():
        count = workers if follow else min(workers, len(args))
        threads = [threading.Thread(target=serve, args=(setup,), daemon=True) for _ in range(max(1, count))]
        try:
            for t in threads:
                t.start()
            answered = 0
            while answered < len(args):
                while True:
                    try:
                        index, ok, value = done.get(timeout=0.2)  # wakes for signal handlers
                        break
                    except queue.Empty:
                        continue
                if not ok:
                    raise value
                answered += 1
                for arg in follow(index, value) if follow else ():
                    args.append(arg)
                    todo.put((len(args) - 1, arg))
                yield index, value
        finally:
            stopping.set()
            for worker in list(pool):
                worker.close()
            stop([w.process for w in list(pool)], grace_s=2.0)
            for t in threads:
                t.join(timeout=5)
            for worker in pool:
                worker.stderr.close()


def _main() -> None:
    """A worker: calls from stdin, answers on stdout, until stdin closes."""
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it stops us
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # a print in a job must not corrupt the answers
    while True:
        try:
            function, arg = _receive(stdin)
        except EOFError:
            return
        try:
            answer = (True, function(arg))
        except Exception as e:  # noqa: BLE001 - sent to the parent, which raises it
            answer = (False, e)
        try:
            _send(stdout, answer)
        except (pickle.PicklingError, TypeError, AttributeError) as e:
            _send(stdout, (False, RuntimeError(f"a plan worker could not send its answer back: {e}")))


if __name__ == "__main__":
    _main()
